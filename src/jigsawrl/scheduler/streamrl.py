"""The ``streamrl`` baseline: a disaggregated rollout service and trainer (StreamRL).

StreamRL (``reference/peers.md``) splits the devices into a *rollout pool* running the inference
engine and a *training pool* running the trainer; weights go from the trainer to the rollout pool
after every update. What is modelled here, and how:

- **Pools.** Rollout and training never share a device. Two placements of several pipelines:

  - ``split``: each pipeline is its own StreamRL deployment on a disjoint set of devices, cut into
    its own rollout and training sub-pools. This is StreamRL as published (one job per
    deployment).
  - ``shared``: one rollout pool and one training pool serve every pipeline, which take turns on
    each pool (a rollout of one pipeline at a time on the rollout pool, one training stage at a
    time on the training pool, oldest finished rollout first; all train states stay resident).
    StreamRL describes no multi-job mode; this reading is offered because it can be stronger.

- **Split balanced by profiling.** StreamRL's profiler balances the rollout/training split. Here
  the runner simulates the first candidate allocations of each placement
  (:meth:`DisaggregatedPolicy.variants`) and reports the best, which is at least as good as a
  profiler's pick among them. ``split`` candidates (:func:`split_plans`): each trainer on the
  fewest devices that hold its state (or on half of the pipeline's equal share), rollout devices
  near an equal split of the rest and moved between pipelines by up to two TP groups, so a
  pipeline with longer responses can get more rollout devices; ``num_devices`` pins a pipeline's
  total. ``shared`` candidates (:func:`shared_plans`): the leanest training pools first.
- **One-step async overlap.** An async pipeline's rollout of step k+1 runs on the rollout pool
  while step k trains, within the pipeline's ``max_staleness`` (``PipelineView.ready``); the
  rollout service generates one batch (one weight version) at a time per pipeline, as one-step
  semi-async systems do (several versions in flight is AReaL's contribution, see
  :mod:`jigsawrl.scheduler.areal`). Sync pipelines run disaggregated and
  synchronously.
- **Streaming within a step** (dynamic-batch pipelining): each rollout streams its finished GRPO
  groups into its training pool, which computes their old/ref log-probs and the actor's
  forward-backward while the rollout's tail still runs (``StartRollout.stream_devices``;
  modelled by :mod:`jigsawrl.sim.stream`, which yields to any stage run on that pool), so that
  after the last sample only the rest and the optimizer step remain.
- **Skew-aware dispatch.** Rollouts use ``dispatch="skew_aware"`` with a length ranker fitted on
  the pipeline's history and evaluated on prompt lengths (:mod:`jigsawrl.scheduler.ranker`); it
  never sees a sampled length, so on preset workloads (prompt length independent of response
  length) it balances by count.
- **Weight sync** runs on the training pool (gather + send); the engine-side load is a few
  milliseconds and is not charged to the rollout pool. StreamRL overlaps the transfer with the
  next training step; the step graph runs it before (about 0.5 s a step, a known gap).
  The rule-based reward runs on the controller's CPU, as under ``verl``.
- **Memory.** The training pool holds each pipeline's FSDP train state and reference weights; the
  rollout engine takes ``gpu_memory_utilization`` of a rollout device (vLLM's default 0.9: the
  device is dedicated to inference). Infeasible placements raise :class:`ConfigError`.

:class:`DisaggregatedPolicy` is also the base of the ``areal`` baseline.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import (
    Action,
    Decision,
    PipelineView,
    PolicyBase,
    SetResident,
    SetShare,
    StartRollout,
    StartStage,
    View,
    register_policy,
)
from jigsawrl.scheduler.ranker import LengthRanker
from jigsawrl.scheduler.rollout_tp import with_scaled_tps
from jigsawrl.scheduler.verl_placements import (
    MICRO_BATCH_TOKENS,
    pipeline_resident_bytes,
)
from jigsawrl.stages import MODEL_PASSES, Stage

# vLLM's default gpu_memory_utilization: what a user sets on a device dedicated to inference.
ROLLOUT_MEM_FRACTION = 0.9
# Candidate allocations simulated per placement (the runner keeps the best; see variants()).
MAX_ALLOCATIONS: dict[str, int] = {"split": 6, "shared": 3}
Placement = Literal["split", "shared", "auto"]
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Pools:
    """A pipeline's rollout devices and training devices (disjoint)."""

    rollout: tuple[int, ...]
    train: tuple[int, ...]


