"""An incremental, exportable rollout: `AgentLoop`'s multi-turn loop, run in time slices.

What: `RolloutSession` holds the requests of one rollout on one `RolloutEngine`. ``run(budget_s)``
drives engine iterations and serves tool calls (as `jigsawrl.engine.agent` describes: a tool call
pauses its request for the tool's latency while the others decode, then its result is appended with
mask 0) until every request has finished or the budget of clock time is spent, and returns the
trajectories that finished meanwhile. Between slices the caller can read progress (`unfinished`,
`decoding`, `ctx_tokens`), swap weights (`load_weights`), take every unfinished request out
(`export`) and hand it to a session on another engine (`add_exported`), or copy them without
stopping them (`snapshot`: a checkpoint to resume from if this session's process dies).

Why: a Ray rollout worker must report progress while it generates, move its long tail of
unfinished requests to another worker (long-tail migration) and take new weights mid-rollout
(AReaL-style interrupt). An `ExportedRequest` holds plain values only (the engine's
`RequestState`, the tool result still to insert, the tool latency still to wait, the loop's
bookkeeping), so it pickles through Ray; importing it re-prefills the request on the new engine
(``engine.resume``), which under greedy sampling continues as the first engine would have (equal up
to the float rounding of a batched vs incremental prefill, see `jigsawrl.engine.rollout`). A
request keeps its id, example, tool state, turn count and tool-wait accounting across moves.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from jigsawrl.engine.requests import RequestState
from jigsawrl.engine.trajectory import Trajectory, encode_text
from jigsawrl.errors import InputError
from jigsawrl.tasks import safe_call_tool

log = logging.getLogger(__name__)


@dataclass
class ExportedRequest:
    """One unfinished request taken out of a session (plain, picklable values only).

    Attributes:
        example: the task example.
        prompt_ids: the original encoded prompt (for the `Trajectory`).
        state: the engine's export (``engine.abort``) of the request, or the paused state of a
            request waiting for its tool.
        append_ids: tool-result tokens still to insert on resume ([] if none).
        wait_s: tool latency still to wait before the request may rejoin (0 if none).
        info: the loop's bookkeeping: ``max_tokens``, ``turns``, ``tool_calls``, ``tool_wait_s``,
            ``turn_start``, ``out_of_room``, ``state`` (the task's per-trajectory tool state).
    """

    example: Any
    prompt_ids: list[int]
    state: RequestState
    append_ids: list[int]
    wait_s: float
    info: dict[str, Any]


@dataclass
class _Live:
    """Per-request bookkeeping. ``turns`` counts turns begun: a served tool call begins the next
    turn (its result is the start of it), so an exported tool-waiting request carries it."""

    example: Any
    prompt_ids: list[int]
    max_tokens: int
    turns: int = 1
    tool_calls: int = 0
    tool_wait_s: float = 0.0
    turn_start: int = 0
    out_of_room: bool = False
    state: dict[str, Any] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["example"], d["prompt_ids"]
        return d


@dataclass(order=True)
class _Pending:
    """A request waiting for its tool (or an imported request waiting to rejoin).

    ``state`` is None while the request is paused in this session's engine (it rejoins through
    ``continue_request``, its KV cache kept); an imported request is not in the engine yet and
    rejoins through ``resume(state, append_ids)``."""

    ready_s: float
    seq: int
    request_id: str = field(compare=False)
    append_ids: list[int] = field(compare=False)
    state: RequestState | None = field(default=None, compare=False)


class RolloutSession:
    """The requests of one rollout on one engine, run incrementally (see the module docstring).

    Args:
        engine: a ``RolloutEngine`` owned by this session (``add_request``, ``step``,
            ``continue_request``, ``release``; ``abort``/``resume`` for export and import).
        tokenizer: the model's tokenizer.
        task: the task (``multi_turn``, ``max_turns``, ``stop``, ``call_tool``).
        extra_latency_s: latency added to every tool call (the config's ``tool_latency_s``).
        clock, sleep: injectable for tests.
    """

    def __init__(self, engine: Any, tokenizer: Any, task: Any, *, extra_latency_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.task = task
        self.extra_latency_s = extra_latency_s
        self.clock = clock
        self.sleep = sleep
        self.tool_stops = tuple(task.stop) if task.multi_turn else ()
        self._live: dict[str, _Live] = {}  # every unfinished request, in arrival order
        self._pending: list[_Pending] = []  # heap of tool-waiting / not-yet-rejoined requests
        self._seq = 0

    # ----------------------------------------------------------------- adding requests

    def add(self, example: Any, req: Any) -> None:
        """Queue a new ``GenerationRequest`` answering ``example``.

        Raises:
            InputError: the id is already in this session, or the engine rejects the request.
        """
        self._check_new(req.request_id)
        self.engine.add_request(req)
        self._live[req.request_id] = _Live(example, list(req.prompt_ids),
                                           req.params.max_new_tokens)

    def add_exported(self, item: ExportedRequest) -> None:
        """Import a request exported by another session: it rejoins (``engine.resume`` with its
        pending tool tokens) once ``item.wait_s`` of this session's clock has passed, at the
        next `run`. It keeps its id and bookkeeping.

        Raises:
            InputError: the id is already in this session.
        """
        rid = item.state.request_id
        self._check_new(rid)
        self._live[rid] = _Live(item.example, list(item.prompt_ids), **dict(item.info))
        self._push(self.clock() + max(0.0, item.wait_s), rid, list(item.append_ids), item.state)
        log.debug("imported %s (wait %.3fs, %d tool tokens)", rid, item.wait_s,
                  len(item.append_ids))

    def _check_new(self, request_id: str) -> None:
        if request_id in self._live:
            raise InputError("request id already in this session", where=f"request {request_id!r}",
                             fix="add each request once (export it before adding it elsewhere)")

    def _push(self, ready_s: float, rid: str, append_ids: list[int],
              state: RequestState | None = None) -> None:
        self._seq += 1
        heapq.heappush(self._pending, _Pending(ready_s, self._seq, rid, append_ids, state))

    # ----------------------------------------------------------------- running

    def run(self, budget_s: float | None = None, *,
            idle_return: bool = False) -> list[Trajectory]:
        """Run until every request has finished or ``budget_s`` of clock time has passed.

        The budget is checked between engine iterations, after at least one iteration when a
        request can run; while only tool-waiting requests remain the session sleeps until the
        next is ready, never past the budget's end — or, with ``idle_return``, returns at once
        (a Ray worker then gives its device to other work; :attr:`next_ready_s` says when to
        come back). Returns the trajectories that finished during this call, in finish order.
        """
        end = None if budget_s is None else self.clock() + budget_s
        finished: list[Trajectory] = []
        stepped = False
        while self._live:
            if end is not None and stepped and self.clock() >= end:
                break
            self._rejoin_ready()
            if len(self._live) == len(self._pending):  # nothing in the engine: wait for a tool
                now = self.clock()
                if idle_return or (end is not None and now >= end):
                    break
                wake = self._pending[0].ready_s if end is None else min(self._pending[0].ready_s,
                                                                       end)
                self.sleep(max(0.0, wake - now))
                continue
            finished.extend(self._step())
            stepped = True
        return finished

    def _step(self) -> list[Trajectory]:
        """One engine iteration; serve the tool calls it ends with, return what finished."""
        done = []
        for out in self.engine.step():
            info = self._live[out.request_id]
            call = self._tool_call(out, info)
            if call is None:
                done.append(self._finish(out, self._live.pop(out.request_id)))
            else:
                self._push(self.clock() + call[1], out.request_id, call[0])
        return done

    def _rejoin_ready(self) -> None:
        now = self.clock()
        while self._pending and self._pending[0].ready_s <= now:
            item = heapq.heappop(self._pending)
            try:
                if item.state is None:
                    self.engine.continue_request(item.request_id, item.append_ids)
                else:
                    self.engine.resume(item.state, item.append_ids)
            except Exception:  # e.g. an import over this engine's KV budget: keep it exportable
                heapq.heappush(self._pending, item)
                raise

    def _tool_call(self, out: Any, info: _Live) -> tuple[list[int], float] | None:
        """Serve a tool call if ``out`` is one; return (result ids, latency) or None to finish."""
        if out.finish_reason != "stop" or out.matched_stop not in self.tool_stops:
            return None
        if info.turns >= self.task.max_turns:
            return None
        ids = list(out.state.output_ids)
        call_text = self.tokenizer.decode(ids[info.turn_start:], skip_special_tokens=True)
        info.state.setdefault("example", info.example)
        info.state["turn"] = info.turns
        result = safe_call_tool(self.task, call_text, info.state)  # a tool bug never crashes a run
        append = encode_text(self.tokenizer, result.text)
        if len(ids) + len(append) >= info.max_tokens:
            info.out_of_room = True  # no room for the result and an answer: end it here
            return None
        latency = float(result.latency_s) + self.extra_latency_s
        info.tool_calls += 1
        info.tool_wait_s += latency
        info.turn_start = len(ids) + len(append)
        info.turns += 1
        return append, latency

    def _finish(self, out: Any, info: _Live) -> Trajectory:
        st = out.state
        reason = out.finish_reason
        if reason == "stop":
            self.engine.release(out.request_id)  # a stopped request stays paused until released
            if out.matched_stop in self.tool_stops:
                reason = "length" if info.out_of_room else "max_turns"
        ids = list(st.output_ids)
        mask = [int(m) for m in st.output_mask]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Trajectory(out.request_id, info.example, info.prompt_ids, ids, mask, text, reason,
                          info.tool_calls, info.tool_wait_s)

    # ----------------------------------------------------------------- progress

    def request_ids(self) -> list[str]:
        """The unfinished requests' ids, in arrival order."""
        return list(self._live)

    @property
    def unfinished(self) -> int:
        """Requests not finished: running or waiting in the engine, or waiting for a tool."""
        return len(self._live)

    @property
    def decoding(self) -> int:
        """Requests in the engine's running batch now (what sizes a decode iteration)."""
        return int(self.engine.stats.running)

    @property
    def next_ready_s(self) -> float:
        """Seconds until the first tool-waiting request may rejoin (0 if none waits)."""
        if not self._pending:
            return 0.0
        return max(0.0, self._pending[0].ready_s - self.clock())

    def ctx_tokens(self) -> int:
        """Tokens of context (prompt + output so far) held by the unfinished requests; tool
        results not yet inserted are not counted."""
        # The engine holds the running, waiting and paused (this session's tool-waiting)
        # requests; imported ones not yet resumed are only in this session's heap.
        n = self.engine.context_tokens(self._live)
        return n + sum(p.state.context_len for p in self._pending if p.state is not None)

    def done(self) -> bool:
        return not self._live

    # ----------------------------------------------------------------- moving requests

    def export(self, request_ids: Collection[str] | None = None) -> list[ExportedRequest]:
        """Take every unfinished request — or those of ``request_ids`` still here (a rollout
        spreading onto new ranks) — out of this session and its engine (arrival order).

        Running and waiting requests are aborted (their KV cache freed); a tool-waiting request
        carries its tool result and the latency it still has to wait. Ids that finished or are
        not here are skipped. Without ``request_ids`` the session is then empty.
        """
        items = self._exported(self.engine.abort, request_ids)
        if request_ids is None:
            self._live.clear()
            self._pending.clear()
        else:
            gone = {item.state.request_id for item in items}
            for rid in gone:
                del self._live[rid]
            self._pending = [p for p in self._pending if p.request_id not in gone]
            heapq.heapify(self._pending)
        log.debug("exported %d requests", len(items))
        return items

    def snapshot(self) -> list[ExportedRequest]:
        """What `export` would return now, leaving every request running here: a checkpoint.

        Why: a Ray worker can die with its requests; the executor keeps the latest snapshot of
        each so that another session resumes it (`add_exported`) from there instead of
        regenerating it from the prompt. The items are copies (the engine's `peek`, the loop's
        bookkeeping deep-copied), so later progress here does not change them; resumed on an
        engine with the same weights they continue exactly as this session will (the sampling
        RNG state travels in each ``state``), up to the float rounding of a re-prefill.
        """
        return self._exported(self.engine.peek)

    def _exported(self, take: Callable[[str], RequestState],
                  only: Collection[str] | None = None) -> list[ExportedRequest]:
        """Every unfinished request (of ``only``, when given) as an `ExportedRequest` (arrival
        order); ``take`` reads the state of a request held by the engine (``abort`` removes
        it, ``peek`` does not)."""
        now = self.clock()
        pending = {p.request_id: p for p in self._pending}
        items = []
        for rid, info in self._live.items():
            if only is not None and rid not in only:
                continue
            p = pending.get(rid)
            state = p.state.snapshot() if p is not None and p.state is not None else take(rid)
            append, wait = ([], 0.0) if p is None else (list(p.append_ids),
                                                         max(0.0, p.ready_s - now))
            items.append(ExportedRequest(info.example, list(info.prompt_ids), state, append,
                                         wait, info.info()))
        return items

    def load_weights(self, state_dict: dict) -> None:
        """Swap the engine's weights between iterations; every KV cache is dropped, so running
        and paused requests re-prefill with the new weights before their next token."""
        self.engine.load_weights(state_dict)
