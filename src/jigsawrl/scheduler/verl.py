"""The ``verl`` baseline: synchronous, colocated hybrid engine per pipeline (HybridFlow).

Faithful to verl as its users run it (``reference/peers.md``): on each pipeline's devices the actor,
rollout engine and reference model time-share every device; a step runs rollout → reward → old
log-prob → ref log-prob → actor update → weight sync, stage after stage, and every DP rank waits
for the slowest before training (the long-tail barrier). verl has no notion of several pipelines,
so a verl user picks a placement of the jobs:

- ``split`` (``verl-split``): each pipeline is its own job on a disjoint share of the devices
  (``pipelines[i].num_devices`` when given, else an equal split rounded to whole TP groups);
- ``serial`` (``verl-serial``): the jobs run one after another, each on all devices;
- ``sized`` (``verl-sized``): each job on a disjoint slice sized to its predicted work (from the
  task presets' length priors, never sampled lengths; ``num_devices`` is not read: that sizing
  is ``verl-split``'s) — see ``scheduler/verl_placements.py``;
- ``queue`` (``verl-queue`` with ``k``; named ``verl-queue-{k}``): ``k`` jobs at a time on ``k``
  equal disjoint slices, the next job (longest predicted first) taking a slice when one finishes.

``verl`` runs every placement and reports the best measured (the runner evaluates
:meth:`VerlPolicy.variants`; DESIGN.md §6); ``verl-queue`` without ``k`` does the same over k.
``verl`` also runs each placement at the configured rollout TPs scaled by ×2, ×4 and ×½
(``scheduler/rollout_tp.py``; named e.g. ``verl-sized@tp2``), as a user tuning
``rollout.tensor_model_parallel_size`` would, where the executor can form those TP groups.
Memory follows verl's defaults: the FSDP train state and the reference weights stay resident, the
vLLM engine gets ``gpu_memory_utilization`` of device memory (weights + KV) while it runs. These
placements run async pipelines synchronously (verl's default trainer; a user may run them so);
for a group with async pipelines ``verl`` also runs verl's async recipes, one-step-off and
fully-async, each over its rollout/train splits (``scheduler/verl_async.py``), so that an async
pipeline is compared like for like.
Simplification: job start-up (model loading) is not charged, which favours ``verl-serial`` and
``verl-queue`` (each queued job would load its models when it takes a slice).
"""

from __future__ import annotations

from typing import Literal

from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import (
    Action,
    Decision,
    PipelineView,
    Policy,
    PolicyBase,
    SetResident,
    StartRollout,
    StartStage,
    View,
    register_policy,
)
from jigsawrl.scheduler.rollout_tp import RolloutTP, with_scaled_tps
from jigsawrl.scheduler.verl_async import async_recipes
from jigsawrl.scheduler.verl_placements import (
    MAX_QUEUE_K,
    MICRO_BATCH_TOKENS,
    JobTimer,
    check_fit,
    engine_kv_bytes,
    longest_first,
    pipeline_resident_bytes,
    queue_slices,
    queue_widths,
    sized_split,
    usable,
)
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.workload.experiment import DEFAULT_GPU_MEMORY_UTILIZATION

__all__ = ["MICRO_BATCH_TOKENS", "VerlPolicy", "check_fit", "pipeline_resident_bytes",
           "split_devices"]

Placement = Literal["split", "serial", "sized", "queue", "auto"]
NAMES = {"split": "verl-split", "serial": "verl-serial", "sized": "verl-sized",
         "queue": "verl-queue", "auto": "verl"}


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
        check_fit(view, p, size)
        start += size
    return out


