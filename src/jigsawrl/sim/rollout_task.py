"""The rollout-task runtime: a step's rollout as one :class:`~.rollout.RolloutInstance` per rank,
on the event clock.

Each rank runs *segments* (a prefill, a decode run at a constant batch) planned by its instance;
the runtime schedules each segment's end, sends tool calls out and back (a tool result wakes its
rank once per instant), re-plans a decode when its share or its devices' bandwidth contention
(:mod:`.contention`) changes, and moves a rank's unfinished requests to another rank
(migration: abort, then re-prefill there) or back into its own queue (interruption); re-forms
ranks into a wider TP group (:mod:`.rollout_regroup`) or grows the rollout onto new ranks
(:mod:`.rollout_spread`).

Consecutive segments of the same sub-stage and share on one rank merge into one span, which keeps
traces small without losing band changes. A rank reports its unfinished count whenever it changes
(:meth:`~.listener.SimListener.rank_progress`); the rollout reports done when every rank drained.
"""

from __future__ import annotations

import logging

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.events import Event, SampleFinished, Span
from jigsawrl.sim.batching import Finished, FirstBatches, GroupTracker
from jigsawrl.sim.contention import BandwidthContention
from jigsawrl.sim.gates import DeviceGates
from jigsawrl.sim.hostload import HostLoad
from jigsawrl.sim.kernel import PRIO_ARRIVAL, PRIO_FINISH, PRIO_WAKE, EventQueue
from jigsawrl.sim.listener import SimListener
from jigsawrl.sim.rollout import ReqRun, RolloutInstance, Segment, SegmentResult, engine_limits
from jigsawrl.sim.rollout_calls import WorkerCallsMixin
from jigsawrl.sim.rollout_first_b import FirstBatchMixin
from jigsawrl.sim.rollout_gates import GatedRanksMixin
from jigsawrl.sim.rollout_regroup import RegroupMixin
from jigsawrl.sim.rollout_spread import SpreadMixin
from jigsawrl.sim.rollout_state import DONE_BAND, OpenSpan, RankRun, RolloutTask
from jigsawrl.sim.stream import StreamRuntime
from jigsawrl.stages import Stage
from jigsawrl.workload.experiment import ResolvedPipeline
from jigsawrl.workload.requests import RequestTruth

log = logging.getLogger(__name__)

__all__ = ["DONE_BAND", "RolloutRuntime"]


