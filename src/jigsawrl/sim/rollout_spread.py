"""A running rollout grows onto new ranks (mixed into ``RolloutRuntime``; issue 11, item 4).

A :class:`~jigsawrl.scheduler.base.Spread` adds ranks of the rollout's TP on devices the rollout
did not hold and re-deals its unfinished requests: every rank (the live ones and the new ones)
ends up with about the same number of unfinished requests. Which requests move is chosen as a
real engine could, without their lengths (:meth:`~.rollout.RolloutInstance.export_some`: queued
ones first, then the most recently admitted running ones); requests waiting for a tool stay
where their result will arrive (they count towards their rank's load).

What is charged (the truth model's own costs, nothing else):

- the re-prefill of every moved request's context (prompt, generated tokens, tool results) on
  its new rank — a queued request that never ran prefills what it would have anyway;
- each new rank's engine wake-up before its first segment: a rank's set-up where the executor
  has one (``rollout_setup_s``, as a rank that starts with its rollout: a CPU worker builds the
  engine from the weights it holds), else a weight sync onto its group
  (``CostModel.weight_sync_time_s``, as a regroup's new engine);
- a source rank's decode in flight is cut where it is (its finished iterations kept); a rank
  in a prefill gives only its queued requests (the prefill's requests stay).

The new ranks' KV budget comes from the same per-device KV memory the rollout reserved.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.sim.kernel import EventQueue
from jigsawrl.sim.rollout import ReqRun, RolloutInstance, engine_limits
from jigsawrl.sim.rollout_state import RankRun, RolloutTask

log = logging.getLogger(__name__)


class SpreadMixin:
    """:meth:`spread` for :class:`~.rollout_task.RolloutRuntime` (module docstring)."""

    q: EventQueue
    cost: CostModelProtocol
    tasks: dict[str, RolloutTask]
    setup_s: float

    if TYPE_CHECKING:  # provided by RolloutRuntime (see rollout_gates.py on stubs in mixins)
        def _plan_rank(self, task: RolloutTask, rank: RankRun) -> None: ...
        def _interrupt(self, task: RolloutTask, rank: RankRun) -> None: ...

    def spread(self, tid: str, devices: tuple[int, ...]) -> None:
        """Add ranks of ``tid``'s TP on ``devices`` and re-deal its unfinished requests over
        every live rank (module docstring).

        Raises:
            ValueError: ``devices`` are not whole groups of the rollout's TP, or the rollout
                batches first-B (its requests belong to the pipeline, not to this rollout).
        """
        task = self.tasks[tid]
        tp = task.tp
        if task.first_b or not devices or len(devices) % tp:
            raise ValueError(f"{tid}: cannot spread onto {devices} (TP {tp}, first-B "
                             f"{task.first_b})")
        live = [r for r in task.ranks if r.redirect is None]
        share = live[0].share if live else 1.0
        model = task.pipe.model
        limits = engine_limits(self.cost, task.pipe.spec,
                               self.cost.kv_budget_tokens(model, tp, task.kv_mem_bytes))
        new: list[RankRun] = []
        for g in range(0, len(devices), tp):
            index = len(task.ranks)
            inst = RolloutInstance(f"{tid}/{index}", model, tp, self.cost, **limits)
            # a new engine with the rollout's weights: a rank's set-up where a worker has one
            # (a CPU worker builds it from the weights it holds), else a weight sync onto it
            rank = RankRun(inst, devices[g:g + tp], share, index=index, owner=task,
                           setup_due=self.setup_s > 0, wake_s=0.0 if self.setup_s > 0 else
                           self.cost.weight_sync_time_s(model, tp, tp))
            task.ranks.append(rank)
            new.append(rank)
        moved = self._take_excess(task, live, math.ceil(
            sum(r.inst.unfinished for r in live) / (len(live) + len(new))))
        targets = new + [r for r in live if r.seg is None and not r.inst.runnable]
        for req in moved:  # each to the rank holding the fewest
            min(targets, key=lambda r: (r.inst.unfinished, r.index)).inst.add_runs([req])
        log.debug("%s: spread onto %s, %d requests moved", tid, devices, len(moved))
        for rank in [*live, *new]:
            if rank.seg is None:
                self._plan_rank(task, rank)

    def _take_excess(self, task: RolloutTask, live: list[RankRun], target: int) -> list[ReqRun]:
        """From each live rank holding more than ``target`` unfinished requests, the excess (as
        far as it is queued or running): a decode in flight is cut now; a prefill keeps its
        requests."""
        out: list[ReqRun] = []
        for rank in sorted(live, key=lambda r: (-r.inst.unfinished, r.index)):
            excess = rank.inst.unfinished - target
            if excess <= 0:
                continue
            in_prefill = rank.seg is not None and not rank.seg.iters
            if rank.seg is not None and rank.seg.iters:
                self._interrupt(task, rank)
            out += rank.inst.export_some(excess, queued_only=in_prefill)
        return out
