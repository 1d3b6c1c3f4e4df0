"""The multi-turn rollout loop: drive a RolloutEngine and a task's tool until responses finish.

What: every request decodes in the engine's continuous batch. When one stops on a tool-call
stop string of its task, the loop calls ``task.call_tool``, and the request *waits* for the tool's
latency while the other requests keep decoding (the tool wait is the ``tool_wait`` sub-stage of
DESIGN.md §2); when its result is ready the result tokens are appended with mask 0 through
``continue_request`` and the request rejoins the batch, its KV cache kept. A response ends on EOS,
on the task's end-of-response newline, on the token limit, or when ``max_turns`` turns are used.

Why this shape: a single-threaded event loop is enough on CPU (tool calls are cheap Python; their
*latency* is simulated, as the task's ``ToolResult.latency_s`` says) and keeps the rollout
deterministic for a given seed whatever the latency is: latency changes only *when* a request
rejoins, and the engine samples each request from its own seeded generator.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

RESPONSE_END = "\n"  # the tasks' end-of-response marker (tasks/base.py)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Prompt ids: ``<bos>`` then the text's tokens (no other special tokens)."""
    return [tokenizer.bos_token_id, *tokenizer.encode(text, add_special_tokens=False)]


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of a piece of response text (demo, tool result), no special tokens."""
    return list(tokenizer.encode(text, add_special_tokens=False))


@dataclass
class Trajectory:
    """One finished response of one prompt (possibly several turns).

    Attributes:
        request_id: the engine request id.
        example: the task example it answers.
        prompt_ids: the encoded prompt.
        response_ids: model and tool tokens after the prompt.
        response_mask: 1 for model tokens, 0 for tool-result tokens (excluded from the loss).
        response_text: the decoded response, tool results included (what the reward reads).
        finish_reason: ``eos`` | ``stop`` | ``length`` | ``abort`` | ``max_turns``.
        num_tool_calls: tool calls made.
        tool_wait_s: total simulated tool latency waited.
    """

    request_id: str
    example: Any
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_text: str
    finish_reason: str
    num_tool_calls: int = 0
    tool_wait_s: float = 0.0


@dataclass
class _Live:
    example: Any
    prompt_ids: list[int]
    max_tokens: int
    turns: int = 1
    tool_calls: int = 0
    tool_wait_s: float = 0.0
    turn_start: int = 0
    out_of_room: bool = False
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(order=True)
class _Pending:
    ready_s: float
    seq: int
    request_id: str = field(compare=False)
    append_ids: list[int] = field(compare=False)


class AgentLoop:
    """Runs a batch of requests to completion, serving tool calls between turns.

    Args:
        engine: a ``RolloutEngine`` (``add_request``, ``step``, ``continue_request``, ``release``).
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

    def run(self, requests: list[tuple[Any, Any]]) -> list[Trajectory]:
        """Run ``(example, GenerationRequest)`` pairs; trajectories come back in input order."""
        live: dict[str, _Live] = {}
        order = [req.request_id for _, req in requests]
        for example, req in requests:
            live[req.request_id] = _Live(example, list(req.prompt_ids),
                                         req.params.max_new_tokens)
            self.engine.add_request(req)
        done: dict[str, Trajectory] = {}
        pending: list[_Pending] = []
        running = len(requests)
        seq = 0
        while running or pending:
            running += self._rejoin_ready(pending, live)
            if running == 0:
                self.sleep(max(0.0, pending[0].ready_s - self.clock()))
                continue
            for out in self.engine.step():
                running -= 1
                call = self._tool_call(out, live[out.request_id])
                if call is None:
                    done[out.request_id] = self._finish(out, live.pop(out.request_id))
                    continue
                seq += 1
                heapq.heappush(pending, _Pending(self.clock() + call[1], seq, out.request_id,
                                                 call[0]))
        return [done[rid] for rid in order]

    def _rejoin_ready(self, pending: list[_Pending], live: dict[str, _Live]) -> int:
        now = self.clock()
        n = 0
        while pending and pending[0].ready_s <= now:
            item = heapq.heappop(pending)
            info = live[item.request_id]
            self.engine.continue_request(item.request_id, item.append_ids)
            info.turns += 1
            n += 1
        return n

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
        result = self.task.call_tool(call_text, info.state)
        append = encode_text(self.tokenizer, result.text)
        if len(ids) + len(append) >= info.max_tokens:
            info.out_of_room = True  # no room for the result and an answer: end it here
            return None
        latency = float(result.latency_s) + self.extra_latency_s
        info.tool_calls += 1
        info.tool_wait_s += latency
        info.turn_start = len(ids) + len(append)
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
