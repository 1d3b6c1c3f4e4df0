"""From a validated config to a resolved :class:`~jigsawrl.workload.experiment.Experiment`:
presets looked up, feasibility checked — for simulated runs (:func:`resolve`) and real runs on
Ray (:func:`resolve_real`).

Schema errors are caught in ``config.py``; here we catch what needs the presets: unknown
accelerator / model / task names, TP larger than a node, a model that cannot fit, a pipeline that
asks for more devices than the cluster has. Each error names the key and the fix.
"""

from __future__ import annotations

import difflib

from jigsawrl.config import ExperimentConfig, PipelineSpec
from jigsawrl.errors import ConfigError
from jigsawrl.workload.accelerators import ACCELERATORS, AcceleratorSpec
from jigsawrl.workload.experiment import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    Experiment,
    ResolvedPipeline,
)
from jigsawrl.workload.models import MODELS, ModelSpec
from jigsawrl.workload.realpresets import REAL_ACCELERATORS, engine_model_spec
from jigsawrl.workload.task_presets import TASKS, RequestSampler, TaskSpec, load_length_trace


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
    n = _num_devices(cfg, i, p)
    if n % p.rollout_tp:
        raise ConfigError(f"num_devices={n} is not a multiple of rollout_tp={p.rollout_tp}",
                          where=f"{where}.num_devices")
    _check_memory(where, p, model, accel, cost, n)
    trace = load_length_trace(p.length_trace) if p.length_trace else None
    sampler = RequestSampler(task, group_size=p.group_size,
                             max_response_tokens=p.max_response_tokens,
                             drift_per_step=p.length_drift_per_step, trace=trace)
    return ResolvedPipeline(i, p, model, task, sampler)


def _num_devices(cfg: ExperimentConfig, i: int, p: PipelineSpec) -> int:
    """The devices pipeline ``i`` may use (its ``num_devices``, else the whole cluster)."""
    n = p.num_devices or cfg.cluster.num_devices
    if n > cfg.cluster.num_devices:
        raise ConfigError(f"num_devices={n} but the cluster has {cfg.cluster.num_devices}",
                          where=f"pipelines.{i}.num_devices", fix="lower it or grow the cluster")
    return n


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


# ---------------------------------------------------------------- real runs (Ray, CPU presets)
def stub_task(p: PipelineSpec) -> TaskSpec:
    """A neutral TaskSpec for a real task (never sampled; see the module docstring)."""
    return TaskSpec(name=p.task, prompt_mean=32, prompt_std=0, response_median=max(
        1, p.max_response_tokens // 4), response_sigma=0.0, prompt_difficulty_sigma=0.0,
        description="stub of a real task: lengths are observed from the engine")


def resolve_real(cfg: ExperimentConfig) -> Experiment:
    """Resolve a real-run config against the CPU presets.

    Raises:
        ConfigError: an accelerator that is not a CPU preset, an unknown engine model or task,
            tensor parallelism (the CPU engine has none), or more devices than the cluster has.
    """
    from jigsawrl.tasks import get_task, list_tasks

    accel = REAL_ACCELERATORS.get(cfg.cluster.accelerator)
    if accel is None:
        raise ConfigError(f"{cfg.cluster.accelerator!r} is not a real-run accelerator",
                          where="cluster.accelerator",
                          fix=f"use one of {sorted(REAL_ACCELERATORS)} for real runs")
    pipes = []
    for i, p in enumerate(cfg.pipelines):
        where = f"pipelines.{i}"
        if p.task not in list_tasks():
            raise ConfigError(f"unknown real task {p.task!r}", where=f"{where}.task",
                              fix=f"use one of {list_tasks()}")
        try:  # bad task parameters fail here, not in a worker after Ray has started
            get_task(p.task, **p.rollout.task_params)
        except ConfigError as exc:
            raise ConfigError(str(exc), where=f"{where}.rollout.task_params") from None
        if p.rollout_tp != 1 or p.train_tp != 1:
            raise ConfigError("the CPU engine has no tensor parallelism", where=where,
                              fix="set rollout_tp: 1 and train_tp: 1")
        _num_devices(cfg, i, p)
        task = stub_task(p)
        sampler = RequestSampler(task, group_size=p.group_size,
                                 max_response_tokens=p.max_response_tokens)
        pipes.append(ResolvedPipeline(i, p, engine_model_spec(p.model), task, sampler))
    return Experiment(cfg, accel, tuple(pipes))
