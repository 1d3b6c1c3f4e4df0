"""Faster tails for ``jigsaw``: re-form a rollout's last requests on one wider TP group (issue 11,
item 4; the action is :class:`~jigsawrl.scheduler.base.Regroup`).

A decode iteration of a short tail is bound by reading the weights, so a rank at TP 1 with two
requests left is barely faster than with thirty; a TP group of four devices reads a quarter of
the weights per device. When a rollout's unfinished requests are few, its drained ranks are held
(only while no other stage is ready to take them) and, at the moment a rank drains, the tail is
weighed: the seconds a wider group saves over the rest of the tail against twice the re-prefill
of every moved context and the new engine's wake-up (a weight sync onto the group, as the
simulator charges it), all with the belief cost model. Once a rollout regrouped it is left
alone.

What is known of the rest of the tail is only this step's context per rank (prompt plus what was
generated) and the lengths of finished steps: the remaining tokens of the last of ``k``
unfinished requests are estimated as the ``k / (k + 1)`` quantile of what the last finished
step's lengths (the task preset's prior before one) leave beyond the mean generated so far — the
expected longest of ``k`` draws given they got this far (half of what the cap leaves once the tail
outgrew everything seen). A heuristic, stated as one: no sampled length is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.graph.build import rank_segments
from jigsawrl.scheduler.base import PipelineView, Regroup, RunningTask, View
from jigsawrl.scheduler.batch_replay import NewInstance, RanksReplay, plain_s
from jigsawrl.scheduler.verl_placements import prior_requests
from jigsawrl.sim.rollout import ReqRun, RolloutInstance, engine_limits
from jigsawrl.workload.requests import RequestTruth
from jigsawrl.workload.task_presets import TASKS

# The predicted gain must be this many times the regroup's cost: the tokens left are a rough
# estimate (a 0.6B model's short tails, where the gain is small beside the wake-up, measured
# slower regrouped at a factor of 1 in tests/scheduler/test_jigsaw_regroup.py's setting).
GAIN_OVER_COST = 2.0


def widest_tp(n_devices: int, num_heads: int) -> int:
    """The largest power of two at most ``n_devices`` that divides the heads (1 at least)."""
    tp = 1
    while tp * 2 <= n_devices and num_heads % (tp * 2) == 0:
        tp *= 2
    return tp


def tail_fits(cost: CostModelProtocol, pv: PipelineView, tp: int, kv_mem: float) -> int:
    """Requests a TP-``tp`` group holds without preemption, each grown to the response cap."""
    task = TASKS.get(pv.spec.task)
    prompt = int(task.prompt_mean) if task else 128
    return cost.kv_budget_tokens(pv.model, tp, max(kv_mem, 1.0)) // (
        pv.spec.max_response_tokens + prompt + 1)


def replay_s(cost: CostModelProtocol, pv: PipelineView, chunks: list[list[RequestTruth]],
             instance: NewInstance, group_tp: int, kv_mem: float, tail_requests: int) -> float:
    """When a rollout of these ranks (each with its chunk of the batch) ends, its tail
    regrouped on one TP-``group_tp`` group if that ends sooner: the forecast's view of
    :class:`TailRegroup`. The group forms at the first moment a rank drains with the ranks'
    unfinished requests together fitting it and the ranks still busy holding no more devices
    than it (as :meth:`TailRegroup.plan` asks); each busy rank hands over its unfinished
    requests then (a decode in flight cut there; a prefill or a tool call out finishes first),
    the group starts after the last of them and its wake-up (a weight sync onto it) and
    re-prefills every moved context; the drained ranks ended as they would have."""
    tp = pv.spec.rollout_tp
    if group_tp <= tp:
        return plain_s(chunks, instance)
    counts: list[list[tuple[float, int]]] = []  # per rank: (time, unfinished) after a segment
    plain = 0.0
    for r, chunk in enumerate(chunks):
        inst = instance(str(r))
        inst.add(chunk)
        seen = [(0.0, inst.unfinished)]
        segs = rank_segments(inst, stop=_recorder(seen))
        end = segs[-1][2] if segs else 0.0
        seen.append((end, 0))
        counts.append(seen)
        plain = max(plain, end)
    limit = min(tail_requests, tail_fits(cost, pv, group_tp, kv_mem))
    at = _regroup_time(counts, limit, group_tp // tp)
    if at is None or at >= plain:
        return plain
    runs: list[ReqRun] = []
    handed = at
    for r, (chunk, seen) in enumerate(zip(chunks, counts, strict=True)):
        if _unfinished_at(seen, at) == 0:
            continue
        rank = instance(f"{r}/again")  # replayed afresh up to the regroup (cheaper than a copy)
        rank.add(chunk)
        segs = rank_segments(rank, until=at)
        t = max(at, segs[-1][2]) if segs else at
        handed = max(handed, t)
        runs += rank.export_unfinished(None, t)[1]
    group = RolloutInstance(f"{pv.name}/regroup", pv.model, group_tp, cost, **engine_limits(
        cost, pv.spec, cost.kv_budget_tokens(pv.model, group_tp, max(kv_mem, 1.0))))
    group.add_runs(runs)
    start = handed + cost.weight_sync_time_s(pv.model, group_tp, group_tp)
    regs = rank_segments(group, t0=start)
    return min(plain, regs[-1][2] if regs else start)


def _recorder(seen: list[tuple[float, int]]) -> Callable[[float, RolloutInstance], bool]:
    """A ``stop`` for :func:`rank_segments` that records the unfinished count after each
    segment and never stops."""
    def stop(t: float, inst: RolloutInstance) -> bool:
        seen.append((t, inst.unfinished))
        return False
    return stop


def _unfinished_at(seen: list[tuple[float, int]], t: float) -> int:
    """A rank's unfinished requests at time ``t`` (its last count reported by then)."""
    n = seen[0][1]
    for at, count in seen:
        if at > t:
            break
        n = count
    return n


