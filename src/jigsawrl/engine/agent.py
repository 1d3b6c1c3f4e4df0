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

The loop itself is `jigsawrl.engine.session.RolloutSession`, which can also run in time slices and
export unfinished requests to another engine; `AgentLoop.run` runs one batch to completion with it.
`Trajectory`, `encode_prompt`, `encode_text` and `RESPONSE_END` live in
`jigsawrl.engine.trajectory` (so that the session imports them without importing this module) and
are re-exported here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from jigsawrl.engine.session import RolloutSession
from jigsawrl.engine.trajectory import RESPONSE_END, Trajectory, encode_prompt, encode_text

__all__ = ["RESPONSE_END", "AgentLoop", "Trajectory", "encode_prompt", "encode_text"]

log = logging.getLogger(__name__)


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
        self._args = (engine, tokenizer, task)
        self._options = {"extra_latency_s": extra_latency_s, "clock": clock, "sleep": sleep}

    def run(self, requests: list[tuple[Any, Any]]) -> list[Trajectory]:
        """Run ``(example, GenerationRequest)`` pairs; trajectories come back in input order."""
        session = RolloutSession(*self._args, **self._options)
        for example, req in requests:
            session.add(example, req)
        done = {t.request_id: t for t in session.run()}
        return [done[req.request_id] for _, req in requests]
