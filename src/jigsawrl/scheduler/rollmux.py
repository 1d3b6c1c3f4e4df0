"""The ``rollmux`` baseline: phase-level multiplexing of disaggregated on-policy jobs (RollMux).

RollMux (Wu et al., arXiv 2512.11306; ``reference/peers.md``) schedules many disaggregated RL jobs
on a *co-execution group*: a rollout pool and a training pool shared by the group's jobs. The idle
phase of one job is filled by the active phase of another, **whole phases at a time**, round-robin:

- the rollout pool runs one pipeline's whole rollout at a time, on all its devices at share 1;
- the training pool runs one pipeline's whole training phase at a time: old log-prob, ref
  log-prob, actor update, then the weight sync that hands the new weights to the rollout side
  (the rule-based reward runs on the controller's CPU as soon as the rollout ends, as in
  ``verl``, and holds no device);
- on-policy: a pipeline's next rollout waits for its weight sync (async pipelines are run
  synchronously, as verl does; RollMux targets on-policy jobs);
- a phase waits only for its own dependencies and for its pool; each pool serves the pipelines in
  the order their phases became ready (FIFO, ties by pipeline order) — the round-robin of a group
  whose jobs have the same period;
- it cannot split a phase, share a device between phases, or move a long tail.

Model states stay in host memory for "warm" switches (RollMux's residency constraint). On the
training pool a pipeline's train state (FSDP-sharded params, grads, Adam state, plus the reference
weights) is onloaded before its training phase and offloaded after it, as explicit ``onload`` /
``offload`` stages the executor prices over the host link — *unless* all pipelines' states fit on
the pool together, in which case they all stay resident and switches are free (the stronger
reading: a user would not pay transfers that memory makes unnecessary). Transfers run on the copy
engines, so they hold their devices at compute share 0.

Modelling choices (DESIGN.md §6: where the design is open, the stronger reading):

- The rollout/train split is a choice RollMux's inter-group planner makes per job mix. We search
  it: :meth:`RollMuxPolicy.variants` returns one policy per rollout fraction in
  :data:`ROLLOUT_FRACTIONS` (rounded to whole rollout TP groups), the runner simulates each and
  reports the best (``summary["variant"]`` names it). Fractions whose training pool is too small
  to train a model are infeasible and skipped.
- The rollout pool runs no training, so its engine takes vLLM's default
  ``gpu_memory_utilization`` of 0.9 (verl's colocated 0.6 is there to leave room for the train
  state, which a dedicated rollout pool does not hold).
- Inactive pipelines' rollout weights live in host memory; reloading them on a switch
  (``weights / tp`` bytes per device, well under a second for the models here) is **not charged**
  because the executor's ``onload`` prices a train state, not engine weights. This favours
  RollMux.
- The weight sync runs on the training pool (the trainer gathers and pushes the weights); the
  receiving side does not occupy the rollout pool, so it never delays another pipeline's rollout.
  This favours RollMux too.
- When the states do not all fit, the training pool holds only the slot holder's state (the
  paper's residency: inactive states wait in host memory); the onload reserves its memory from
  the start of the copy. Only the train state's transfer is charged (its reference weights travel
  for free), and a job's first load is start-up, not charged, as for verl.
- The weight sync is priced like verl's (gather over the training pool, then the engine copy);
  a cross-pool network hop is not charged separately.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
from jigsawrl.scheduler.rollout_tp import with_scaled_tps
from jigsawrl.scheduler.verl import (
    MICRO_BATCH_TOKENS,
    pipeline_resident_bytes,
)
from jigsawrl.stages import MODEL_PASSES, Stage

# Rollout fractions of the pool searched by ``rollmux``: 3/8 .. 7/8 of the devices (rollout
# usually dominates a step; splits too small to train a model are infeasible and skipped).
ROLLOUT_FRACTIONS: tuple[float, ...] = (0.375, 0.5, 0.625, 0.75, 0.875)
# vLLM's default engine memory share; a dedicated rollout pool has nothing else to hold.
ROLLOUT_POOL_GPU_MEMORY_UTILIZATION = 0.9


@dataclass(slots=True)
class Pools:
    """The co-execution group: disjoint rollout and training device sets."""

    rollout: tuple[int, ...]
    train: tuple[int, ...]
    all_resident: bool  # every pipeline's train state fits on the training pool at once


@dataclass(slots=True)
class _TrainSlot:
    """The pipeline that holds the training pool, from its onload to its offload."""

    pipeline: str
    step: int
    offloading: bool = False


@dataclass(slots=True)
class _Queues:
    rollout: list[tuple[str, int]] = field(default_factory=list)
    train: list[tuple[str, int]] = field(default_factory=list)


def _pop_ready(queue: list[tuple[str, int]], pipes: dict[str, PipelineView],
               rollout: bool) -> tuple[str, int] | None:
    """Drop stale entries (no longer ready) from the head of a FIFO; return the head, if any."""
    while queue:
        name, step = queue[0]
        if any(s == step and (st == Stage.ROLLOUT) == rollout
               for s, st in pipes[name].ready(force_sync=True)):
            return queue[0]
        queue.pop(0)
    return None


def split_pools(view: View, rollout_fraction: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rollout and training device sets for ``rollout_fraction`` of the pool.

    The rollout pool is rounded to whole rollout TP groups (of the largest ``rollout_tp``) and the
    training pool to whole ``train_tp`` groups; both keep at least one group.

    Raises:
        ConfigError: the pool is too small for one group of each.
    """
    n = len(view.devices)
    rtp = max(p.spec.rollout_tp for p in view.pipelines)
    ttp = max(p.spec.train_tp for p in view.pipelines)
    n_roll = max(rtp, round(rollout_fraction * n / rtp) * rtp)
    while n_roll > rtp and n - n_roll < ttp:
        n_roll -= rtp
    n_train = (n - n_roll) // ttp * ttp
    if n_train < 1 or n_roll > n:
        raise ConfigError(f"{n} devices cannot hold a rollout pool of TP {rtp} and a training "
                          f"pool of TP {ttp}", where="cluster", fix="use more devices")
    return tuple(range(n_roll)), tuple(range(n_roll, n_roll + n_train))