def _regroup_time(counts: list[list[tuple[float, int]]], limit: int,
                  max_busy: int) -> float | None:
    """The first moment a rank drains (when the policy weighs a regroup: its drained ranks are
    held for it) with the ranks' unfinished requests together at most ``limit`` and at most
    ``max_busy`` ranks busy (None: never before the last rank ends)."""
    now = [seen[0][1] for seen in counts]
    changes = sorted((t, r, n) for r, seen in enumerate(counts) for t, n in seen[1:])
    for t, r, n in changes:
        now[r] = n
        busy = sum(1 for c in now if c > 0)
        if n == 0 and 0 < sum(now) <= limit and busy <= max_busy:
            return t
    return None


def regroup_replay(cost: CostModelProtocol, tail_requests: int,
                   group: Callable[[PipelineView, int], int]) -> RanksReplay:
    """:func:`replay_s` as a rollout's ranks replay, on the TP ``group(pipeline, ranks)``."""
    def replay(pv: PipelineView, chunks: list[list[RequestTruth]], instance: NewInstance,
               kv_mem: float) -> float:
        return replay_s(cost, pv, chunks, instance, group(pv, len(chunks)), kv_mem,
                        tail_requests)
    return replay


def placed_replay(view: View, tail_requests: int) -> RanksReplay:
    """How a verl job's rollout is timed when jigsaw runs the placement and regroups its tails
    (:func:`~.tail.TailMigration.regroup_placed`): :func:`replay_s` on the widest TP group the
    job's ranks reach within one node."""
    per_node = view.accelerators_per_node
    replay = regroup_replay(view.cost, tail_requests, lambda pv, ranks: widest_tp(
        min(ranks * pv.spec.rollout_tp, per_node), pv.model.num_heads))
    replay.key = ("regroup", per_node, tail_requests)  # type: ignore[attr-defined]
    return replay