@register_policy("verl-split")
class VerlPolicy(PolicyBase):
    """See the module docstring.

    Args:
        placement: how the jobs are placed (module docstring); ``auto`` runs them all.
        gpu_memory_utilization: the vLLM engine's share of device memory.
        k: jobs at a time, ``queue`` only (None: every k, as variants).
    """

    def __init__(self, placement: Placement = "split",
                 gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                 k: int | None = None) -> None:
        if placement not in NAMES:
            raise ConfigError(f"placement must be one of {', '.join(NAMES)}, not {placement!r}",
                              where="scheduler.params.placement")
        if k is not None and (placement != "queue" or not isinstance(k, int) or k < 1):
            raise ConfigError(f"k={k!r}: a positive whole number of jobs at a time, for "
                              "verl-queue only", where="scheduler.params.k")
        self.placement = placement
        self.gpu_memory_utilization = gpu_memory_utilization
        self.k = k
        self.name = f"verl-queue-{k}" if k is not None else NAMES[placement]
        self._devices: dict[str, tuple[int, ...]] | None = None
        self._placed: set[str] = set()
        self._slices: list[tuple[int, ...]] = []  # queue: the slices, and who holds each
        self._holder: dict[int, str] = {}
        self._order: list[str] = []  # queue: the jobs not yet started, in queue order

    def variants(self) -> list[Policy]:
        """The placements to run, the runner reporting the best: for ``verl`` (auto) split,
        serial, sized, the queues of 2 .. :data:`MAX_QUEUE_K` jobs at a time (split and
        serial first, so that a tie names today's placements) and verl's async recipes
        (``verl_async.async_recipes``); for ``verl-queue`` without ``k`` the queues. A queue
        that duplicates split or serial, or whose slices cannot hold a pipeline, and an async
        recipe on a group with no async pipeline, fail fast at the first decision and the
        runner skips them."""
        gmu = self.gpu_memory_utilization
        queues: list[Policy] = [VerlPolicy("queue", gmu, k) for k in range(2, MAX_QUEUE_K + 1)]
        if self.placement == "auto":
            def placed() -> list[Policy]:
                return [*(VerlPolicy(p, gmu) for p in ("split", "serial", "sized")),
                        *(VerlPolicy("queue", gmu, k) for k in range(2, MAX_QUEUE_K + 1))]
            # each also at scaled rollout TPs (a user tunes verl's rollout TP; a scale that
            # changes nothing, or an executor of fixed TP, fails fast and is skipped), the
            # async recipes likewise
            return [*with_scaled_tps(placed), *async_recipes()]
        if self.placement == "queue" and self.k is None:
            return queues
        return [self]

    def variants_for(self, view: View) -> list[Policy]:
        """:meth:`variants` knowing the pool (the first view): only the queues whose width
        :func:`~jigsawrl.scheduler.verl_placements.queue_widths` keeps, and the async recipes
        only for a group with an async pipeline, so that no duplicate or infeasible variant is
        run (for a runner that can build a view before running)."""
        keep = set(queue_widths(view))
        has_async = any(p.spec.mode == "async" for p in view.pipelines)
        def kept(v: Policy) -> bool:
            if isinstance(v, RolloutTP):
                return view.can_regroup and kept(v.inner)
            return (v.k is None or v.k in keep or v is self if isinstance(v, VerlPolicy)
                    else has_async)
        return [v for v in self.variants() if kept(v)]

    def decide(self, view: View) -> Decision:
        if self.placement == "auto" or (self.placement == "queue" and self.k is None):
            raise ConfigError(f"{self.name} picks between placements; run it through the runner",
                              where="scheduler.name",
                              fix="use verl-split, verl-serial, verl-sized or verl-queue with k")
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
        if self.placement == "sized":
            return sized_split(view, JobTimer(view, self.gpu_memory_utilization))
        if self.placement == "queue":
            assert self.k is not None
            self._slices = queue_slices(view, self.k)
            timer = JobTimer(view, self.gpu_memory_utilization)
            self._order = longest_first(view, timer, len(self._slices[0]))
            return {}  # devices are given as slices free up (_active)
        everything = tuple(d.index for d in view.devices)
        for p in view.pipelines:
            check_fit(view, p, len(everything))
        return {p.name: everything for p in view.pipelines}

    def _active(self, view: View) -> list[PipelineView]:
        live = [p for p in view.pipelines if not p.finished]
        if self.placement == "serial":
            return live[:1]
        if self.placement == "queue":
            return self._queue_active(view)
        return live

    def _queue_active(self, view: View) -> list[PipelineView]:
        """The queue's running jobs: a finished job's slice goes to the next job in order."""
        assert self._devices is not None
        by_name = {p.name: p for p in view.pipelines}
        for i, slice_devs in enumerate(self._slices):
            holder = self._holder.get(i)
            if holder is not None and not by_name[holder].finished:
                continue
            self._holder.pop(i, None)
            while self._order:
                nxt = by_name[self._order.pop(0)]
                if nxt.finished:
                    continue
                self._holder[i] = nxt.name
                self._devices[nxt.name] = slice_devs[:usable(nxt, len(slice_devs))]
                break
        return [by_name[name] for _, name in sorted(self._holder.items())]

    def _resident(self, view: View, pv: PipelineView, devs: tuple[int, ...]) -> float:
        return pipeline_resident_bytes(view.cost, pv, len(devs))

    def kv_mem_bytes(self, view: View, pv: PipelineView, devs: tuple[int, ...]) -> float:
        """Per-device KV memory of ``pv``'s rollout engine on ``devs``: the engine's
        ``gpu_memory_utilization`` of the device (less what stays resident), less its weights."""
        return engine_kv_bytes(view, pv, len(devs), self.gpu_memory_utilization)

    def _start(self, view: View, pv: PipelineView, step: int, stage: str,
               devs: tuple[int, ...]) -> StartRollout | StartStage:
        cost = view.cost
        if stage == Stage.ROLLOUT:
            if not devs or len(devs) % pv.spec.rollout_tp:
                raise ConfigError(
                    f"pipeline {pv.name!r}'s {len(devs)} device(s) cannot host its rollout at "
                    f"TP {pv.spec.rollout_tp}", where=f"pipelines.{pv.index}.rollout_tp",
                    fix="give it whole TP groups (num_devices) or another placement")
            return StartRollout(pv.name, step, devs, pv.spec.rollout_tp,
                                kv_mem_bytes=self.kv_mem_bytes(view, pv, devs))
        if stage == Stage.REWARD:  # rule-based reward runs on the controller's CPU; devices idle
            return StartStage(pv.name, step, stage, (), share=0.0)
        mem = 0.0
        if stage in MODEL_PASSES:
            mem = cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, len(devs))
        return StartStage(pv.name, step, stage, devs, mem_bytes=mem)


@register_policy("verl-serial")
def _verl_serial(**params) -> VerlPolicy:  # noqa: ANN003
    return VerlPolicy(placement="serial", **params)


@register_policy("verl-sized")
def _verl_sized(**params) -> VerlPolicy:  # noqa: ANN003
    return VerlPolicy(placement="sized", **params)


@register_policy("verl-queue")
def _verl_queue(**params) -> VerlPolicy:  # noqa: ANN003
    return VerlPolicy(placement="queue", **params)


@register_policy("verl")
def _verl_auto(**params) -> VerlPolicy:  # noqa: ANN003
    return VerlPolicy(placement="auto", **params)