def _train_need_bytes(view: View, pvs: list[PipelineView], n: int) -> float:
    """Per device: the train states of ``pvs`` (all resident) plus one micro-batch's activations."""
    resident = sum(pipeline_resident_bytes(view.cost, p, n) for p in pvs)
    return resident + max(view.cost.activation_bytes(p.model, MICRO_BATCH_TOKENS, n) for p in pvs)


def min_train_devices(view: View, pvs: list[PipelineView], most: int) -> int:
    """The smallest training pool (at most ``most`` devices) that holds ``pvs``.

    Raises:
        ConfigError: with the bytes needed and what to change, when none does.
    """
    for n in range(1, most + 1):
        if _train_need_bytes(view, pvs, n) <= view.accelerator.hbm_bytes:
            return n
    names = ", ".join(p.name for p in pvs)
    need = f"{_train_need_bytes(view, pvs, most) / 1e9:.0f} GB per device" if most > 0 else "room"
    raise ConfigError(
        f"training {names} on the {max(most, 0)} device(s) left beside the rollout engines "
        f"needs {need}; {view.accelerator.name} has {view.accelerator.hbm_bytes / 1e9:.0f} GB",
        where="cluster", fix="add devices, give the pipeline more num_devices, or use a smaller "
        "model (a disaggregated trainer cannot borrow the rollout devices' memory)")


def _rollout_counts(tps: list[int], targets: list[int], room: int) -> list[tuple[int, ...]]:
    """Rollout device counts per pipeline: whole TP groups, near ``targets``, using ``room``."""
    span = 2 if len(tps) <= 3 else (1 if len(tps) <= 8 else 0)
    ranges = [[r for r in range(max(tp, t - span * tp), t + span * tp + 1) if r % tp == 0]
              for tp, t in zip(tps, targets, strict=True)]
    least = min(tps) if tps else room + 1
    return [c for c in itertools.product(*ranges) if room - least < sum(c) <= room]


