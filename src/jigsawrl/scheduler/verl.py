"""The ``verl`` baseline: synchronous, colocated hybrid engine per pipeline (HybridFlow).

Faithful to verl as its users run it (``reference/peers.md``): on each pipeline's devices the actor,
rollout engine and reference model time-share every device; a step runs rollout → reward → old
log-prob → ref log-prob → actor update → weight sync, stage after stage, and every DP rank waits
for the slowest before training (the long-tail barrier). verl has no notion of several pipelines,
so a verl user picks one of two placements:

- ``split`` (``verl-split``): each pipeline is its own job on a disjoint share of the devices
  (``pipelines[i].num_devices`` when given, else an equal split rounded to whole TP groups);
- ``serial`` (``verl-serial``): the jobs run one after another, each on all devices.

``verl`` runs both and reports the better (the runner evaluates :meth:`VerlPolicy.variants`).
Memory follows verl's defaults: the FSDP train state and the reference weights stay resident, the
vLLM engine gets ``gpu_memory_utilization`` of device memory (weights + KV) while it runs; async
pipelines are run synchronously (verl's default trainer; its async recipes are other baselines).
Simplification: job start-up (model loading) is not charged, which favours ``verl-serial``.
"""

from __future__ import annotations

from typing import Literal

from jigsawrl.costmodel import CostModelProtocol
from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import (
    Action,
    Decision,
    PipelineView,
    PolicyBase,
    SetResident,
    StartRollout,
    StartStage,
    View,
    register_policy,
)
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.workload.experiment import DEFAULT_GPU_MEMORY_UTILIZATION

# verl's dynamic batch size default for the actor: ppo_max_token_len_per_gpu = 16384.
MICRO_BATCH_TOKENS = 16384


def pipeline_resident_bytes(cost: CostModelProtocol, pv: PipelineView, n_devices: int) -> float:
    """Persistent per-device state of a colocated pipeline: FSDP train state + reference weights."""
    ref = pv.model.weight_bytes() / n_devices if pv.spec.use_ref else 0.0
    return cost.train_state_bytes(pv.model, n_devices) + ref


def split_devices(view: View) -> dict[str, tuple[int, ...]]:
    """verl-split placement: contiguous disjoint device ranges per pipeline.

    Raises:
        ConfigError: more pipelines than devices, or explicit sizes that do not fit.
    """
    n = len(view.devices)
    pipes = view.pipelines
    fixed = sum(p.spec.num_devices or 0 for p in pipes)
    free = [p for p in pipes if not p.spec.num_devices]
    if fixed + len(free) > n:
        raise ConfigError(f"{len(pipes)} pipelines need more than the {n} devices for verl-split",
                          where="pipelines", fix="set pipelines[i].num_devices or use verl-serial")
    each = (n - fixed) // len(free) if free else 0
    out: dict[str, tuple[int, ...]] = {}
    start = 0
    for p in pipes:
        size = p.spec.num_devices or each
        size -= size % max(p.spec.rollout_tp, p.spec.train_tp)
        if size < 1:
            raise ConfigError(f"pipeline {p.name!r} gets no whole TP group under verl-split",
                              where=f"pipelines.{p.index}.rollout_tp")
        out[p.name] = tuple(range(start, start + size))
        _check_fit(view, p, size)
        start += size
    return out


def _check_fit(view: View, pv: PipelineView, n: int) -> None:
    """A colocated pipeline must hold its train state, reference and activations on ``n`` devices.

    Raises:
        ConfigError: naming the pipeline and what to change.
    """
    need = pipeline_resident_bytes(view.cost, pv, n) + view.cost.activation_bytes(
        pv.model, MICRO_BATCH_TOKENS, n)
    have = view.accelerator.hbm_bytes
    if need > have:
        raise ConfigError(
            f"pipeline {pv.name!r} ({pv.spec.model}) needs {need / 1e9:.0f} GB per device to "
            f"train colocated on {n} device(s), {view.accelerator.name} has {have / 1e9:.0f} GB",
            where=f"pipelines.{pv.index}.num_devices",
            fix="give it more devices (num_devices) or use verl-serial")


