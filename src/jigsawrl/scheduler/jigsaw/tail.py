"""Long-tail migration for ``jigsaw`` (the paper's sub-stage merging; DESIGN.md §2.4).

When a rollout's unfinished requests shrink to a tail spread over more ranks than it needs, they
can be moved onto fewer ranks (abort + re-prefill at the destination) so that the freed devices
run another pipeline's compute stage alone. Ranks that drained are always released (nothing
moves). Consolidation is taken only when the compute stage's gain beats the re-prefill and the
slower consolidated tail, both estimated with the belief cost model. When no stage waits for
devices, a small tail may instead be re-formed on one wider TP group (:mod:`.regroup`), drained
ranks being held for it meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from jigsawrl.scheduler.base import (
    Action,
    Migrate,
    PipelineView,
    Regroup,
    RunningTask,
    View,
    progress_known,
)
from jigsawrl.scheduler.jigsaw.board import Board
from jigsawrl.scheduler.jigsaw.params import JigsawParams
from jigsawrl.scheduler.jigsaw.prediction import StepPredictions
from jigsawrl.scheduler.jigsaw.regroup import TailRegroup
from jigsawrl.scheduler.jigsaw.residency import Residency
from jigsawrl.scheduler.jigsaw.shares import compute_split
from jigsawrl.stages import MODEL_PASSES, Stage


def pack(busy: list[int], left: dict[int, int], keep: int, cap: int, tid: str,
         live: list[int]) -> list[Migrate]:
    """Move the tail onto the ``keep`` fullest ranks (they keep their KV), filling each up to
    ``cap`` requests, largest sources first; drained ranks are released onto the first."""
    dsts = busy[:keep]
    load = {d: left[d] for d in dsts}
    moves: dict[int, list[int]] = {d: [] for d in dsts}
    for src in busy[keep:]:
        d = min(dsts, key=lambda x: load[x])
        moves[d].append(src)
        load[d] += left[src]
    moves[dsts[0]].extend(r for r in live if left[r] == 0)
    return [Migrate(tid, tuple(srcs), d) for d, srcs in moves.items() if srcs]


class TailMigration:
    """Plans the migrations of a decision (module docstring) and applies them to the board."""

    def __init__(self, params: JigsawParams, residency: Residency,
                 predictions: StepPredictions) -> None:
        self.params = params
        self.residency = residency
        self.predictions = predictions
        # rollout task -> (its inputs, its actions) when they depended on nothing else
        self._memo: dict[str, tuple[tuple[object, ...], list[Migrate]]] = {}
        self._capacity: dict[tuple[str, float], int] = {}
        self._waiting = True  # what the last decision's _compute_waiting said
        self.regroup = TailRegroup(params.tail_tp)

    def wakes(self, t: RunningTask, counts: Sequence[int]) -> bool:
        """Could :meth:`migrate` act on rollout ``t`` with ``counts`` unfinished per rank? The
        conditions of :meth:`_find_tail_actions` (:meth:`_tail_state`), with whether a compute
        stage waits as the last decision found it (only a finished or started task changes
        that, and each wakes the policy anyway): anything else leaves the decision as it was,
        so the report need not wake it."""
        live = [r for r, s in enumerate(t.rank_shares) if s > 0]
        per_rank = self._capacity.get((t.pipeline, self.residency.kv_mem))
        state = self._tail_state(t, live, counts, self._waiting, per_rank or 1)
        if state is None:
            return False
        if self.regroup.holding(t):  # drained ranks are held: wake when one more drains
            return state[0] or self.regroup.wakes(t, counts, live)
        # a capacity not worked out yet: let the decision see
        return per_rank is None or state[0] or bool(state[2])

    def _tail_state(self, t: RunningTask, live: Sequence[int], counts: Sequence[int],
                    waiting: bool, per_rank: int) -> tuple[bool, int, tuple[int, ...]] | None:
        """(whether consolidating the tail onto ``keep`` ranks is worth weighing, ``keep``, the
        live ranks that drained) of a rollout's counts; None when nothing can move (fewer than
        two live ranks, no report yet, or every live rank drained)."""
        if len(live) < 2 or not progress_known(t, counts, live):
            return None  # a live rank has not reported yet
        total = sum(counts[r] for r in live)
        n_busy = sum(1 for r in live if counts[r] > 0)
        if not n_busy:
            return None
        keep = max(1, math.ceil(total / per_rank))
        consolidate = waiting and total <= self.params.tail_requests and keep < n_busy
        return consolidate, keep, tuple(r for r in live if counts[r] == 0)

    def migrate(self, view: View, b: Board) -> list[Action]:
        """Releases and consolidations of every running rollout's ranks."""
        actions: list[Action] = []
        waiting = self._waiting = self._compute_waiting(view, b)
        live_tasks = {t.task_id for pv in view.pipelines for t in pv.running}
        for tid in [k for k in self._memo if k not in live_tasks]:
            del self._memo[tid]
        self.regroup.forget(live_tasks)
        regroup = self.regroup.active(view)
        for pv in view.pipelines:
            per_rank = 0
            for t in pv.running:
                if t.stage != Stage.ROLLOUT or t.task_id not in b.ranks:
                    continue
                per_rank = per_rank or self._tail_capacity(view, pv)
                for act in self._tail_actions(view, pv, t, b, waiting, per_rank, regroup):
                    actions.append(act)
                    if isinstance(act, Regroup):
                        b.regroup_ranks(act)
                    else:
                        b.release_ranks(act)
        return actions

    def regroup_placed(self, view: View, kv_mem: Callable[[PipelineView, RunningTask], float],
                       ) -> list[Regroup]:
        """Regroups of the rollouts of a verl placement jigsaw runs instead of its own plan
        (:mod:`.fallback`): a verl job's slice is its own and keeps every rank to the end, so
        no stage waits for those devices and no drained rank was released; ``kv_mem``: the
        per-device KV memory its engine was started with."""
        if not (self.regroups(view) and self.regroup.active(view)):
            return []
        self.regroup.forget({t.task_id for pv in view.pipelines for t in pv.running})
        out: list[Regroup] = []
        for pv in view.pipelines:
            for t in pv.running:
                live = self._placed_live(t, t.unfinished_per_rank)
                act = None if live is None else self.regroup.plan(
                    view, pv, t, live, self.params.tail_requests, kv_mem(pv, t))
                if act is not None:
                    out.append(act)
        return out

    def regroups(self, view: View) -> bool:
        """Whether tails regroup on this view's executor (``tail_tp``, under ``migration``)."""
        return self.params.tail_tp and self.params.migration and view.can_regroup

    def placed_wakes(self, t: RunningTask, counts: Sequence[int]) -> bool:
        """Could :meth:`regroup_placed` act on rollout ``t`` with ``counts`` unfinished per rank
        (one more of its held ranks drained)?"""
        live = self._placed_live(t, counts)
        return live is not None and self.regroup.wakes(t, counts, live)

    @staticmethod
    def _placed_live(t: RunningTask, counts: Sequence[int]) -> list[int] | None:
        """The live ranks of a placed rollout a regroup may act on; None: not a rollout, no
        progress report yet, or fewer than two live ranks."""
        if t.stage != Stage.ROLLOUT or not progress_known(t, counts):
            return None
        live = [r for r, s in enumerate(t.rank_shares) if s > 0]
        return live if len(live) >= 2 else None

    def _compute_waiting(self, view: View, b: Board) -> bool:
        """Is a compute-bound stage of another pipeline ready to start? Only then do freed
        devices have a taker (a running stage keeps its devices, so freeing more cannot help
        it): the benefit side of migration."""
        return any(stage in MODEL_PASSES and not b.any_compute()
                   for pv in view.pipelines for _, stage in pv.ready())

    def _tail_capacity(self, view: View, pv: PipelineView) -> int:
        """Requests one rank can hold without KV preemption, assuming each may grow to its cap
        (the scheduler does not know true lengths), and at most ``tail_batch``."""
        key = (pv.name, self.residency.kv_mem)
        got = self._capacity.get(key)
        if got is None:
            got = self._capacity[key] = self._find_capacity(view, pv)
        return got

    def _find_capacity(self, view: View, pv: PipelineView) -> int:
        spec = pv.spec
        kv = view.cost.kv_budget_tokens(pv.model, spec.rollout_tp,
                                        max(self.residency.kv_mem, 1.0))
        worst = spec.max_response_tokens + 512
        return max(1, min(self.params.tail_batch, kv // worst))

    def _tail_actions(self, view: View, pv: PipelineView, t: RunningTask, b: Board,
                      waiting: bool, per_rank: int, regroup: bool) -> list[Migrate | Regroup]:
        """The task's migrations; remembered while its inputs stay the same, unless they were
        weighed by :meth:`_worth_moving` (which reads the clock and the other pipelines)."""
        key = (t.unfinished_per_rank, len(t.rank_devices), tuple(b.rank_idx[t.task_id]),
               waiting, per_rank)
        memo = self._memo.get(t.task_id)
        if memo is not None and memo[0] == key:
            return list(memo[1])
        weighed: list[bool] = []
        out = self._find_tail_actions(view, pv, t, b, waiting, per_rank, weighed, regroup)
        if weighed:
            self._memo.pop(t.task_id, None)
        else:
            self._memo[t.task_id] = (key, list(out))
        return out

    def _find_tail_actions(self, view: View, pv: PipelineView, t: RunningTask, b: Board,
                           waiting: bool, per_rank: int, weighed: list[bool],
                           regroup: bool) -> list[Migrate | Regroup]:
        live = b.rank_idx[t.task_id]
        counts = t.unfinished_per_rank
        state = self._tail_state(t, live, counts, waiting, per_rank)
        if state is None:
            return []
        consolidate, keep, drained = state
        if consolidate:
            weighed.append(True)
            left = {r: counts[r] for r in live}
            busy = sorted((r for r in live if left[r] > 0), key=lambda r: -left[r])
            if self._worth_moving(view, pv, t, busy, keep):
                return pack(busy, left, keep, per_rank, t.task_id, live)
        if regroup and not waiting:
            weighed.append(True)  # reads the clock, contexts and the other pipelines
            act = self.regroup.plan(view, pv, t, live, self.params.tail_requests,
                                    self.residency.kv_mem)
            if act is not None:
                return [act]
            if drained and self.regroup.hold(view, t):
                return []
        if drained:  # release idle ranks (no cost: nothing moves) onto the fullest rank
            return [Migrate(t.task_id, drained, max(live, key=lambda r: counts[r]))]
        return []

    def _worth_moving(self, view: View, pv: PipelineView, t: RunningTask, busy: list[int],
                      keep: int) -> bool:
        """Migrate only when the time it saves the waiting compute stage (running alone on the
        freed devices instead of shared beside decodes) exceeds what it costs the tail: the
        re-prefill of the moved context plus slower iterations, since the tail's KV reads now
        go through fewer devices' bandwidth (belief cost model)."""
        cost, m, tp = view.cost, pv.model, pv.spec.rollout_tp
        n = len(view.devices)
        freed = n - keep * tp
        beside = compute_split(view, pv, 1, self.params.dynamic_shares)[0]
        shared = 1.0 / cost.slowdown(Stage.ACTOR_UPDATE, beside, model=m)
        if freed / n <= shared:
            return False
        ctx = t.ctx_tokens_per_rank
        left = t.unfinished_per_rank
        if not ctx:
            return False
        total_req = sum(left[r] for r in busy)
        total_ctx = sum(ctx[r] for r in busy)
        worst = max(busy, key=lambda r: ctx[r])
        before = cost.decode_iter_time_s(m, tp, max(1, left[worst]), max(1, ctx[worst]))
        after = cost.decode_iter_time_s(m, tp, max(1, math.ceil(total_req / keep)),
                                        max(1, math.ceil(total_ctx / keep)))
        moved = sum(ctx[r] for r in busy[keep:])
        prefill = cost.prefill_time_s(m, tp, max(1, moved), 0, 1.0,
                                      num_seqs=max(1, sum(left[r] for r in busy[keep:])))
        pred = self.predictions.get(pv.name, t.step)
        remaining = max(0.0, pred.gen_s - (view.now_s - t.start_s)) if pred else 0.0
        extra = remaining * max(0.0, after / before - 1.0) + prefill
        gain = max((self._compute_gain(view, other, freed / n, shared)
                    for other in view.pipelines if other.name != pv.name), default=0.0)
        return gain > extra

    def _compute_gain(self, view: View, pv: PipelineView, alone: float, shared: float) -> float:
        """Seconds a ready compute stage of ``pv`` saves on freed devices vs shared ones."""
        ready = [stage for _, stage in pv.ready() if stage in MODEL_PASSES]
        pred = self.predictions.get(pv.name, pv.steps_completed)
        if not ready or pred is None:
            return 0.0
        work = sum(pred.stages_s.get(s, 0.0) for s in MODEL_PASSES)
        return work / shared - work / alone
