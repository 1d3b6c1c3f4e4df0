"""The simulated executor: runs the policy's tasks on a virtual cluster with an event clock.

It owns the *truth*: request lengths sampled per step (seeded) and a cost model with seeded noise.
The driver and the policy never see either; they get :mod:`jigsawrl.driver.protocol`
notifications (task done with observed token counts, rank progress) and the executor writes
metric records (:mod:`jigsawrl.events`).

Rollouts run as :class:`~jigsawrl.sim.rollout.RolloutInstance` objects (one per DP rank); other
stages are *compute works* whose remaining work is tracked in full-share seconds and progresses at
``1 / slowdown(stage, share)`` — so a share change mid-run reschedules the completion exactly.
Consecutive segments of the same sub-stage and share on one rank merge into one span, which keeps
traces small without losing band changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from jigsawrl.driver.protocol import Notification, RankProgress, TaskDone
from jigsawrl.events import Event, SampleFinished, Span
from jigsawrl.scheduler.base import (
    ROLLOUT,
    Interrupt,
    Migrate,
    SetShare,
    StartRollout,
    StartStage,
    task_id,
)
from jigsawrl.sim.kernel import PRIO_ARRIVAL, PRIO_FINISH, PRIO_WAKE, Entry, EventQueue
from jigsawrl.sim.rollout import ReqRun, RolloutInstance, Segment
from jigsawrl.workload.experiment import Experiment, ResolvedPipeline
from jigsawrl.workload.requests import RequestTruth

log = logging.getLogger(__name__)

# Memory-bandwidth demand of a running compute-bound stage (log-prob / update) per unit of compute
# share: training kernels are compute-bound but still stream weights and activations. An
# assumption (≈ 25% of HBM bandwidth at full share) until `jigsawrl profile` measures it.
COMPUTE_BW_DEMAND = 0.25

# Accuracy of StreamRL's output-length ranker as modelled here: predicted = true × e^N(0, σ).
# σ = 0.5 keeps the rank correlation around 0.8 on our length distributions (an assumption).
RANKER_SIGMA = 0.5


@dataclass(slots=True)
class _OpenSpan:
    stage: str
    start_s: float
    share: float
    flops: float = 0.0
    tokens: int = 0


@dataclass(slots=True, eq=False)
class _Rank:
    inst: RolloutInstance
    devices: tuple[int, ...]
    share: float
    seg: Segment | None = None
    entry: Entry | None = None
    open: _OpenSpan | None = None
    last_unfinished: int = -1
    wake: Entry | None = None  # pending re-plan after tool results (one per instant)
    redirect: _Rank | None = None  # after migration: where this rank's tool results go
    kappa: float = 1.0  # memory-bandwidth contention on its devices when its segment was planned
    index: int = 0  # rank number within its rollout


@dataclass(slots=True, eq=False)
class _RolloutTask:
    tid: str
    pipe: ResolvedPipeline
    step: int
    ranks: list[_Rank]
    samples: list[ReqRun] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class _Work:
    tid: str
    pipe: ResolvedPipeline
    step: int
    stage: str
    devices: tuple[int, ...]
    share: float
    remaining_full_s: float  # work left, in seconds at share 1.0
    since_s: float  # time of the last progress update
    flops: float
    tokens: int
    total_full_s: float = 0.0
    slowdown: float = 1.0
    entry: Entry | None = None
    span_start_s: float = 0.0
    done_frac: float = 0.0


class SimulatedExecutor:
    """Event-driven executor over the truth model; see the module docstring."""

    def __init__(self, exp: Experiment, *, truth_cost: object, seed: int) -> None:
        self.exp = exp
        self.cost = truth_cost
        self.seed = seed
        self.q = EventQueue()
        self._rollouts: dict[str, _RolloutTask] = {}
        self._works: dict[str, _Work] = {}
        self._events: list[Event] = []
        self._notes: list[Notification] = []
        self._step_samples: dict[tuple[str, int], list[RequestTruth]] = {}
        # prompt + response tokens of each finished step's sequences, in batch order
        self._step_lens: dict[tuple[str, int], tuple[int, ...]] = {}
        # Memory-bandwidth demand per device: key (task id, rank) -> demand (1.0 = all of HBM).
        # Keys derive from structure (never from object ids), so runs are reproducible.
        self._demand: list[dict[tuple[str, int], float]] = [{} for _ in range(exp.num_devices)]
        self._ranks_on: list[set[tuple[str, int]]] = [set() for _ in range(exp.num_devices)]
        self._rank_by_key: dict[tuple[str, int], tuple[_RolloutTask, _Rank]] = {}
        self._touched: set[int] = set()

    # ------------------------------------------------------------------ protocol
    @property
    def now_s(self) -> float:
        return self.q.now_s

    def start(self) -> None:
        log.debug("simulated executor started (seed %d)", self.seed)

    def close(self) -> None:
        pass

    def busy(self) -> bool:
        return bool(self._rollouts or self._works)

    def drain_events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def launch(self, action: StartRollout | StartStage) -> None:
        if isinstance(action, StartRollout):
            self._launch_rollout(action)
        else:
            self._launch_work(action)
        self._refresh()

    def set_share(self, action: SetShare) -> None:
        if action.task_id in self._works:
            self._rescale_work(self._works[action.task_id], action.share)
        elif action.task_id in self._rollouts:
            task = self._rollouts[action.task_id]
            ranks = task.ranks if action.rank is None else [task.ranks[action.rank]]
            for rank in ranks:
                if rank.redirect is None:
                    self._rescale_rank(task, rank, action.share)
        else:
            raise KeyError(f"set_share: no running task {action.task_id!r}")
        self._refresh()

    def migrate(self, action: Migrate) -> None:
        """Move the unfinished requests of ``src_ranks`` onto ``dst_rank`` (re-prefill there)."""
        task = self._rollouts[action.task_id]
        dst = task.ranks[action.dst_rank]
        moved = 0
        for i in action.src_ranks:
            src = task.ranks[i]
            runs = self._drain_rank(task, src)
            src.redirect = dst
            dst.inst.tool_waiting += src.inst.tool_waiting
            src.inst.tool_waiting = 0
            dst.inst.add_runs(runs)
            moved += len(runs)
            self._plan_rank(task, src)  # closes its span, reports 0 unfinished
        log.debug("%s: migrated %d requests from %s to %d", task.tid, moved, action.src_ranks,
                  action.dst_rank)
        self._replan(task, dst)
        self._refresh()

    def interrupt(self, action: Interrupt) -> None:
        """Abort and resume in place every in-flight request of a rollout (AReaL on new weights)."""
        task = self._rollouts[action.task_id]
        for rank in task.ranks:
            if rank.redirect is None:
                rank.inst.add_runs(self._drain_rank(task, rank))
                self._replan(task, rank)

    def _drain_rank(self, task: _RolloutTask, rank: _Rank) -> list[ReqRun]:
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

    def _replan(self, task: _RolloutTask, rank: _Rank) -> None:
        if rank.seg is not None and rank.seg.iters:
            self._interrupt(task, rank)
        if rank.seg is None:
            self._plan_rank(task, rank)

    def advance(self) -> list[Notification]:
        handlers: dict[str, Callable[..., None]] = {
            "seg": self._on_segment_end, "tool": self._on_tool_return, "wake": self._on_wake,
            "work": self._on_work_end,
        }
        while not self._notes:
            entry = self.q.pop()
            if entry is None:
                break
            kind, *args = entry.payload
            handlers[kind](*args)
            self._refresh()
        out, self._notes = self._notes, []
        return out

    # ------------------------------------------------------------------ truth
    def step_requests(self, pipe: ResolvedPipeline, step: int) -> list[RequestTruth]:
        """The true requests of a step, sampled once from a seed derived from structure."""
        key = (pipe.spec.name, step)
        if key not in self._step_samples:
            rng = np.random.default_rng([self.seed, pipe.index, step])
            self._step_samples[key] = pipe.sampler.sample_step(
                rng, pipe.spec.name, step, pipe.spec.batch_size)
        return self._step_samples[key]

    # ------------------------------------------------------------------ rollout
    def _launch_rollout(self, a: StartRollout) -> None:
        pipe = self.exp.pipeline(a.pipeline)
        tid = task_id(a.pipeline, a.step, ROLLOUT)
        n_ranks = len(a.devices) // a.tp
        if n_ranks < 1:
            raise ValueError(f"{tid}: {len(a.devices)} devices cannot host TP={a.tp}")
        kv_tokens = self.cost.kv_budget_tokens(pipe.model, a.tp, a.kv_mem_bytes)
        chunks = self._dispatch(self.step_requests(pipe, a.step), n_ranks, a.dispatch, a.step)
        task = _RolloutTask(tid, pipe, a.step, [])
        for r in range(n_ranks):
            inst = RolloutInstance(f"{tid}/{r}", pipe.model, a.tp, self.cost,
                                   kv_budget_tokens=max(1, kv_tokens))
            inst.add(chunks[r])
            task.ranks.append(_Rank(inst, a.devices[r * a.tp:(r + 1) * a.tp], a.share, index=r))
        self._rollouts[tid] = task
        for rank in task.ranks:
            self._plan_rank(task, rank)

    def _dispatch(self, reqs: list[RequestTruth], n: int, how: str,
                  step: int) -> list[list[RequestTruth]]:
        """Split a step's batch over ``n`` ranks.

        ``contiguous``: verl's equal contiguous chunks. ``skew_aware``: StreamRL's ranker — lengths
        are *predicted* as the true length times lognormal noise (sigma
        ``RANKER_SIGMA``; an assumed accuracy, StreamRL publishes no error figure), then dealt
        longest-predicted-first to the rank with the least predicted load.
        """
        if how == "contiguous":
            return [reqs[len(reqs) * r // n: len(reqs) * (r + 1) // n] for r in range(n)]
        if how != "skew_aware":
            raise ValueError(f"unknown dispatch {how!r}")
        rng = np.random.default_rng([self.seed, 7919, step])
        pred = [r.generated_tokens * float(np.exp(rng.normal(0, RANKER_SIGMA))) for r in reqs]
        out: list[list[RequestTruth]] = [[] for _ in range(n)]
        load = [0.0] * n
        for i in sorted(range(len(reqs)), key=lambda i: -pred[i]):
            k = min(range(n), key=lambda j: (load[j], len(out[j])))
            out[k].append(reqs[i])
            load[k] += pred[i]
        return out

    def _plan_rank(self, task: _RolloutTask, rank: _Rank) -> None:
        now = self.q.now_s
        rank.kappa = self._kappa(task, rank)
        seg = rank.inst.next_segment(now, rank.share, self._decode_share(rank))
        rank.seg = seg
        self._set_demand(task, rank, self._bw(rank.share) if seg is not None else 0.0)
        if seg is not None:
            self._extend_span(task, rank, seg.kind, now, seg.share, seg.flops, seg.tokens)
            rank.entry = self.q.schedule(now + seg.duration_s, ("seg", task, rank), PRIO_FINISH)
        elif rank.inst.tool_waiting:
            self._extend_span(task, rank, "tool_wait", now, rank.share, 0.0, 0)
        else:
            self._close_span(task, rank, now)
        self._report_progress(task, rank)
        if seg is None and all(rk.inst.done for rk in task.ranks):
            self._finish_rollout(task)

    def _on_segment_end(self, task: _RolloutTask, rank: _Rank) -> None:
        seg = rank.seg
        assert seg is not None
        rank.entry, rank.seg = None, None
        self._apply_result(task, rank, rank.inst.finish_segment(seg))
        self._plan_rank(task, rank)

    def _apply_result(self, task: _RolloutTask, rank: _Rank, res: object) -> None:
        now = self.q.now_s
        for r in res.finished:
            task.samples.append(r)
            self._events.append(SampleFinished(
                task.pipe.spec.name, task.step, r.truth.sample_id, now, r.truth.prompt_tokens,
                r.truth.response_tokens, len(r.truth.turns), task.step))
        for r in res.tool_calls:
            lat = r.truth.turns[r.turn - 1].tool_latency_s
            self.q.schedule(now + lat, ("tool", task, rank, r), PRIO_ARRIVAL)

    def _on_tool_return(self, task: _RolloutTask, rank: _Rank, req: ReqRun) -> None:
        # Results arriving at the same instant are admitted together: re-plan once, after them.
        while rank.redirect is not None:  # the request's rank was migrated away
            rank = rank.redirect
        rank.inst.tool_returned(req)
        if rank.wake is None:
            rank.wake = self.q.schedule(self.q.now_s, ("wake", task, rank), PRIO_WAKE)

    def _on_wake(self, task: _RolloutTask, rank: _Rank) -> None:
        rank.wake = None
        if rank.seg is None:
            self._plan_rank(task, rank)
        elif rank.seg.iters:  # decoding: the new request joins at the next iteration
            self._interrupt(task, rank)
            self._plan_rank(task, rank)
        # during a prefill the request waits in the queue until the prefill ends

    def _interrupt(self, task: _RolloutTask, rank: _Rank) -> None:
        self.q.cancel(rank.entry)
        seg = rank.seg
        assert seg is not None
        res, ran = rank.inst.interrupt(seg, self.q.now_s)
        if rank.open is not None:  # replace the planned work of this segment by what ran
            rank.open.flops += ran.flops - seg.flops
            rank.open.tokens += ran.tokens - seg.tokens
        rank.entry, rank.seg = None, None
        self._apply_result(task, rank, res)

    def _rescale_rank(self, task: _RolloutTask, rank: _Rank, share: float) -> None:
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

    def _retime_prefill(self, task: _RolloutTask, rank: _Rank, seg: Segment,
                        share: float) -> None:
        now = self.q.now_s
        done = min(1.0, (now - seg.start_s) / seg.duration_s) if seg.duration_s > 0 else 1.0
        self.q.cancel(rank.entry)
        if rank.open is not None:  # the old span keeps only the work done so far
            rank.open.flops -= seg.flops * (1 - done)
            rank.open.tokens -= int(seg.tokens * (1 - done))
        full = self.cost.prefill_time_s(task.pipe.model, rank.inst.tp, max(1, seg.tokens),
                                        seg.ctx, share, num_seqs=max(1, seg.batch))
        rest = Segment("prefill", now, full * (1 - done), 0, seg.batch, seg.ctx,
                       int(seg.tokens * (1 - done)), seg.flops * (1 - done), share)
        rank.share, rank.seg = share, rest
        self._extend_span(task, rank, "prefill", now, share, rest.flops, rest.tokens)
        rank.entry = self.q.schedule(now + rest.duration_s, ("seg", task, rank), PRIO_FINISH)
        self._set_demand(task, rank, self._bw(share))

    def _report_progress(self, task: _RolloutTask, rank: _Rank) -> None:
        n = rank.inst.unfinished
        if n != rank.last_unfinished:
            rank.last_unfinished = n
            band = rank.seg.kind if rank.seg is not None else ("tool_wait" if n else "done")
            idx = task.ranks.index(rank)
            self._notes.append(RankProgress(task.tid, idx, n, band, self.q.now_s,
                                            rank.inst.context_tokens()))

    def _finish_rollout(self, task: _RolloutTask) -> None:
        del self._rollouts[task.tid]
        samples = sorted(task.samples, key=lambda r: r.truth.sample_id)
        prompt = tuple(r.truth.prompt_tokens for r in samples)
        resp = tuple(r.truth.response_tokens for r in samples)
        self._step_lens[(task.pipe.spec.name, task.step)] = tuple(
            p + r for p, r in zip(prompt, resp, strict=True))
        self._notes.append(TaskDone(task.tid, task.pipe.spec.name, task.step, ROLLOUT,
                                    self.q.now_s, prompt, resp))

    # ------------------------------------------------------------------ bandwidth contention
    # Co-located sub-stages share a device's HBM bandwidth. A decode at share s can use
    # bw_fraction(s) of it alone; when the demands on a device sum above 1, every decode there
    # gets its demand scaled by 1/κ (κ = summed demand), which the executor turns into a lower
    # effective share for decode segments. Compute-bound stages are assumed not to slow from it.
    def _bw(self, share: float) -> float:
        s_sat = self.cost.params.s_sat
        return min(1.0, share / s_sat)

    def _kappa(self, task: _RolloutTask, rank: _Rank) -> float:
        key = (task.tid, rank.index)
        return max((sum(self._demand[d].values()) + (0.0 if key in self._demand[d]
                                                       else self._bw(rank.share))
                    for d in rank.devices), default=1.0)

    def _decode_share(self, rank: _Rank) -> float:
        if rank.kappa <= 1.0 + 1e-9:
            return rank.share
        return min(rank.share, self.cost.params.s_sat * self._bw(rank.share) / rank.kappa)

    def _set_demand(self, task: _RolloutTask | _Work, rank: _Rank | None, demand: float) -> None:
        tid = task.tid
        key = (tid, rank.index if rank is not None else -1)
        devices = rank.devices if rank is not None else task.devices
        for d in devices:
            cur = self._demand[d].get(key, 0.0)
            if abs(cur - demand) < 1e-12:
                continue
            if demand > 0:
                self._demand[d][key] = demand
            else:
                self._demand[d].pop(key, None)
            self._touched.add(d)
        if rank is not None:
            self._rank_by_key[key] = (task, rank)
            for d in devices:
                (self._ranks_on[d].add if demand > 0 else self._ranks_on[d].discard)(key)

    def _refresh(self) -> None:
        """Re-time decodes whose devices' bandwidth contention changed (bounded passes)."""
        for _ in range(4):
            if not self._touched:
                return
            touched, self._touched = self._touched, set()
            keys = set().union(*(self._ranks_on[d] for d in touched))
            for key in sorted(keys):
                task, rank = self._rank_by_key[key]
                if task.tid not in self._rollouts or rank.seg is None or not rank.seg.iters:
                    continue
                if abs(self._kappa(task, rank) - rank.kappa) > 1e-9:
                    self._interrupt(task, rank)
                    self._plan_rank(task, rank)

    # ------------------------------------------------------------------ spans
    def _extend_span(self, task: _RolloutTask, rank: _Rank, stage: str, now: float, share: float,
                     flops: float, tokens: int) -> None:
        op = rank.open
        if op is None or op.stage != stage or op.share != share:
            self._close_span(task, rank, now)
            op = rank.open = _OpenSpan(stage, now, share)
        op.flops += flops
        op.tokens += tokens

    def _close_span(self, task: _RolloutTask, rank: _Rank, now: float) -> None:
        op = rank.open
        if op is None:
            return
        rank.open = None
        if now > op.start_s:
            self._events.append(Span(task.pipe.spec.name, task.step, op.stage,
                                     task.ranks.index(rank), rank.devices, op.start_s, now,
                                     op.share, op.flops, op.tokens))

    # ------------------------------------------------------------------ compute stages
    def _launch_work(self, a: StartStage) -> None:
        pipe = self.exp.pipeline(a.pipeline)
        tid = task_id(a.pipeline, a.step, a.stage)
        n = len(a.devices) or self.exp.num_devices  # a host stage may name no device
        full_s, flops, tokens = self._stage_cost(pipe, a.step, a.stage, n)
        full_s += self.cost.dispatch_time_s(pipe.model, a.stage, n)
        w = _Work(tid, pipe, a.step, a.stage, a.devices, a.share, full_s, self.q.now_s, flops,
                  tokens, total_full_s=full_s, span_start_s=self.q.now_s)
        self._works[tid] = w
        self._schedule_work(w)

    def _stage_cost(self, pipe: ResolvedPipeline, step: int, stage: str,
                    n: int) -> tuple[float, float, int]:
        """True full-share seconds, FLOPs and tokens of a post-rollout stage."""
        c, m = self.cost, pipe.model
        lens = self._step_lens.get((pipe.spec.name, step), ())
        tokens = sum(lens)
        if stage == "reward":
            return c.reward_time_s(len(lens)), 0.0, 0
        # the tokens the pass computes over (padding included where the trainer pads)
        computed = c.pass_tokens(lens, n, pipe.spec.train.micro_batch_size)
        if stage in ("old_logprob", "ref_logprob"):
            return c.logprob_time_s(m, n, computed), c.logprob_flops(m, tokens), tokens
        if stage == "actor_update":
            epochs = pipe.spec.train.ppo_epochs
            return (epochs * c.train_time_s(m, n, computed), epochs * c.train_flops(m, tokens),
                    tokens)
        if stage == "weight_sync":
            return c.weight_sync_time_s(m, n, pipe.spec.rollout_tp), 0.0, 0
        if stage in ("offload", "onload"):
            return c.host_transfer_time_s(c.train_state_bytes(m, n) * n, n), 0.0, 0
        raise ValueError(f"unknown stage {stage!r}")

    def _work_demand(self, w: _Work) -> float:
        return COMPUTE_BW_DEMAND * w.share if w.stage in ("old_logprob", "ref_logprob",
                                                          "actor_update") else 0.0

    def _schedule_work(self, w: _Work) -> None:
        self._set_demand(w, None, self._work_demand(w))
        w.slowdown = (1.0 if w.share <= 0 else
                      self.cost.slowdown(w.stage, w.share, model=w.pipe.model))
        w.since_s = self.q.now_s
        w.entry = self.q.schedule(self.q.now_s + w.remaining_full_s * w.slowdown,
                                  ("work", w), PRIO_FINISH)

    def _progress_work(self, w: _Work) -> None:
        now = self.q.now_s
        w.remaining_full_s = max(0.0, w.remaining_full_s - (now - w.since_s) / w.slowdown)
        w.since_s = now

    def _rescale_work(self, w: _Work, share: float) -> None:
        self.q.cancel(w.entry)
        self._progress_work(w)
        self._emit_work_span(w, self.q.now_s)
        w.share = share
        self._schedule_work(w)

    def _emit_work_span(self, w: _Work, end_s: float) -> None:
        total = w.total_full_s
        frac = 1.0 if total <= 0 else 1.0 - w.remaining_full_s / total
        part = frac - w.done_frac
        w.done_frac = frac
        if end_s > w.span_start_s:
            self._events.append(Span(w.pipe.spec.name, w.step, w.stage, 0, w.devices,
                                     w.span_start_s, end_s, w.share, w.flops * part,
                                     int(w.tokens * part)))
        w.span_start_s = end_s

    def _on_work_end(self, w: _Work) -> None:
        w.remaining_full_s = 0.0
        self._emit_work_span(w, self.q.now_s)
        del self._works[w.tid]
        self._set_demand(w, None, 0.0)
        self._notes.append(TaskDone(w.tid, w.pipe.spec.name, w.step, w.stage, self.q.now_s))