def train_need_bytes(view: View, pv: PipelineView, n_train: int) -> tuple[float, float]:
    """(resident state, peak activations) per device of ``pv`` training on ``n_train`` devices."""
    state = pipeline_resident_bytes(view.cost, pv, n_train)
    return state, view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, n_train)


def plan_pools(view: View, rollout_fraction: float, rollout_gmu: float) -> Pools:
    """Split the pool and check that every pipeline fits its phases there.

    Raises:
        ConfigError: a pipeline cannot train on the training pool, or its engine weights leave
            no KV cache on the rollout pool (naming the pipeline and what to change).
    """
    roll, train = split_pools(view, rollout_fraction)
    hbm = view.accelerator.hbm_bytes
    states, peak_act = 0.0, 0.0
    for pv in view.pipelines:
        state, act = train_need_bytes(view, pv, len(train))
        if state + act > hbm:
            raise ConfigError(
                f"pipeline {pv.name!r} needs {(state + act) / 1e9:.0f} GB per device to train on "
                f"a {len(train)}-device training pool ({view.accelerator.name}: "
                f"{hbm / 1e9:.0f} GB)", where="scheduler.params.rollout_fraction",
                fix="give the training pool more devices (lower rollout_fraction)")
        weights = view.cost.rollout_weight_bytes(pv.model, pv.spec.rollout_tp)
        need_kv = view.cost.kv_bytes(pv.model, pv.spec.max_response_tokens + 512,
                                     pv.spec.rollout_tp)
        if rollout_gmu * hbm - weights < need_kv:
            raise ConfigError(f"pipeline {pv.name!r}: engine weights leave no KV cache for one "
                              "response on the rollout pool", where=f"pipelines.{pv.index}",
                              fix="raise rollout_tp or lower max_response_tokens")
        states += state
        peak_act = max(peak_act, act)
    return Pools(roll, train, all_resident=states + peak_act <= hbm)