# GatedRanksMixin comes first: it defines _ungate, which FirstBatchMixin uses.
class RolloutRuntime(GatedRanksMixin, FirstBatchMixin, WorkerCallsMixin, RegroupMixin,
                     SpreadMixin):
    """Runs rollout tasks on the event queue (see the module docstring).

    Args:
        q: the event queue (its payloads here are ``(handler, *args)``).
        cost: the truth cost model.
        contention: the pool's bandwidth contention (shared with compute works).
        events: where metric records go (shared with compute works).
        listener: where rank progress and finished rollouts are reported.
        streams: the streaming trainers of rollouts started with stream devices.
        gates, host: devices that run one call at a time (:mod:`.gates`; None: shares), where
            ranks run in slices (:mod:`.rollout_gates`) at the host's load (:mod:`.hostload`).
    """

    def __init__(self, q: EventQueue, cost: CostModelProtocol, contention: BandwidthContention,
                 events: list[Event], listener: SimListener, streams: StreamRuntime,
                 gates: DeviceGates | None = None, host: HostLoad | None = None) -> None:
        self.q = q
        self.gates = gates
        self._init_calls(cost, host)  # a rank's worker calls, their host (rollout_calls.py)
        self.cost = cost
        self.contention = contention
        self.events = events
        self.listener = listener
        self.streams = streams
        self.tasks: dict[str, RolloutTask] = {}
        self.first_batches: dict[str, FirstBatches] = {}  # per pipeline (first-B rollouts)
        self._parked: dict[str, list[RolloutTask]] = {}  # cut first-B rollouts with leftovers
        self._cut_due: set[str] = set()
        # prompt + response tokens of each finished step's sequences, in batch order
        self.step_lens: dict[tuple[str, int], tuple[int, ...]] = {}
        self.step_prompts: dict[tuple[str, int], tuple[int, ...]] = {}  # their prompt tokens

    # ------------------------------------------------------------------ actions
    def start(self, tid: str, pipe: ResolvedPipeline, step: int, devices: tuple[int, ...],
              tp: int, share: float, kv_mem_bytes: float,
              chunks: list[list[RequestTruth]], *, first_b: bool = False,
              stream_devices: tuple[int, ...] = (), tail_logprobs: bool = False) -> None:
        """Start a rollout whose rank ``r`` runs ``chunks[r]`` on ``devices[r*tp:(r+1)*tp]``.

        ``first_b``: AReaL's first-B batches (:mod:`.batching`). ``stream_devices``: StreamRL's
        streaming of finished groups into a trainer on those devices (:mod:`.stream`), or
        with ``tail_logprobs`` their log-probs on the rollout's drained devices (tail mode)."""
        kv_tokens = self.cost.kv_budget_tokens(pipe.model, tp, kv_mem_bytes)
        task = RolloutTask(tid, pipe, step, [], first_b=first_b, kv_mem_bytes=kv_mem_bytes, tp=tp)
        for r, chunk in enumerate(chunks):
            inst = RolloutInstance(f"{tid}/{r}", pipe.model, tp, self.cost,
                                   **engine_limits(self.cost, pipe.spec, kv_tokens))
            inst.add(chunk)
            task.ranks.append(RankRun(inst, devices[r * tp:(r + 1) * tp], share, index=r,
                                      owner=task, setup_due=self.setup_s > 0))
        reqs = [t for chunk in chunks for t in chunk]
        if stream_devices or tail_logprobs:
            task.groups = GroupTracker(reqs)
            self.streams.open(tid, pipe, step, stream_devices or devices,
                              tail=not stream_devices)
        self.tasks[tid] = task
        for rank in task.ranks:
            self._plan_rank(task, rank)
        if first_b:
            self._first_b_started(task, reqs)

    def set_share(self, tid: str, share: float, rank: int | None) -> None:
        """New compute share for one rank of ``tid`` (``None``: every rank still running)."""
        task = self.tasks[tid]
        ranks = task.ranks if rank is None else [task.ranks[rank]]
        for rk in ranks:
            if rk.redirect is None:
                self._rescale_rank(task, rk, share)

    # ------------------------------------------------------------------ actions
    def migrate(self, tid: str, src_ranks: tuple[int, ...], dst_rank: int) -> None:
        """Move the unfinished requests of ``src_ranks`` onto ``dst_rank`` (re-prefill there)."""
        task = self.tasks[tid]
        dst = task.ranks[dst_rank]
        moved = 0
        for i in src_ranks:
            src = task.ranks[i]
            runs = self._drain_rank(task, src)
            src.redirect = dst
            dst.inst.tool_waiting += src.inst.tool_waiting
            src.inst.tool_waiting = 0
            dst.inst.add_runs(runs)
            moved += len(runs)
            self._plan_rank(task, src)  # closes its span, reports 0 unfinished
        log.debug("%s: migrated %d requests from %s to %d", task.tid, moved, src_ranks, dst_rank)
        self._replan(task, dst)

    def interrupt(self, tid: str) -> None:
        """Abort and resume in place every in-flight request of a rollout (AReaL on new weights)."""
        task = self.tasks[tid]
        for rank in task.ranks:
            if rank.redirect is None:
                rank.inst.add_runs(self._drain_rank(task, rank))
                self._replan(task, rank)

    def refresh(self) -> None:
        """Re-time decodes whose devices' bandwidth contention changed (bounded passes)."""
        for _ in range(4):
            keys = self.contention.take_touched()
            if keys is None:
                return
            for key in keys:
                task, rank = self.contention.owner(key)
                if task.tid not in self.tasks or rank.seg is None or not rank.seg.iters:
                    continue
                if abs(self._kappa(task, rank) - rank.kappa) > 1e-9:
                    self._interrupt(task, rank)
                    self._plan_rank(task, rank)

    # ------------------------------------------------------------------ planning
    def _kappa(self, task: RolloutTask, rank: RankRun) -> float:
        return self.contention.kappa((task.tid, rank.index), rank.devices, self._rate(rank))

    def _set_demand(self, task: RolloutTask, rank: RankRun, demand: float) -> None:
        self.contention.set_demand((task.tid, rank.index), rank.devices, demand,
                                   owner=(task, rank))

    def _plan_rank(self, task: RolloutTask, rank: RankRun) -> None:
        if self.gates is not None and not self._gated(task, rank):
            return  # waits for its device (sim/rollout_gates.py)
        now = self.q.now_s
        rank.kappa = self._kappa(task, rank)
        rate = self._rate(rank)
        seg = rank.inst.next_segment(now, rate, self.contention.decode_share(rate, rank.kappa))
        if seg is not None:
            seg = self._host_timed(rank, self._with_call_waits(rank, seg, rate))
        rank.seg = seg
        self._set_demand(task, rank, self.contention.bw(rate) if seg is not None else 0.0)
        if seg is None:
            self._ungate(task, rank)
        if seg is not None:
            self._extend_span(task, rank, seg.kind, now, seg.share, seg.flops, seg.tokens)
            rank.entry = self.q.schedule(now + seg.duration_s,
                                         (self._on_segment_end, task, rank), PRIO_FINISH)
        elif rank.inst.tool_waiting:
            self._note_idle(rank)
            self._extend_span(task, rank, Stage.TOOL_WAIT, now, rank.share, 0.0, 0)
        else:
            self._close_span(task, rank, now)
        self._report_progress(task, rank)
        if seg is None and not task.first_b and all(rk.inst.done for rk in task.ranks):
            self._finish(task)

    def _replan(self, task: RolloutTask, rank: RankRun) -> None:
        if rank.seg is not None and rank.seg.iters:
            self._interrupt(task, rank)
        if rank.seg is None:
            self._plan_rank(task, rank)

    def _drain_rank(self, task: RolloutTask, rank: RankRun) -> list[ReqRun]:
        """Take every queued/running request off a rank (a cut prefill's rest is not counted)."""
        seg = rank.seg
        if seg is not None and seg.iters:
            self._interrupt(task, rank)
        elif seg is not None:  # a prefill cut short: count only the elapsed part as work
            self.q.cancel(rank.entry)
            frac = min(1.0, (self.q.now_s - seg.start_s) / seg.duration_s) if seg.duration_s else 1
            if rank.open is not None:
                rank.open.flops -= seg.flops * (1 - frac)
                rank.open.tokens -= int(seg.tokens * (1 - frac))
            rank.seg, rank.entry = None, None
        _, runs = rank.inst.export_unfinished(None, self.q.now_s)
        return runs

    def _interrupt(self, task: RolloutTask, rank: RankRun) -> None:
        self.q.cancel(rank.entry)
        seg = rank.seg
        assert seg is not None
        res, ran = rank.inst.interrupt(seg, self.q.now_s)
        if rank.open is not None:  # replace the planned work of this segment by what ran
            rank.open.flops += ran.flops - seg.flops
            rank.open.tokens += ran.tokens - seg.tokens
        rank.entry, rank.seg = None, None
        self._apply_result(task, rank, res)

    def _rescale_rank(self, task: RolloutTask, rank: RankRun, share: float) -> None:
        if self.gates is not None:  # a gated rank runs at the whole device whatever its share
            rank.share = share
            return
        seg = rank.seg
        if seg is not None and seg.iters:
            self._interrupt(task, rank)
            rank.share = share
            self._plan_rank(task, rank)
        elif seg is not None:  # a prefill: re-time its rest at the new share from now on
            self._retime_prefill(task, rank, seg, share)
        else:  # idle (tool wait): the new share holds from now, in a new span
            rank.share = share
            if rank.open is not None:
                self._extend_span(task, rank, rank.open.stage, self.q.now_s, share, 0.0, 0)
            self._set_demand(task, rank, 0.0)

    def _retime_prefill(self, task: RolloutTask, rank: RankRun, seg: Segment,
                        share: float) -> None:
        now = self.q.now_s
        done = min(1.0, (now - seg.start_s) / seg.duration_s) if seg.duration_s > 0 else 1.0
        self.q.cancel(rank.entry)
        if rank.open is not None:  # the old span keeps only the work done so far
            rank.open.flops -= seg.flops * (1 - done)
            rank.open.tokens -= int(seg.tokens * (1 - done))
        full = self.cost.prefill_time_s(task.pipe.model, rank.inst.tp, max(1, seg.tokens),
                                        seg.ctx, share, num_seqs=max(1, seg.batch))
        rest = Segment(Stage.PREFILL, now, full * (1 - done), 0, seg.batch, seg.ctx,
                       int(seg.tokens * (1 - done)), seg.flops * (1 - done), share)
        rank.share, rank.seg = share, rest
        self._extend_span(task, rank, Stage.PREFILL, now, share, rest.flops, rest.tokens)
        rank.entry = self.q.schedule(now + rest.duration_s, (self._on_segment_end, task, rank),
                                     PRIO_FINISH)
        self._set_demand(task, rank, self.contention.bw(share))

    # ------------------------------------------------------------------ events
    def _on_segment_end(self, task: RolloutTask, rank: RankRun) -> None:
        seg = rank.seg
        assert seg is not None
        rank.entry, rank.seg = None, None
        self._apply_result(task, rank, rank.inst.finish_segment(seg))
        self._plan_rank(task, rank)

    def _apply_result(self, task: RolloutTask, rank: RankRun, res: SegmentResult) -> None:
        now = self.q.now_s
        for r in res.finished:
            if task.first_b:
                self._first_b_finished(task, Finished(r.truth, now, task.step))
                continue
            task.samples.append(r)
            self.events.append(SampleFinished(
                task.pipe.spec.name, task.step, r.truth.sample_id, now, r.truth.prompt_tokens,
                r.truth.response_tokens, len(r.truth.turns), task.step))
            group = task.groups.add(Finished(r.truth, now, task.step)) if task.groups else None
            if group is not None:
                self.streams.group_finished(task.tid, group)
        for r in res.tool_calls:
            lat = r.truth.turns[r.turn - 1].tool_latency_s
            self.q.schedule(now + lat, (self._on_tool_return, task, rank, r), PRIO_ARRIVAL)

    def _on_tool_return(self, task: RolloutTask, rank: RankRun, req: ReqRun) -> None:
        # Results arriving at the same instant are admitted together: re-plan once, after them.
        while rank.redirect is not None:  # the request's rank was migrated away
            rank = rank.redirect
        task = rank.owner or task
        rank.inst.tool_returned(req)
        if rank.wake is None and not task.closed:
            rank.wake = self.q.schedule(self.q.now_s, (self._on_wake, task, rank), PRIO_WAKE)

    def _on_wake(self, task: RolloutTask, rank: RankRun) -> None:
        rank.wake = None
        if task.closed:  # a cut first-B rollout: the request waits for the next one
            return
        if rank.seg is None:
            self._plan_rank(task, rank)
        elif rank.seg.iters:  # decoding: the new request joins at the next iteration
            self._interrupt(task, rank)
            self._plan_rank(task, rank)
        # during a prefill the request waits in the queue until the prefill ends

    def _report_progress(self, task: RolloutTask, rank: RankRun) -> None:
        n = rank.inst.unfinished
        if n != rank.last_unfinished:
            rank.last_unfinished = n
            band = rank.seg.kind if rank.seg is not None else (Stage.TOOL_WAIT if n else DONE_BAND)
            self.listener.rank_progress(task.tid, rank.index, n, band, self.q.now_s,
                                        rank.inst.context_tokens())

    def _finish(self, task: RolloutTask) -> None:
        del self.tasks[task.tid]
        self._report_done(task, sorted((r.truth for r in task.samples),
                                       key=lambda t: t.sample_id))

    def _report_done(self, task: RolloutTask, samples: list[RequestTruth]) -> None:
        """The rollout's training batch is ``samples``: keep their lengths, tell the owner."""
        self.streams.close(task.tid)
        prompt = tuple(t.prompt_tokens for t in samples)
        resp = tuple(t.response_tokens for t in samples)
        self.step_lens[(task.pipe.spec.name, task.step)] = tuple(
            p + r for p, r in zip(prompt, resp, strict=True))
        self.step_prompts[(task.pipe.spec.name, task.step)] = prompt
        self.listener.task_done(task.tid, task.pipe.spec.name, task.step, Stage.ROLLOUT,
                                self.q.now_s, prompt, resp)

    # ------------------------------------------------------------------ spans
    def _extend_span(self, task: RolloutTask, rank: RankRun, stage: str, now: float,
                     share: float, flops: float, tokens: int) -> None:
        op = rank.open
        if op is None or op.stage != stage or op.share != share:
            self._close_span(task, rank, now)
            op = rank.open = OpenSpan(stage, now, share)
        op.flops += flops
        op.tokens += tokens

    def _close_span(self, task: RolloutTask, rank: RankRun, now: float) -> None:
        op = rank.open
        if op is None:
            return
        rank.open = None
        if now > op.start_s:
            self.events.append(Span(task.pipe.spec.name, task.step, op.stage, rank.index,
                                    rank.devices, op.start_s, now, op.share, op.flops,
                                    op.tokens))