def split_plans(view: View) -> list[dict[str, Pools]]:
    """Per-pipeline sub-pools, the likeliest first: lean trainers (the fewest devices that hold
    the train state) or half of each pipeline's equal share, and rollout devices near an equal
    split of the rest (pipelines with ``num_devices`` keep their size).

    Raises:
        ConfigError: when a pipeline gets no room for a rollout engine and a trainer.
    """
    pipes = list(view.pipelines)
    fixed = {p.name: p.spec.num_devices for p in pipes if p.spec.num_devices}
    n_free = len(view.devices) - sum(fixed.values())
    free = [p for p in pipes if p.name not in fixed]
    if n_free < 0:
        raise ConfigError(f"pipelines ask for {sum(fixed.values())} devices, the cluster has "
                          f"{len(view.devices)}", where="pipelines.num_devices",
                          fix="lower num_devices or add devices")
    budget = {p.name: fixed.get(p.name, n_free // max(1, len(free))) for p in pipes}
    for p in pipes:
        if budget[p.name] < p.spec.rollout_tp + 1:
            raise ConfigError(f"pipeline {p.name!r} gets {budget[p.name]} device(s); a "
                              f"disaggregated deployment needs a rollout TP group and a trainer",
                              where=f"pipelines.{p.index}.num_devices",
                              fix="add devices, set num_devices, or use the shared placement")
    lean = {p.name: min_train_devices(view, [p], budget[p.name] - p.spec.rollout_tp)
            for p in pipes}
    cands: dict[tuple, tuple[int, int]] = {}
    for opt, train in enumerate((lean, {k: max(v, budget[k] // 2) for k, v in lean.items()})):
        room = n_free - sum(train[p.name] for p in free)
        targets = [budget[p.name] - train[p.name] for p in free]
        for counts in _rollout_counts([p.spec.rollout_tp for p in free], targets, room):
            roll = dict(zip((p.name for p in free), counts, strict=True))
            roll.update({k: v - train[k] for k, v in fixed.items()})
            key = tuple((roll[p.name], train[p.name]) for p in pipes)
            dist = sum(abs(c - t) for c, t in zip(counts, targets, strict=True))
            cands.setdefault(key, (dist, opt))
    return [_lay_out(pipes, key) for key in sorted(cands, key=lambda k: (*cands[k], k))]


def _lay_out(pipes: list[PipelineView], sizes: tuple[tuple[int, int], ...]) -> dict[str, Pools]:
    """Contiguous devices: each pipeline's rollout pool, then its training pool."""
    out: dict[str, Pools] = {}
    start = 0
    for p, (r, t) in zip(pipes, sizes, strict=True):
        out[p.name] = Pools(tuple(range(start, start + r)), tuple(range(start + r, start + r + t)))
        start += r + t
    return out


def shared_plans(view: View) -> list[dict[str, Pools]]:
    """One rollout pool and one training pool for all, the leanest training pool first.

    Raises:
        ConfigError: when the train states of all pipelines fit on no training pool.
    """
    n = len(view.devices)
    tp = math.lcm(*(p.spec.rollout_tp for p in view.pipelines))
    t_min = min_train_devices(view, list(view.pipelines), n - tp)
    devs = tuple(range(n))
    return [{p.name: Pools(devs[:n - t], devs[n - t:]) for p in view.pipelines}
            for t in range(t_min, n - tp + 1) if (n - t) % tp == 0]


class DisaggregatedPolicy(PolicyBase):
    """Rollout pool + training pool per pipeline (see the module docstring).

    Subclasses set :attr:`family` and :attr:`dispatch`, and may override
    :meth:`rollout_slots` (concurrent rollouts of one pipeline) and :meth:`pre_actions`.
    """

    family = "streamrl"
    dispatch = "skew_aware"
    placements: tuple[str, ...] = ("split", "shared")  # what ``auto`` searches

    def __init__(self, placement: Placement = "auto", allocation: int | None = None,
                 gpu_memory_utilization: float = ROLLOUT_MEM_FRACTION) -> None:
        if placement not in ("split", "shared", "auto"):
            raise ConfigError(f"placement must be split, shared or auto, not {placement!r}",
                              where="scheduler.params.placement")
        if allocation is not None and allocation < 0:
            raise ConfigError(f"allocation must be >= 0, not {allocation}",
                              where="scheduler.params.allocation")
        self.placement = placement
        self.allocation = allocation
        self.gpu_memory_utilization = gpu_memory_utilization
        self.name = self.family
        if placement != "auto" and allocation is not None:
            self.name = f"{self.family}-{placement}#{allocation}"  # renamed once planned
        self._pools: dict[str, Pools] | None = None
        self._placed: set[str] = set()
        self._rollout_done_s: dict[tuple[str, int], float] = {}
        self._started: dict[str, int] = defaultdict(int)

    def variants(self) -> list[DisaggregatedPolicy]:
        """The first candidate allocations of each placement, each also at scaled rollout TPs
        (``rollout_tp.with_scaled_tps``); the runner simulates each and reports the best (an
        index past the candidates of a pool fails fast as infeasible)."""
        if self.placement != "auto" and self.allocation is not None:
            return [self]
        places = self.placements if self.placement == "auto" else (self.placement,)
        return with_scaled_tps(lambda: [  # type: ignore[return-value]
            type(self)(p, k, self.gpu_memory_utilization) for p in places
            for k in ((self.allocation,) if self.allocation is not None
                      else range(MAX_ALLOCATIONS[p]))])

    def _plan(self, view: View) -> dict[str, Pools]:
        """This variant's allocation, and a name that says it.

        Raises:
            ConfigError: infeasible pools, or fewer candidate allocations than the index.
        """
        plans = split_plans(view) if self.placement == "split" else shared_plans(view)
        k = self.allocation or 0
        if k >= len(plans):
            raise ConfigError(f"{self.placement} placement has only {len(plans)} allocation(s) "
                              f"on this pool, not #{k}", where="scheduler.params.allocation")
        pools = plans[k]
        if self.placement == "shared":
            first = next(iter(pools.values()))
            desc = f"{len(first.rollout)}r+{len(first.train)}t"
        else:
            desc = ",".join(f"{n}:{len(p.rollout)}r+{len(p.train)}t" for n, p in pools.items())
        self.name = f"{self.family}-{self.placement}[{desc}]"
        return pools

    # ------------------------------------------------------------------ hooks
    def rollout_slots(self, pv: PipelineView) -> int:
        """Rollouts of one pipeline in flight at once: StreamRL generates one batch at a time."""
        return 1

    def staleness(self, pv: PipelineView) -> int:
        """Steps a rollout may run ahead of the synced weights: the pipeline's bound (async)."""
        return pv.spec.max_staleness if pv.spec.mode == "async" else 0

    def pre_actions(self, view: View) -> list[Action]:
        """Actions before any start (AReaL's interrupts)."""
        return []

    def stream_devices(self, pv: PipelineView) -> tuple[int, ...]:
        """Where a rollout's finished groups are streamed into training while it runs
        (StreamRL: its training pool; the simulator pauses streaming while a stage runs there)."""
        return ()

    def first_b(self, pv: PipelineView) -> bool:
        """Whether a rollout is done with its pipeline's first B finished groups (AReaL)."""
        return False

    # ------------------------------------------------------------------ decide
    def decide(self, view: View) -> Decision:
        if self.placement == "auto" or self.allocation is None:
            raise ConfigError(f"{self.family} searches placements; run it through the runner",
                              where="scheduler.name",
                              fix="pass placement and allocation to run one variant")
        if self._pools is None:
            self._pools = self._plan(view)
        self._note_rollouts_done(view)
        rollouts = self._rollout_actions(view)
        # Share changes first: an interrupted rank re-prefills at its new share (the executor
        # applies a share change that lands during a prefill only from the next segment).
        shares = [a for a in rollouts if isinstance(a, SetShare)]
        actions = self._residency(view) + shares + self.pre_actions(view)
        actions += self._train_actions(view)
        actions += [a for a in rollouts if not isinstance(a, SetShare)]
        return Decision(tuple(actions))

    def pools(self, name: str) -> Pools:
        """The pools of pipeline ``name`` (after the first decision)."""
        assert self._pools is not None
        return self._pools[name]

    def _note_rollouts_done(self, view: View) -> None:
        for pv in view.pipelines:
            for step, stages in pv.done.items():
                if Stage.ROLLOUT in stages:
                    self._rollout_done_s.setdefault((pv.name, step), view.now_s)

    def _residency(self, view: View) -> list[Action]:
        """Train state + reference weights live on the training pool while a pipeline runs."""
        out: list[Action] = []
        for pv in view.pipelines:
            devs = self.pools(pv.name).train
            if pv.finished and pv.name in self._placed:
                self._placed.discard(pv.name)
                out.append(SetResident(pv.name, devs, 0.0))
            elif not pv.finished and pv.name not in self._placed:
                self._placed.add(pv.name)
                out.append(SetResident(pv.name, devs,
                                       pipeline_resident_bytes(view.cost, pv, len(devs))))
        return out

    def _groups(self, view: View, train: bool) -> dict[tuple[int, ...], list[PipelineView]]:
        """Pipelines by the device set of their training pool (``train``) or rollout pool."""
        out: dict[tuple[int, ...], list[PipelineView]] = defaultdict(list)
        for pv in view.pipelines:
            pools = self.pools(pv.name)
            out[pools.train if train else pools.rollout].append(pv)
        return out

    def _train_actions(self, view: View) -> list[Action]:
        """One training-side stage at a time per training pool, oldest finished rollout first."""
        out: list[Action] = []
        for devs, pvs in self._groups(view, train=True).items():
            # Rule-based reward runs on the controller's CPU (as under verl): no device, no wait.
            out += [StartStage(pv.name, step, stage, (), share=0.0) for pv in pvs
                    for step, stage in pv.ready() if stage == Stage.REWARD]
            if any(t.stage != Stage.ROLLOUT and t.devices for pv in pvs for t in pv.running):
                continue
            cands = [(self._rollout_done_s.get((pv.name, step), view.now_s), pv.index, step,
                      stage, pv) for pv in pvs for step, stage in pv.ready()
                     if stage not in (Stage.ROLLOUT, Stage.REWARD)]
            if not cands:
                continue
            _, _, step, stage, pv = min(cands, key=lambda c: c[:4])
            mem = 0.0
            if stage in MODEL_PASSES:
                mem = view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, len(devs))
            out.append(StartStage(pv.name, step, stage, devs, mem_bytes=mem))
        return out

    def _rollout_actions(self, view: View) -> list[Action]:
        out: list[Action] = []
        for devs, pvs in self._groups(view, train=False).items():
            out += self._rollout_group(view, devs, pvs)
        return out

    def _rollout_group(self, view: View, devs: tuple[int, ...],
                       pvs: list[PipelineView]) -> list[Action]:
        """Start rollouts on one rollout pool and split its compute evenly among them.

        Pipelines take turns on a shared pool: a pipeline may add rollouts only while no other
        pipeline waits; otherwise its running rollouts drain and the pool is handed over.
        """
        running = [t for pv in pvs for t in pv.running if t.stage == Stage.ROLLOUT]
        waiting = {pv.name: [s for s, st in pv.ready() if st == Stage.ROLLOUT
                             and s - pv.steps_completed <= self.staleness(pv)] for pv in pvs}
        waiting = {k: v for k, v in waiting.items() if v}
        owner = running[0].pipeline if running else None
        if owner is None and waiting:
            by = {pv.name: pv for pv in pvs}
            owner = min(waiting, key=lambda k: (self._started[k], by[k].index))
        new: list[tuple[PipelineView, int]] = []
        if owner is not None and not (running and set(waiting) - {owner}):
            pv = next(p for p in pvs if p.name == owner)
            room = self.rollout_slots(pv) - sum(t.pipeline == owner for t in running)
            new = [(pv, s) for s in waiting.get(owner, [])[:max(0, room)]]
        if not running and not new:
            return []
        share = 1.0 / (len(running) + len(new))
        out: list[Action] = [SetShare(t.task_id, share) for t in running
                             if abs(t.share - share) > EPS]
        for pv, step in new:
            self._started[pv.name] += 1
            ranker = LengthRanker.fit(pv.history) if self.dispatch == "skew_aware" else None
            out.append(StartRollout(pv.name, step, devs, pv.spec.rollout_tp, share,
                                    self._kv_bytes(view, pv), self.dispatch, ranker,
                                    self.stream_devices(pv), self.first_b(pv)))
        return out

    def _kv_bytes(self, view: View, pv: PipelineView) -> float:
        """KV memory per device of one rollout: the engine's memory split over its slots.

        Raises:
            ConfigError: when the weights leave no room for a KV cache.
        """
        slots = self.rollout_slots(pv)
        engine = self.gpu_memory_utilization * view.accelerator.hbm_bytes / slots
        kv = engine - view.cost.rollout_weight_bytes(pv.model, pv.spec.rollout_tp)
        if kv <= 0:
            raise ConfigError(f"pipeline {pv.name!r}: {slots} rollout engine(s) of "
                              f"{pv.spec.model} leave no KV memory on a rollout device",
                              where=f"pipelines.{pv.index}.rollout_tp",
                              fix="raise rollout_tp or lower max_staleness")
        return kv


def staleness_slots(pv: PipelineView) -> int:
    """η + 1 rollouts of an async pipeline in flight (one per weight version); one if sync."""
    return 1 + (pv.spec.max_staleness if pv.spec.mode == "async" else 0)


@register_policy("streamrl")
class StreamRLPolicy(DisaggregatedPolicy):
    """StreamRL: see the module docstring."""

    family = "streamrl"
    dispatch = "skew_aware"

    def stream_devices(self, pv: PipelineView) -> tuple[int, ...]:
        """StreamRL's dynamic-batch pipelining: finished groups go to the training pool."""
        return self.pools(pv.name).train
