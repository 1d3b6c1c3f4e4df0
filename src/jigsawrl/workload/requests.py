"""What one rollout request *truly* looks like: prompt length and per-turn response lengths.

Only the simulated executor (the "truth") and trace files hold these; schedulers see predictions.
A multi-turn request alternates assistant turns and tool calls: turn ``i`` generates
``response_tokens`` tokens, then (except after the last turn) waits ``tool_latency_s`` for a tool
whose result inserts ``tool_result_tokens`` into the context before the next turn is prefilled.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TurnTruth:
    response_tokens: int
    tool_latency_s: float = 0.0
    tool_result_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RequestTruth:
    sample_id: str
    prompt_tokens: int
    turns: tuple[TurnTruth, ...]

    @property
    def generated_tokens(self) -> int:
        """Tokens the model decodes (what costs decode iterations)."""
        return sum(t.response_tokens for t in self.turns)

    @property
    def response_tokens(self) -> int:
        """Trajectory tokens after the prompt: generated plus tool results (trained on, masked)."""
        return sum(t.response_tokens + t.tool_result_tokens for t in self.turns)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.response_tokens
