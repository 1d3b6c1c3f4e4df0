"""One rollout engine instance (one DP worker, a TP group) doing continuous batching.

This is a pure state machine with no clock of its own, so that the simulated executor (with the
*truth* cost model and sampled lengths) and the graph builder / look-ahead (with the *belief* cost
model and predicted lengths) run the very same batching logic.

Model of the engine (vLLM-like; simplifications say so):

- Requests wait in a FIFO queue. Admission takes requests from the head while the running count is
  below ``max_num_seqs``, their KV fits the budget with room for one more iteration, and the tokens
  to prefill fit ``max_prefill_tokens``. Admitted requests are prefilled in one *prefill segment*
  (simplification: vLLM V1 mixes chunked prefill into decode iterations; here prefill runs as its
  own segment, which keeps the compute-bound prefill visible as a sub-stage).
- Decode: every running request gains one token per iteration. A *decode segment* lasts until the
  next request finishes its turn or the KV budget is full, so the batch is constant within it and
  its time is one closed-form call to the cost model.
- Shared prompts (``CostParams.rollout_shares_prompt``, the CPU engine's behaviour): a prefill
  computes each GRPO group's prompt once for the group's fresh requests it admits together (the
  engine copies the KV to the others); GPU presets charge every request's prompt.
- KV full: the most recently admitted request is preempted (freed, put back at the head of the
  queue, re-prefilled later — vLLM's recompute preemption).
- Multi-turn: a turn that ends in a tool call frees the request's KV; when the tool answers the
  request re-queues and prefills only the tool-result tokens (assumes a prefix-cache hit).
- jigsawrl's own engine (``CostParams.rollout_engine_limits``: the CPU workers and every
  profile; :func:`engine_limits` sizes the instance) works as ``engine/admission.py`` does:
  at most the pipeline's ``rollout.max_num_seqs`` requests run, its ``rollout.max_batch_tokens``
  is the KV budget, and a request paused for a tool *keeps* its cache, counted in the budget;
  when admission or a decode needs the room, paused caches are evicted (oldest pause first)
  before a running request is preempted, and an evicted request re-prefills its whole context
  when its tool answers. A returning request goes first in line (the engine puts it straight
  back into the batch). Not modelled: the engine enforces its budget every iteration and
  re-admits a preempted request as soon as evicting paused caches makes room, which cascades on
  a tight budget (docs/BENCHMARKS.md, "The engine's limits").
- Requests can be exported mid-flight (:meth:`export_unfinished`) and added to another instance,
  which re-prefills prompt + generated tokens (the migration cost of JigsawRL's sub-stage merging).

Sub-stage of a decode segment by tokens per iteration (= batch):
:func:`jigsawrl.stages.decode_band` (``decode_large`` from ``DECODE_LARGE_MIN_TOKENS``,
``decode_medium`` from ``DECODE_MEDIUM_MIN_TOKENS``, ``decode_small`` below: the paper's bands).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.stages import Stage, decode_band
from jigsawrl.workload.models import ModelSpec
from jigsawrl.workload.requests import RequestTruth

if TYPE_CHECKING:
    from jigsawrl.config import PipelineSpec

# Admission numbers, shared by every instance: a request taken off one instance (preempted,
# exported) leaves heap entries behind that name its old admission, and a number that another
# instance could hand out again would make such an entry look live. Only their order within one
# instance matters (ties, preemption), so sharing the counter changes no result.
_ADMISSIONS = itertools.count()


def engine_limits(cost: CostModelProtocol, spec: PipelineSpec, kv_tokens: int) -> dict[str, int]:
    """The sizing arguments of an instance of ``spec``'s rollout whose device memory holds
    ``kv_tokens`` of KV: that budget alone, or with ``CostParams.rollout_engine_limits`` (the
    rollout runs jigsawrl's engine) also the engine's own KV budget and batch limit."""
    if not cost.params.rollout_engine_limits:
        return {"kv_budget_tokens": max(1, kv_tokens)}
    ro = spec.rollout
    return {"kv_budget_tokens": max(1, min(kv_tokens, ro.max_batch_tokens)),
            "max_num_seqs": ro.max_num_seqs}


@dataclass(slots=True, eq=False)
class ReqRun:
    """Mutable progress of one request on an instance."""

    truth: RequestTruth
    turn: int = 0
    ctx: int = 0  # tokens in KV as of iteration ``it0`` (prompt + generated + tool results)
    it0: int = 0  # instance iteration when (re)admitted; ctx grows by one per iteration since
    left: int = 0  # tokens left to generate in the current turn (as of admission)
    prefill_tokens: int = 0  # tokens to prefill at next admission
    finish_iter: int = 0
    admit_order: int = 0
    running: bool = False

    @classmethod
    def new(cls, truth: RequestTruth) -> ReqRun:
        return cls(truth, ctx=truth.prompt_tokens, left=truth.turns[0].response_tokens,
                   prefill_tokens=truth.prompt_tokens)

    def ctx_at(self, it: int) -> int:
        """Tokens in KV at instance iteration ``it`` (running requests grow one per iteration)."""
        return self.ctx + (it - self.it0) if self.running else self.ctx


@dataclass(slots=True)
class Segment:
    """A stretch of constant work on the instance: a prefill, a decode run, or idle tool wait."""

    kind: Stage
    start_s: float
    duration_s: float
    iters: int = 0
    batch: int = 0
    ctx: int = 0
    tokens: int = 0
    flops: float = 0.0
    share: float = 1.0


@dataclass(slots=True)
class SegmentResult:
    finished: list[ReqRun] = field(default_factory=list)  # samples done (last turn finished)
    tool_calls: list[ReqRun] = field(default_factory=list)  # turns that ended in a tool call


class RolloutInstance:
    """Continuous batching on one engine instance; see the module docstring for the model."""

    def __init__(self, key: str, model: ModelSpec, tp: int, cost: CostModelProtocol, *,
                 kv_budget_tokens: int, max_num_seqs: int = 256,
                 max_prefill_tokens: int = 16384) -> None:
        if kv_budget_tokens < 1:
            raise ValueError(f"{key}: KV budget must be positive, got {kv_budget_tokens}")
        self.key = key
        self.model = model
        self.tp = tp
        self.cost = cost
        self.kv_budget = kv_budget_tokens
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self._shares_prompt = cost.params.rollout_shares_prompt
        # jigsawrl's engine: a request paused for a tool keeps its cache (request -> cached
        # tokens, oldest pause first) until the budget needs the room (see the module docstring)
        self._holds_paused = cost.params.rollout_engine_limits
        self._paused: dict[ReqRun, int] = {}
        self.paused_ctx = 0
        self._rejoining: set[ReqRun] = set()  # returned with their cache, not yet admitted
        self.queue: deque[ReqRun] = deque()
        self._heap: list[tuple[int, int, ReqRun]] = []
        self._order = _ADMISSIONS  # unique over instances: a moved request's entries here go stale
        self._stack: list[tuple[int, ReqRun]] = []  # admission order, lazily cleaned (for preemption)
        self.n_running = 0
        self.total_ctx = 0
        self.it = 0
        self.tool_waiting = 0
        self.preemptions = 0

    # ------------------------------------------------------------------ inputs
    def add(self, truths: Iterable[RequestTruth]) -> None:
        for t in truths:
            self.queue.append(ReqRun.new(t))

    def add_runs(self, runs: Iterable[ReqRun]) -> None:
        """Add requests exported from another instance (re-prefill their whole context)."""
        for r in runs:
            r.prefill_tokens = r.ctx
            r.running = False
            self.queue.append(r)

    def tool_returned(self, req: ReqRun) -> None:
        """A tool answered: the request re-queues to prefill the result and go on."""
        self.tool_waiting -= 1
        if not self._holds_paused:
            self.queue.append(req)
            return
        held = self._paused.pop(req, None)
        if held is None:  # its cache was evicted (or it paused on another instance)
            req.prefill_tokens = req.ctx
        else:
            self.paused_ctx -= held
            self._rejoining.add(req)
        self.queue.appendleft(req)

    # ------------------------------------------------------------------ state
    @property
    def runnable(self) -> bool:
        """Whether a segment could run now: a request queued or decoding (not only tool waits)."""
        return bool(self.queue) or self.n_running > 0

    @property
    def done(self) -> bool:
        return not self.queue and self.n_running == 0 and self.tool_waiting == 0

    def context_tokens(self) -> int:
        """Context tokens of unfinished requests (what a migration must re-prefill)."""
        return self.total_ctx + sum(r.ctx for r in self.queue)

    @property
    def unfinished(self) -> int:
        return len(self.queue) + self.n_running + self.tool_waiting

    # ------------------------------------------------------------------ planning
    def next_segment(self, now_s: float, share: float,
                     decode_share: float | None = None) -> Segment | None:
        """Plan (and for prefill, apply admission of) the next segment; ``None`` if nothing runs.

        ``decode_share`` (default ``share``) times decode segments: the executor lowers it when
        co-located work contends for the device's memory bandwidth. When ``None`` is returned and
        ``tool_waiting > 0`` the instance is idle waiting for tools.
        """
        admitted = self._admit()
        if admitted:
            return self._prefill_segment(admitted, now_s, share)
        if self.n_running == 0:
            return None
        iters = self._next_finish() - self.it
        room = self._room()
        while room < 1 and (self._paused or self.n_running > 1):
            if not self._evict_paused():
                self._preempt()
            iters = self._next_finish() - self.it
            room = self._room()
        iters = max(1, min(iters, room))
        b, c = self.n_running, self.total_ctx
        eff = share if decode_share is None else decode_share
        dur = self.cost.decode_span_time_s(self.model, self.tp, b, c, iters, eff)
        flops = self.cost.decode_flops(self.model, b, c, iters)
        return Segment(decode_band(b), now_s, dur, iters, b, c, b * iters, flops, share)

    def _room(self) -> int:
        """Decode iterations before the running contexts (and held paused caches) outgrow the
        KV budget."""
        return (self.kv_budget - self.total_ctx - self.paused_ctx) // self.n_running

    def _evict_paused(self) -> bool:
        """Free the cache of the oldest request paused for a tool (it re-prefills its whole
        context when the tool answers); False if none holds one."""
        if not self._paused:
            return False
        req = next(iter(self._paused))
        self.paused_ctx -= self._paused.pop(req)
        req.prefill_tokens = req.ctx
        return True

    def _next_finish(self) -> int:
        """The iteration at which the next running request ends its turn (stale heap entries of
        requests taken out since are dropped first)."""
        heap = self._heap
        while not self._is_live(*heap[0][1:]):
            heapq.heappop(heap)
        return heap[0][0]

    def _admit(self) -> list[ReqRun]:
        admitted: list[ReqRun] = []
        tokens = 0
        while self.queue and self.n_running < self.max_num_seqs:
            r = self.queue[0]
            need = self.total_ctx + r.ctx + self.n_running + 1
            while need + self.paused_ctx > self.kv_budget and self._evict_paused():
                pass
            if need + self.paused_ctx > self.kv_budget and self.n_running:
                break
            self._rejoining.discard(r)
            if admitted and tokens + r.prefill_tokens > self.max_prefill_tokens:
                break
            self.queue.popleft()
            tokens += r.prefill_tokens
            admitted.append(r)
            self._start_running(r)
        if self._rejoining:  # no room for them: the engine preempts them, caches freed
            for r in self._rejoining:
                r.prefill_tokens = r.ctx
            self._rejoining.clear()
        return admitted

    def _start_running(self, r: ReqRun) -> None:
        r.running = True
        r.it0 = self.it
        r.admit_order = next(self._order)
        r.finish_iter = self.it + r.left
        heapq.heappush(self._heap, (r.finish_iter, r.admit_order, r))
        self._stack.append((r.admit_order, r))
        self.n_running += 1
        self.total_ctx += r.ctx

    def _prefill_segment(self, admitted: list[ReqRun], now_s: float, share: float) -> Segment:
        computed = _distinct_prompts(admitted) if self._shares_prompt else admitted
        new = sum(r.prefill_tokens for r in computed)
        ctx = sum(r.ctx - r.prefill_tokens for r in computed)
        for r in admitted:
            r.prefill_tokens = 0
        n = len(computed)
        dur = self.cost.prefill_time_s(self.model, self.tp, new, ctx, share, num_seqs=n)
        flops = self.cost.prefill_flops(self.model, new, ctx, num_seqs=n)
        return Segment(Stage.PREFILL, now_s, dur, 0, len(admitted), ctx, new, flops, share)

    def _take_latest(self) -> ReqRun:
        """Take the most recently admitted running request out (stale stack entries of
        requests taken out since are dropped first)."""
        while not self._is_live(*self._stack[-1]):
            self._stack.pop()
        _, r = self._stack.pop()
        self._remove(r)
        return r

    def _preempt(self) -> None:
        victim = self._take_latest()
        victim.prefill_tokens = victim.ctx
        self.queue.appendleft(victim)
        self.preemptions += 1

    @staticmethod
    def _is_live(order: int, r: ReqRun) -> bool:
        return r.running and r.admit_order == order

    def _remove(self, r: ReqRun) -> None:
        """Take a running request out (lazy heap deletion via ``running = False``)."""
        r.ctx = r.ctx_at(self.it)
        r.left = r.finish_iter - self.it
        r.running = False
        self.n_running -= 1
        self.total_ctx -= r.ctx

    def export_unfinished(self, seg: Segment | None, now_s: float) -> tuple[SegmentResult, list[ReqRun]]:
        """Abort every queued and running request and hand them out (migration / interruption).

        A decode segment in flight is cut at ``now_s`` first (its finished turns are returned in
        the result); a prefill in flight is lost (its requests re-prefill at the destination).
        Tool-waiting requests stay with the caller's tool events (``tool_waiting`` is untouched);
        caches held for them are dropped (they re-prefill their whole context where they return).
        """
        self._drop_paused()
        res = SegmentResult()
        if seg is not None and seg.iters:
            res, _ = self.interrupt(seg, now_s)
        runs = list({id(r): r for _, order, r in self._heap if self._is_live(order, r)}.values())
        for r in runs:
            self._remove(r)
        runs.sort(key=lambda r: r.admit_order)
        runs.extend(self.queue)
        self.queue.clear()
        self._heap.clear()
        self._stack.clear()
        for r in runs:
            r.prefill_tokens = r.ctx
        return res, runs

    def _drop_paused(self) -> None:
        while self._evict_paused():
            pass
        self._rejoining.clear()

    def export_some(self, count: int, *, queued_only: bool = False) -> list[ReqRun]:
        """Take up to ``count`` unfinished requests off this instance (a rollout spreading onto
        new ranks): queued ones first, from the back of the queue, then running ones, the most
        recently admitted first (the least progressed: the cheapest to re-prefill) — never by
        their lengths, which a real engine does not know. No segment may be in flight (the
        caller cuts a decode first); with ``queued_only`` (a prefill in flight) only queued
        requests go. Each re-prefills its whole context where it is added."""
        out: list[ReqRun] = []
        while self.queue and len(out) < count:
            out.append(self.queue.pop())
        if not queued_only:
            while len(out) < count and self.n_running:
                out.append(self._take_latest())
        for r in out:
            r.prefill_tokens = r.ctx
            self._rejoining.discard(r)
        return out

    # ------------------------------------------------------------------ progress
    def finish_segment(self, seg: Segment) -> SegmentResult:
        """Apply a segment that ran to its planned end."""
        if seg.kind == Stage.PREFILL:
            return SegmentResult()
        return self._advance(seg.iters)

    def interrupt(self, seg: Segment, now_s: float) -> tuple[SegmentResult, Segment]:
        """Stop a decode segment early at ``now_s`` (share change, tool return, migration).

        Progress is the elapsed fraction of the planned iterations, rounded down (the iteration
        in flight is lost: a small, conservative cost). Returns the result and the segment as run.
        """
        if seg.kind == Stage.PREFILL or seg.iters == 0:
            raise ValueError("only decode segments can be interrupted")
        frac = 0.0 if seg.duration_s <= 0 else min(1.0, (now_s - seg.start_s) / seg.duration_s)
        done = min(seg.iters, int(frac * seg.iters))
        ran = Segment(seg.kind, seg.start_s, now_s - seg.start_s, done, seg.batch, seg.ctx,
                      seg.batch * done, seg.flops * (done / seg.iters), seg.share)
        return self._advance(done), ran

    def _advance(self, iters: int) -> SegmentResult:
        self.it += iters
        self.total_ctx += self.n_running * iters
        res = SegmentResult()
        heap = self._heap
        while heap and (heap[0][0] <= self.it or not self._is_live(*heap[0][1:])):
            _, order, r = heapq.heappop(heap)
            if not self._is_live(order, r):
                continue  # stale: taken out (preempted, exported) since it was pushed
            self._end_turn(r, res)
        return res

    def _end_turn(self, r: ReqRun, res: SegmentResult) -> None:
        turn = r.truth.turns[r.turn]
        self._remove(r)
        if r.turn + 1 < len(r.truth.turns):
            if self._holds_paused:  # the engine keeps its cache while the tool runs
                self._paused[r] = r.ctx
                self.paused_ctx += r.ctx
            r.turn += 1
            r.left = r.truth.turns[r.turn].response_tokens
            r.ctx += turn.tool_result_tokens
            r.prefill_tokens = turn.tool_result_tokens
            self.tool_waiting += 1
            res.tool_calls.append(r)
        else:
            r.left = 0
            res.finished.append(r)


def _distinct_prompts(admitted: list[ReqRun]) -> list[ReqRun]:
    """The admitted requests a prefill computes when the engine prefills a GRPO group's shared
    prompt once and copies its KV to the group's other fresh rows (``engine/batch.py``).

    A request shares when it is fresh (first turn, nothing cached: it prefills exactly its
    prompt) and its id is a sampled one, ``pipeline/step/prompt/sample`` (the real engine's
    and the workload's ids): the group is everything before the last part. Predicted requests
    (``.../pred/i``, ``.../prior/i``) carry no group and are counted in full. Simplification:
    the KV copy to the other rows is not charged (a memory copy of the prompt's rows)."""
    seen: set[str] = set()
    out: list[ReqRun] = []
    for r in admitted:
        group = _group_of(r)
        if group is not None:
            if group in seen:
                continue
            seen.add(group)
        out.append(r)
    return out


def _group_of(r: ReqRun) -> str | None:
    if r.turn or r.prefill_tokens != r.truth.prompt_tokens or r.ctx != r.truth.prompt_tokens:
        return None
    head, _, sample = r.truth.sample_id.rpartition("/")
    prompt = head.rpartition("/")[2]
    return head if sample.isdigit() and prompt.isdigit() else None
