"""The ``muxserve`` baseline: rollout-only multiplexing (MuxServe-style), training serialised.

MuxServe (Duan et al., ICML 2024; ``reference/peers.md``) serves several LLMs on the same GPUs by
spatial-temporal multiplexing: every model is resident, their jobs run concurrently with a
compute split (CUDA MPS percentages) and share one unified KV memory. The JigsawRL paper uses it
as the "rollout-only multiplexing" ablation: the rollouts of different pipelines share the devices
the way MuxServe's models do, while training stays serialised. This module implements that:

- every pipeline is resident on every device: its FSDP train state and reference weights,
  sharded over the whole pool (a :class:`~jigsawrl.errors.ConfigError` names the fix when they do
  not fit together with one training stage's activations);
- rollouts of different pipelines run at the same time on all devices, with equal compute shares:
  with ``k`` rollouts running each gets the largest share level of the cost model
  (:data:`~jigsawrl.costmodel.slowdown.SHARE_LEVELS`) not above ``1/k``; running rollouts are
  re-shared (``SetShare``) whenever a rollout starts or ends; at most ``1 / min level`` rollouts
  run at once;
- the KV memory of the engine budget (verl's ``gpu_memory_utilization`` of the device, less the
  resident states) is split equally among the unfinished pipelines after their engine weights,
  so any set of concurrent rollouts fits (MuxServe's unified KV cache, reserved per engine here
  because a rollout's KV budget is fixed when it starts);
- training stages are not multiplexed: a training stage (old/ref log-prob, actor update, weight
  sync) runs alone on all devices at share 1, and one pipeline's training runs at a time, from its
  first training stage to its weight sync, in the order the pipelines became ready (FIFO).

Open choices, taken in the stronger reading (DESIGN.md §6):

- Training has priority: while any pipeline's training is ready, no new rollout starts; the
  training starts as soon as the running rollouts have drained the devices. Letting rollouts keep
  starting would starve training and, with two pipelines, degenerate into one rollout at a time.
- Rule-based rewards run on the controller's CPU as soon as a rollout ends (as in ``verl``); they
  hold no device, so they neither wait for nor block anything.
- Async pipelines are run synchronously (as ``verl`` does); MuxServe has no notion of staleness.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsawrl.costmodel.slowdown import SHARE_LEVELS
from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import (
    Action,
    Decision,
    PipelineView,
    Policy,
    PolicyBase,
    SetResident,
    SetShare,
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
from jigsawrl.workload.experiment import DEFAULT_GPU_MEMORY_UTILIZATION

EPS = 1e-9


def equal_share(k: int) -> float | None:
    """The largest share level not above ``1/k`` (None when ``k`` rollouts cannot all fit)."""
    fits = [s for s in SHARE_LEVELS if s <= 1.0 / k + EPS]
    return max(fits) if fits else None


MAX_CONCURRENT = max(k for k in range(1, 64) if equal_share(k) is not None)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per-device bytes: resident states of all pipelines and the engine budget of rollouts."""

    resident: dict[str, float]
    engine_bytes: float  # weights + KV of all concurrently running rollouts


def plan_memory(view: View, devs: tuple[int, ...], gmu: float) -> MemoryPlan:
    """Check that all pipelines live on ``devs`` together (with one training stage or all
    rollouts at once).

    Raises:
        ConfigError: the resident states plus a training stage's activations, or the engine
            weights plus one response's KV per pipeline, do not fit (with the numbers and a fix).
    """
    cost, hbm, n = view.cost, view.accelerator.hbm_bytes, len(devs)
    resident = {pv.name: pipeline_resident_bytes(cost, pv, n) for pv in view.pipelines}
    total = sum(resident.values())
    act = max(cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, n) for pv in view.pipelines)
    fix = "use fewer pipelines, more devices, or a policy that does not keep all resident"
    if total + act > hbm:
        raise ConfigError(
            f"muxserve keeps all {len(resident)} pipelines resident: {total / 1e9:.0f} GB of "
            f"train state + {act / 1e9:.0f} GB of activations per device exceed "
            f"{view.accelerator.name}'s {hbm / 1e9:.0f} GB", where="pipelines", fix=fix)
    engine = min(gmu * hbm, hbm - total)
    kv_each = _kv_each(view, view.pipelines, engine)
    for pv in view.pipelines:
        need = cost.kv_bytes(pv.model, pv.spec.max_response_tokens + 512, pv.spec.rollout_tp)
        if kv_each < need:
            raise ConfigError(
                f"muxserve: {engine / 1e9:.1f} GB of engine memory per device leaves "
                f"{max(kv_each, 0.0) / 1e9:.2f} GB of KV cache to pipeline {pv.name!r}, less than "
                f"one response needs ({need / 1e9:.2f} GB)", where="pipelines", fix=fix)
    return MemoryPlan(resident, engine)