@register_policy("verl-split")
class VerlPolicy(PolicyBase):
    """See the module docstring."""

    def __init__(self, placement: Literal["split", "serial", "auto"] = "split",
                 gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> None:
        if placement not in ("split", "serial", "auto"):
            raise ConfigError(f"placement must be split, serial or auto, not {placement!r}",
                              where="scheduler.params.placement")
        self.placement = placement
        self.gpu_memory_utilization = gpu_memory_utilization
        self.name = {"split": "verl-split", "serial": "verl-serial", "auto": "verl"}[placement]
        self._devices: dict[str, tuple[int, ...]] | None = None
        self._placed: set[str] = set()

    def variants(self) -> list[VerlPolicy]:
        """For ``verl`` (auto): the placements to run; the runner reports the better."""
        if self.placement != "auto":
            return [self]
        return [VerlPolicy(p, self.gpu_memory_utilization) for p in ("split", "serial")]

    def decide(self, view: View) -> Decision:
        if self.placement == "auto":
            raise ConfigError("verl (auto) picks between placements; run it through the runner",
                              where="scheduler.name", fix="use verl-split or verl-serial here")
        if self._devices is None:
            self._devices = self._place(view)
        actions: list[Action] = []
        for pv in view.pipelines:  # a finished job frees its devices
            if pv.finished and pv.name in self._placed:
                self._placed.discard(pv.name)
                actions.append(SetResident(pv.name, self._devices[pv.name], 0.0))
        for pv in self._active(view):
            devs = self._devices[pv.name]
            if pv.name not in self._placed:
                self._placed.add(pv.name)
                actions.append(SetResident(pv.name, devs, self._resident(view, pv, devs)))
            if pv.running:
                continue
            for step, stage in pv.ready(force_sync=True):
                actions.append(self._start(view, pv, step, stage, devs))
        return Decision(tuple(actions))

    def _place(self, view: View) -> dict[str, tuple[int, ...]]:
        if self.placement == "split":
            return split_devices(view)
        everything = tuple(d.index for d in view.devices)
        for p in view.pipelines:
            _check_fit(view, p, len(everything))
        return {p.name: everything for p in view.pipelines}

    def _active(self, view: View) -> list[PipelineView]:
        live = [p for p in view.pipelines if not p.finished]
        return live[:1] if self.placement == "serial" else live

    def _resident(self, view: View, pv: PipelineView, devs: tuple[int, ...]) -> float:
        return pipeline_resident_bytes(view.cost, pv, len(devs))

    def _start(self, view: View, pv: PipelineView, step: int, stage: str,
               devs: tuple[int, ...]) -> StartRollout | StartStage:
        cost = view.cost
        if stage == Stage.ROLLOUT:
            hbm = view.accelerator.hbm_bytes
            resident = self._resident(view, pv, devs)
            weights = cost.rollout_weight_bytes(pv.model, pv.spec.rollout_tp)
            engine = min(self.gpu_memory_utilization * hbm, hbm - resident)
            return StartRollout(pv.name, step, devs, pv.spec.rollout_tp,
                                kv_mem_bytes=max(0.0, engine - weights))
        if stage == Stage.REWARD:  # rule-based reward runs on the controller's CPU; devices idle
            return StartStage(pv.name, step, stage, (), share=0.0)
        mem = 0.0
        if stage in MODEL_PASSES:
            mem = cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, len(devs))
        return StartStage(pv.name, step, stage, devs, mem_bytes=mem)


@register_policy("verl-serial")
def _verl_serial(**params) -> VerlPolicy:  # noqa: ANN003
    return VerlPolicy(placement="serial", **params)


@register_policy("verl")
def _verl_auto(**params) -> VerlPolicy:  # noqa: ANN003
    return VerlPolicy(placement="auto", **params)