@register_policy("rollmux")
class RollMuxPolicy(PolicyBase):
    """See the module docstring.

    Args:
        rollout_fraction: share of the devices in the rollout pool; None (``rollmux``) searches
            :data:`ROLLOUT_FRACTIONS` through :meth:`variants`.
        rollout_gpu_memory_utilization: engine memory (weights + KV) per rollout-pool device.
    """

    def __init__(self, rollout_fraction: float | None = None,
                 rollout_gpu_memory_utilization: float = ROLLOUT_POOL_GPU_MEMORY_UTILIZATION
                 ) -> None:
        if rollout_fraction is not None and not 0.0 < rollout_fraction < 1.0:
            raise ConfigError(f"rollout_fraction must be in (0, 1), not {rollout_fraction}",
                              where="scheduler.params.rollout_fraction")
        self.rollout_fraction = rollout_fraction
        self.rollout_gmu = rollout_gpu_memory_utilization
        self.name = ("rollmux" if rollout_fraction is None
                     else f"rollmux-rollout{rollout_fraction:g}")
        self.pools: Pools | None = None
        self._q = _Queues()
        self._slot: _TrainSlot | None = None
        self._placed: set[str] = set()
        self._started: set[str] = set()  # pipelines whose train state was loaded once

    def variants(self) -> list[RollMuxPolicy]:
        """The rollout/train splits to simulate, each also at scaled rollout TPs
        (``rollout_tp.with_scaled_tps``); the runner reports the best."""
        if self.rollout_fraction is not None:
            return [self]
        return with_scaled_tps(  # type: ignore[return-value]
            lambda: [RollMuxPolicy(f, self.rollout_gmu) for f in ROLLOUT_FRACTIONS])

    def decide(self, view: View) -> Decision:
        if self.rollout_fraction is None:
            raise ConfigError("rollmux searches rollout fractions; run it through the runner",
                              where="scheduler.params",
                              fix="set scheduler.params.rollout_fraction to run one split")
        if self.pools is None:
            self.pools = plan_pools(view, self.rollout_fraction, self.rollout_gmu)
        pipes = {pv.name: pv for pv in view.pipelines}
        actions: list[Action] = self._residency(view)
        actions += self._enqueue(view)
        actions += self._rollout_pool(view, pipes)
        actions += self._train_pool(view, pipes)
        return Decision(tuple(actions))

    # ------------------------------------------------------------------ bookkeeping
    def _residency(self, view: View) -> list[Action]:
        """All-resident mode: place every state up front, free it when its pipeline finishes."""
        assert self.pools is not None
        if not self.pools.all_resident:
            return []
        out: list[Action] = []
        train = self.pools.train
        for pv in view.pipelines:
            if pv.name not in self._placed and not pv.finished:
                self._placed.add(pv.name)
                out.append(SetResident(pv.name, train, train_need_bytes(view, pv, len(train))[0]))
            elif pv.name in self._placed and pv.finished:
                self._placed.discard(pv.name)
                out.append(SetResident(pv.name, train, 0.0))
        return out

    def _enqueue(self, view: View) -> list[Action]:
        """Append newly ready phases to their pool's FIFO (in pipeline order within a decision);
        start rule-based rewards at once on the controller's CPU (they hold no device)."""
        slot = (self._slot.pipeline, self._slot.step) if self._slot else None
        out: list[Action] = []
        for pv in view.pipelines:
            for step, stage in pv.ready(force_sync=True):
                key = (pv.name, step)
                if stage == Stage.REWARD:
                    out.append(StartStage(pv.name, step, stage, (), share=0.0))
                    continue
                queue = self._q.rollout if stage == Stage.ROLLOUT else self._q.train
                if key not in queue and (stage == Stage.ROLLOUT or key != slot):
                    queue.append(key)
        return out

    # ------------------------------------------------------------------ rollout pool
    def _rollout_pool(self, view: View, pipes: dict[str, PipelineView]) -> list[Action]:
        assert self.pools is not None
        busy = any(t.stage == Stage.ROLLOUT for pv in view.pipelines for t in pv.running)
        head = _pop_ready(self._q.rollout, pipes, rollout=True)
        if busy or head is None:
            return []
        name, step = self._q.rollout.pop(0)
        pv = pipes[name]
        tp = pv.spec.rollout_tp
        devs = self.pools.rollout[:len(self.pools.rollout) // tp * tp]
        weights = view.cost.rollout_weight_bytes(pv.model, tp)
        kv = max(0.0, self.rollout_gmu * view.accelerator.hbm_bytes - weights)
        return [StartRollout(name, step, devs, tp, kv_mem_bytes=kv)]

    # ------------------------------------------------------------------ training pool
    def _train_pool(self, view: View, pipes: dict[str, PipelineView]) -> list[Action]:
        assert self.pools is not None
        out: list[Action] = []
        if self._slot is None:
            if _pop_ready(self._q.train, pipes, rollout=False) is None:
                return []
            self._slot = _TrainSlot(*self._q.train.pop(0))
            return self._onload(view, pipes)
        pv = pipes[self._slot.pipeline]
        if any(t.stage not in (Stage.ROLLOUT, Stage.REWARD) for t in pv.running):
            return out  # the slot holder's current stage (or memory move) is still running
        if self._slot.offloading:  # offload done: the state is in host memory now
            out.append(SetResident(pv.name, self.pools.train, 0.0))
            self._slot = None
            return out + self._train_pool(view, pipes)
        todo = [(s, st) for s, st in pv.ready(force_sync=True)
                if st != Stage.ROLLOUT and s == self._slot.step]
        if todo:
            return out + [self._stage(view, pv, *todo[0])]
        return out + self._release(view, pv, pipes)

    def _onload(self, view: View, pipes: dict[str, PipelineView]) -> list[Action]:
        """Bring the new slot holder's train state onto the pool (its memory is reserved from the
        start of the copy), or start its first stage at once when every state is resident."""
        assert self.pools is not None and self._slot is not None
        if self.pools.all_resident:
            return self._train_pool(view, pipes)
        pv = pipes[self._slot.pipeline]
        train = self.pools.train
        out: list[Action] = [SetResident(pv.name, train, train_need_bytes(view, pv, len(train))[0])]
        if pv.name not in self._started:  # the job's first load is start-up, not charged
            self._started.add(pv.name)
            return out + self._train_pool(view, pipes)
        return out + [StartStage(pv.name, self._slot.step, Stage.ONLOAD, train, share=0.0)]

    def _release(self, view: View, pv: PipelineView,
                 pipes: dict[str, PipelineView]) -> list[Action]:
        """The slot holder's training phase is over: offload its state, or hand the pool on."""
        assert self.pools is not None and self._slot is not None
        if not self.pools.all_resident and not pv.finished:
            self._slot.offloading = True
            return [StartStage(pv.name, self._slot.step, Stage.OFFLOAD, self.pools.train,
                               share=0.0)]
        out: list[Action] = []
        if not self.pools.all_resident:  # finished: its state is simply dropped
            out.append(SetResident(pv.name, self.pools.train, 0.0))
        self._slot = None
        return out + self._train_pool(view, pipes)

    def _stage(self, view: View, pv: PipelineView, step: int, stage: str) -> StartStage:
        assert self.pools is not None
        train = self.pools.train
        mem = 0.0
        if stage in MODEL_PASSES:
            mem = view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, len(train))
        return StartStage(pv.name, step, stage, train, mem_bytes=mem)
