"""Re-formed TP groups for a rollout's tail (mixed into ``RolloutRuntime``; issue 11, item 4).

A :class:`~jigsawrl.scheduler.base.Regroup` takes a rollout's ranks, aborts their unfinished
requests and resumes them all on one engine whose tensor-parallel group spans every one of those
ranks' devices. The destination rank keeps its number and takes the devices; the others report
0 unfinished and forward their tool results to it, as after a migration.

What is charged (the truth model's own costs, nothing else):

- the re-prefill of every moved request's prompt and generated tokens on the new group (the
  KV layout changes with the TP degree, so even the destination's own requests re-prefill);
- the new engine's wake-up, charged as a weight sync onto that group
  (``CostModel.weight_sync_time_s``: its fixed overhead plus moving the weights) and paid
  before its first segment. A simplification: a real system keeps a sleeping engine of that
  degree (vLLM's sleep mode) and slices the weights every device already holds, which is
  likely cheaper;
- the KV budget of the new group from the same per-device KV memory the rollout reserved.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.sim.kernel import EventQueue
from jigsawrl.sim.rollout import ReqRun, RolloutInstance, engine_limits
from jigsawrl.sim.rollout_state import RankRun, RolloutTask

log = logging.getLogger(__name__)


class RegroupMixin:
    """:meth:`regroup` for :class:`~.rollout_task.RolloutRuntime` (module docstring)."""

    q: EventQueue
    cost: CostModelProtocol
    tasks: dict[str, RolloutTask]

    if TYPE_CHECKING:  # provided by RolloutRuntime (see rollout_gates.py on stubs in mixins)
        def _drain_rank(self, task: RolloutTask, rank: RankRun) -> list[ReqRun]: ...
        def _plan_rank(self, task: RolloutTask, rank: RankRun) -> None: ...
        def _close_span(self, task: RolloutTask, rank: RankRun, now: float) -> None: ...
        def _set_demand(self, task: RolloutTask, rank: RankRun, demand: float) -> None: ...

    def regroup(self, tid: str, src_ranks: tuple[int, ...], dst_rank: int) -> None:
        """Resume the unfinished requests of ``dst_rank`` and ``src_ranks`` on one TP group of
        all their devices, held by ``dst_rank`` (module docstring)."""
        task = self.tasks[tid]
        dst = task.ranks[dst_rank]
        runs = self._drain_rank(task, dst)
        self._close_span(task, dst, self.q.now_s)
        self._set_demand(task, dst, 0.0)
        devices = list(dst.devices)
        waiting = dst.inst.tool_waiting
        srcs = [task.ranks[i] for i in src_ranks]
        for src in srcs:
            runs += self._drain_rank(task, src)
            src.redirect = dst
            waiting += src.inst.tool_waiting
            src.inst.tool_waiting = 0
            devices += src.devices
        model, tp = task.pipe.model, len(devices)
        kv = self.cost.kv_budget_tokens(model, tp, task.kv_mem_bytes)
        dst.inst = RolloutInstance(f"{tid}/{dst_rank}", model, tp, self.cost,
                                   **engine_limits(self.cost, task.pipe.spec, kv))
        dst.inst.add_runs(runs)
        dst.inst.tool_waiting = waiting
        dst.devices = tuple(devices)
        dst.wake_s = self.cost.weight_sync_time_s(model, tp, tp)
        for src in srcs:  # after dst holds the requests: the rollout is not done
            self._plan_rank(task, src)  # closes its span, reports 0 unfinished
        log.debug("%s: regrouped %d requests of ranks %s onto rank %d at TP %d", tid,
                  len(runs), (dst_rank, *src_ranks), dst_rank, tp)
        self._plan_rank(task, dst)
