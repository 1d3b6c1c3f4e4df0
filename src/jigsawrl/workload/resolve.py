"""From a validated config to a resolved experiment: presets looked up, feasibility checked.

Schema errors are caught in ``config.py``; here we catch what needs the presets: unknown
accelerator / model / task names, TP larger than a node, a model that cannot fit, a pipeline that
asks for more devices than the cluster has. Each error names the key and the fix.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from jigsawrl.config import ExperimentConfig, PipelineSpec
from jigsawrl.errors import ConfigError
from jigsawrl.workload.accelerators import ACCELERATORS, AcceleratorSpec
from jigsawrl.workload.models import MODELS, ModelSpec
from jigsawrl.workload.tasks import TASKS, RequestSampler, TaskSpec, load_length_trace

# vLLM reserves this fraction of device memory for weights + KV cache by default in verl's
# example configs (actor_rollout_ref.rollout.gpu_memory_utilization: 0.5–0.6); we use 0.6.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.6


@dataclass(frozen=True, slots=True)
class ResolvedPipeline:
    index: int
    spec: PipelineSpec
    model: ModelSpec
    task: TaskSpec
    sampler: RequestSampler


@dataclass(frozen=True, slots=True)
class Experiment:
    config: ExperimentConfig
    accelerator: AcceleratorSpec
    pipelines: tuple[ResolvedPipeline, ...]

    @property
    def num_devices(self) -> int:
        return self.config.cluster.num_devices

    @property
    def price_per_hour(self) -> float:
        p = self.config.cluster.price_per_hour
        return self.accelerator.price_per_hour_usd if p is None else p

    def pipeline(self, name: str) -> ResolvedPipeline:
        for p in self.pipelines:
            if p.spec.name == name:
                return p
        raise KeyError(name)

    def node_of(self, device: int) -> int:
        return device // self.config.cluster.accelerators_per_node


def _lookup(table: dict, name: str, where: str, what: str):  # noqa: ANN202
    if name in table:
        return table[name]
    close = difflib.get_close_matches(name, list(table), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(f"unknown {what} {name!r}", where=where,
                      fix=f"{hint}known: {', '.join(sorted(table))} "
                      f"(see `jigsawrl list {what}s`)")


def resolve(cfg: ExperimentConfig, cost_factory=None) -> Experiment:  # noqa: ANN001
    """Look up presets and check feasibility.

    Args:
        cfg: a schema-valid config.
        cost_factory: ``accel -> CostModel`` used for memory checks (default: the roofline model).

    Raises:
        ConfigError: naming the key and the fix.
    """
    accel = _lookup(ACCELERATORS, cfg.cluster.accelerator, "cluster.accelerator", "accelerator")
    if cost_factory is None:
        from jigsawrl.costmodel import CostModel

        cost_factory = CostModel
    cost = cost_factory(accel)
    pipes = tuple(_resolve_pipeline(cfg, i, p, accel, cost) for i, p in enumerate(cfg.pipelines))
    return Experiment(cfg, accel, pipes)


def _resolve_pipeline(cfg: ExperimentConfig, i: int, p: PipelineSpec, accel: AcceleratorSpec,
                      cost) -> ResolvedPipeline:  # noqa: ANN001
    where = f"pipelines.{i}"
    model = _lookup(MODELS, p.model, f"{where}.model", "model")
    task = _lookup(TASKS, p.task, f"{where}.task", "task")
    per_node = cfg.cluster.accelerators_per_node
    for key in ("rollout_tp", "train_tp"):
        tp = getattr(p, key)
        if tp > per_node:
            raise ConfigError(f"{key}={tp} is larger than a node ({per_node} accelerators)",
                              where=f"{where}.{key}",
                              fix=f"use {key} <= {per_node} (tensor parallelism stays in a node)")
    n = p.num_devices or cfg.cluster.num_devices
    if n > cfg.cluster.num_devices:
        raise ConfigError(f"num_devices={n} but the cluster has {cfg.cluster.num_devices}",
                          where=f"{where}.num_devices", fix="lower it or grow the cluster")
    if n % p.rollout_tp:
        raise ConfigError(f"num_devices={n} is not a multiple of rollout_tp={p.rollout_tp}",
                          where=f"{where}.num_devices")
    _check_memory(where, p, model, accel, cost, n)
    trace = load_length_trace(p.length_trace) if p.length_trace else None
    sampler = RequestSampler(task, group_size=p.group_size,
                             max_response_tokens=p.max_response_tokens,
                             drift_per_step=p.length_drift_per_step, trace=trace)
    return ResolvedPipeline(i, p, model, task, sampler)


def _check_memory(where: str, p: PipelineSpec, model: ModelSpec, accel: AcceleratorSpec,
                  cost, n: int) -> None:  # noqa: ANN001
    ok, why = cost.fits_training(model, n)
    if not ok:
        raise ConfigError(f"{p.model} cannot train on {n} x {accel.name}: {why}",
                          where=f"{where}.model",
                          fix="use more devices (cluster size or num_devices) or a smaller model")
    weights = cost.rollout_weight_bytes(model, p.rollout_tp)
    budget = DEFAULT_GPU_MEMORY_UTILIZATION * accel.hbm_bytes - weights
    need = cost.kv_bytes(model, p.max_response_tokens + 512, p.rollout_tp)
    if budget < need:
        raise ConfigError(
            f"{p.model} with rollout_tp={p.rollout_tp} leaves {budget / 1e9:.1f} GB for the KV "
            f"cache per device, less than one {p.max_response_tokens}-token response needs "
            f"({need / 1e9:.2f} GB)", where=f"{where}.rollout_tp",
            fix="raise rollout_tp or lower max_response_tokens")


def kv_mem_bytes(exp: Experiment, pipe: ResolvedPipeline, resident_bytes: float,
                 gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                 cost=None) -> float:  # noqa: ANN001
    """Per-device KV-cache bytes a rollout engine gets next to ``resident_bytes`` of other state."""
    hbm = exp.accelerator.hbm_bytes
    weights = cost.rollout_weight_bytes(pipe.model, pipe.spec.rollout_tp)
    engine = min(gpu_memory_utilization * hbm, hbm - resident_bytes)
    return max(0.0, engine - weights)
