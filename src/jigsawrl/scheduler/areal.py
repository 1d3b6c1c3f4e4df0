"""The ``areal`` baseline: fully asynchronous, disaggregated RL with interruptible generation (AReaL).

AReaL (``reference/peers.md``) keeps its rollout devices generating all the time and lets the
trainer consume finished batches. What is modelled here, and how:

- **Pools** as in :mod:`jigsawrl.scheduler.streamrl` (``split``: per-pipeline rollout and training
  sub-pools; ``shared``: pipelines take turns on one rollout and one training pool), and the same
  candidate rollout/training allocations are searched: the runner simulates each variant and
  reports the best (AReaL's users pick the split by hand; a search is at least as good).
- **Staleness-bounded admission.** AReaL admits new rollouts while
  ``(η + version + 1) × batch − (accepted + running) > 0`` with η = ``max_staleness``. At the
  granularity of whole steps this is exactly ``PipelineView.ready``: the rollout of step k is
  admitted once the weights of step k−1−η are synced (η = 0 is synchronous; sync pipelines
  run with η = 0). Every admissible rollout starts at once — the rollout devices never wait for
  training, only for the staleness bound.
- **Several steps in flight.** Up to η+1 rollouts of one pipeline run at once on its rollout pool,
  the pool's compute split evenly between them and given back as they finish. AReaL runs them in
  one engine; here they are concurrent tasks. Chosen over running them back to back because it
  is the stronger reading: decode is memory-bound and hardly slows on a share of the SMs. The
  engine's KV memory is split into η+1 equal parts and each task holds its own weight copy
  (slightly pessimistic on memory, which one engine would share). Caveat: the cost model gives
  each co-located decode ``min(1, share / s_sat)`` of the device's HBM bandwidth without
  contention, so two decodes at share 0.5 each read at full bandwidth; that flatters this choice
  (most of its gain over back-to-back rollouts disappears with bandwidth shared by share).
- **Interruptible generation.** When a pipeline's weight sync finishes, every in-flight rollout of
  that pipeline gets an :class:`Interrupt`: its requests are aborted and resumed in place on the
  new weights, re-prefilling prompt + generated tokens (the executor charges it).
- **Dispatch** is ``contiguous``: AReaL submits requests to its servers without a length ranker.
- **Training** consumes finished steps in order on the training pool; weight sync runs there.

- **First-B batches.** AReaL forms a training batch from the first ``batch`` trajectories to
  finish, so a long-tail sample slips into a later batch instead of delaying this one: an async
  pipeline's rollouts start with ``first_b`` (:mod:`jigsawrl.sim.batching`). A rollout is done
  when its pipeline's first ``batch_size`` GRPO groups have finished, from any of its in-flight
  rollouts (a group, not a single response: GRPO's advantage needs the whole group); its
  unfinished requests carry over into the next rollout, resumed with their tokens (re-prefill).
  Sync pipelines (η = 0) keep whole-step batches: carrying a sample into the next step would make
  their training off-policy.
"""

from __future__ import annotations

from jigsawrl.scheduler.base import Action, Interrupt, PipelineView, View, register_policy
from jigsawrl.scheduler.streamrl import (
    ROLLOUT_MEM_FRACTION,
    DisaggregatedPolicy,
    Placement,
    staleness_slots,
)
from jigsawrl.stages import Stage


@register_policy("areal")
class ArealPolicy(DisaggregatedPolicy):
    """AReaL: see the module docstring."""

    family = "areal"
    dispatch = "contiguous"

    def __init__(self, placement: Placement = "auto", allocation: int | None = None,
                 gpu_memory_utilization: float = ROLLOUT_MEM_FRACTION) -> None:
        super().__init__(placement, allocation, gpu_memory_utilization)
        self._versions: dict[str, int] = {}

    def rollout_slots(self, pv: PipelineView) -> int:
        """η + 1 rollouts of an async pipeline may be in flight; a sync one has one."""
        return staleness_slots(pv)

    def first_b(self, pv: PipelineView) -> bool:
        """Async pipelines train on the first B finished groups (module docstring)."""
        return pv.spec.mode == "async"

    def pre_actions(self, view: View) -> list[Action]:
        """Interrupt a pipeline's in-flight rollouts when its new weights have arrived."""
        out: list[Action] = []
        for pv in view.pipelines:
            seen = self._versions.get(pv.name, 0)
            self._versions[pv.name] = pv.steps_completed
            if pv.steps_completed > seen and not pv.finished:
                out += [Interrupt(t.task_id) for t in pv.running if t.stage == Stage.ROLLOUT]
        return out