def _kv_each(view: View, pipes: tuple[PipelineView, ...] | list[PipelineView],
             engine: float) -> float:
    weights = sum(view.cost.rollout_weight_bytes(p.model, p.spec.rollout_tp) for p in pipes)
    return (engine - weights) / max(1, len(pipes))


@register_policy("muxserve")
class MuxServePolicy(PolicyBase):
    """See the module docstring.

    Args:
        gpu_memory_utilization: engine memory (weights + KV of all rollouts) per device, as in
            verl, before the resident train states are taken out.
    """

    name = "muxserve"

    def __init__(self, gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> None:
        self.gmu = gpu_memory_utilization
        self.plan: MemoryPlan | None = None
        self._devs: tuple[int, ...] = ()
        self._train_q: list[tuple[str, int]] = []
        self._owner: tuple[str, int] | None = None  # the pipeline whose training holds the pool
        self._placed: set[str] = set()

    def variants(self) -> list[Policy]:
        """A fresh one, and fresh ones at scaled rollout TPs (``rollout_tp.with_scaled_tps``); the
        runner reports the best."""
        return with_scaled_tps(lambda: [MuxServePolicy(self.gmu)])

    def decide(self, view: View) -> Decision:
        if self.plan is None:
            self._devs = tuple(d.index for d in view.devices)
            self.plan = plan_memory(view, self._devs, self.gmu)
        actions: list[Action] = self._residency(view)
        rollouts: list[PipelineView] = []
        for pv in view.pipelines:
            for step, stage in pv.ready(force_sync=True):
                if stage == Stage.REWARD:  # CPU, no device
                    actions.append(StartStage(pv.name, step, stage, (), share=0.0))
                elif stage == Stage.ROLLOUT:
                    rollouts.append(pv)
                elif (pv.name, step) not in self._train_q and (pv.name, step) != self._owner:
                    self._train_q.append((pv.name, step))
        training = self._training(view)
        if training is None:  # no training pending: ready rollouts may start
            return Decision(tuple(actions + self._rollouts(view, rollouts)))
        return Decision(tuple(actions + training + self._rollouts(view, [])))

    def _residency(self, view: View) -> list[Action]:
        assert self.plan is not None
        out: list[Action] = []
        for pv in view.pipelines:
            if pv.name not in self._placed and not pv.finished:
                self._placed.add(pv.name)
                out.append(SetResident(pv.name, self._devs, self.plan.resident[pv.name]))
            elif pv.name in self._placed and pv.finished:
                self._placed.discard(pv.name)
                out.append(SetResident(pv.name, self._devs, 0.0))
        return out

    # ------------------------------------------------------------------ training
    def _training(self, view: View) -> list[Action] | None:
        """Actions of the training side; None when no training is pending (rollouts may start)."""
        pipes = {pv.name: pv for pv in view.pipelines}
        if self._owner is not None:
            name, step = self._owner
            pv = pipes[name]
            if any(t.stage not in (Stage.ROLLOUT, Stage.REWARD) for t in pv.running):
                return []  # its current stage runs alone
            todo = [st for s, st in pv.ready(force_sync=True) if s == step and st != Stage.ROLLOUT]
            if not todo:  # weight sync done: its training is over
                self._owner = None
        if self._owner is None:
            if not self._train_q:
                return None
            self._owner = self._train_q.pop(0)
        name, step = self._owner
        pv = pipes[name]
        if any(t.stage == Stage.ROLLOUT for p in view.pipelines for t in p.running):
            return []  # wait for the running rollouts to drain the devices
        stage = next((st for s, st in pv.ready(force_sync=True)
                      if s == step and st != Stage.ROLLOUT), None)
        if stage is None:  # stale (its pipeline failed): hand the devices on
            self._owner = None
            return self._training(view)
        mem = 0.0
        if stage in MODEL_PASSES:
            mem = view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, len(self._devs))
        return [StartStage(name, step, stage, self._devs, share=1.0, mem_bytes=mem)]

    # ------------------------------------------------------------------ rollouts
    def _rollouts(self, view: View, ready: list[PipelineView]) -> list[Action]:
        """Start ready rollouts beside the running ones and re-share them all equally (also when
        one has ended)."""
        assert self.plan is not None
        running = [t for p in view.pipelines for t in p.running if t.stage == Stage.ROLLOUT]
        start = ready[:max(0, MAX_CONCURRENT - len(running))]
        k = len(running) + len(start)
        if k == 0:
            return []
        share = equal_share(k)
        assert share is not None
        out: list[Action] = [SetShare(t.task_id, share) for t in running
                             if abs(t.share - share) > EPS]
        live = [p for p in view.pipelines if not p.finished]
        kv = _kv_each(view, live, self.plan.engine_bytes)
        for pv in start:
            step = next(s for s, st in pv.ready(force_sync=True) if st == Stage.ROLLOUT)
            tp = pv.spec.rollout_tp
            devs = self._devs[:len(self._devs) // tp * tp]
            out.append(StartRollout(pv.name, step, devs, tp, share=share, kv_mem_bytes=kv))
        return out