class TailRegroup:
    """Which rollouts to regroup, and which drained ranks to hold for it (module docstring)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.can = False  # the last view's executor runs Regroup
        self._done: set[str] = set()  # rollouts that regrouped
        self._busy_seen: dict[str, int] = {}  # busy ranks when a decision last saw the rollout
        # pipeline -> (the step they come from, -1: the prior; lengths seen, sorted)
        self._lengths: dict[str, tuple[int, list[int]]] = {}
        self.count = 0

    def active(self, view: View) -> bool:
        self.can = view.can_regroup
        return self.enabled and self.can

    def hold(self, view: View, t: RunningTask) -> bool:
        """Keep the rollout's drained ranks for a later regroup: nothing else is ready to start
        (a ready stage would take them) and it has not regrouped yet."""
        if t.task_id in self._done:
            return False
        return not any(pv.ready() for pv in view.pipelines)

    def wakes(self, t: RunningTask, counts: Sequence[int], live: Sequence[int]) -> bool:
        """A held rollout wakes the policy only when one more of its ranks drained."""
        if not (self.enabled and self.can) or t.task_id in self._done:
            return False
        busy = sum(1 for r in live if counts[r] != 0)  # a rank not reported yet is busy
        return busy < self._busy_seen.get(t.task_id, len(live) + 1)

    def holding(self, t: RunningTask) -> bool:
        """Whether the last decision kept this rollout's drained ranks for a regroup."""
        return self.enabled and self.can and t.task_id in self._busy_seen and \
            t.task_id not in self._done

    def plan(self, view: View, pv: PipelineView, t: RunningTask, live: Sequence[int],
             tail_requests: int, kv_mem: float) -> Regroup | None:
        """The regroup of ``t``'s live ranks, when the belief cost model says the tail ends
        sooner for it (module docstring); None otherwise."""
        counts, ctx = t.unfinished_per_rank, t.ctx_tokens_per_rank
        busy = [r for r in live if counts[r] > 0]
        self._busy_seen[t.task_id] = len(busy)
        if not busy or not ctx or t.task_id in self._done:
            return None
        per = view.accelerators_per_node
        node = t.rank_devices[busy[0]][0] // per
        if any(d // per != node for r in busy for d in t.rank_devices[r]):
            return None  # a TP group stays within a node
        ranks = [r for r in live if t.rank_devices[r][0] // per == node]
        tp_old = max(len(t.rank_devices[r]) for r in busy)
        tp = widest_tp(sum(len(t.rank_devices[r]) for r in ranks), pv.model.num_heads)
        if tp <= tp_old or sum(len(t.rank_devices[r]) for r in busy) > tp:
            return None
        total = sum(counts[r] for r in busy)
        total_ctx = sum(ctx[r] for r in busy)
        task = TASKS.get(pv.spec.task)
        prompt = task.prompt_mean if task else 128.0
        if total > min(tail_requests, tail_fits(view.cost, pv, tp, kv_mem)):
            return None
        if self._saved_s(view, pv, t, busy, tp, total, total_ctx, prompt) <= 0:
            return None
        # the busy ranks first, then drained ones, until the group is full
        chosen: list[int] = []
        n = 0
        for r in sorted(ranks, key=lambda r: (-counts[r], r)):
            if n + len(t.rank_devices[r]) <= tp:
                chosen.append(r)
                n += len(t.rank_devices[r])
        if n != tp:
            return None
        self._done.add(t.task_id)
        self.count += 1
        return Regroup(t.task_id, tuple(chosen[1:]), chosen[0])

    def _saved_s(self, view: View, pv: PipelineView, t: RunningTask, busy: list[int], tp: int,
                 total: int, total_ctx: int, prompt: float) -> float:
        """Seconds the regroup is predicted to take off the tail (negative: it costs)."""
        cost, m = view.cost, pv.model
        counts, ctx = t.unfinished_per_rank, t.ctx_tokens_per_rank
        before = max(cost.decode_iter_time_s(m, len(t.rank_devices[r]), counts[r],
                                             max(1, ctx[r])) for r in busy)
        after = cost.decode_iter_time_s(m, tp, total, max(1, total_ctx))
        generated = max(0.0, total_ctx / total - prompt)
        left = self._tokens_left(pv, generated, total)
        prefill = cost.prefill_time_s(m, tp, max(1, total_ctx), 0, 1.0, num_seqs=total)
        wake = cost.weight_sync_time_s(m, tp, tp)
        return left * (before - after) - GAIN_OVER_COST * (prefill + wake)

    def _tokens_left(self, pv: PipelineView, generated: float, count: int) -> float:
        """Tokens the last of ``count`` unfinished requests, each ``generated`` tokens in, still
        has to generate: the ``count / (count + 1)`` quantile of what the lengths seen so far
        (the last finished step, or the task preset's prior before one) leave beyond
        ``generated`` — the expected longest of ``count`` draws, given they got this far."""
        lengths = self._lengths.get(pv.name)
        src = pv.history[-1].step if pv.history else -1
        if lengths is None or lengths[0] != src:
            seen = (pv.history[-1].response_tokens if pv.history else
                    tuple(r.generated_tokens for r in prior_requests(pv)))
            lengths = self._lengths[pv.name] = (src, sorted(seen))
        longer = [n - generated for n in lengths[1] if n > generated]
        if not longer:  # longer than anything seen: half of what the cap leaves
            return max(0.0, pv.spec.max_response_tokens - generated) / 2
        return longer[int(count / (count + 1) * (len(longer) - 1))]

    def forget(self, live_tasks: set[str]) -> None:
        """Drop what is kept of rollouts that finished."""
        self._done &= live_tasks
        for tid in [k for k in self._busy_seen if k not in live_tasks]:
            del self._busy_seen[tid]
