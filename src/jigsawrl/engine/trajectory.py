"""What a multi-turn rollout produces, and how its text becomes token ids.

`Trajectory` (one finished response), `encode_prompt` / `encode_text` and the tasks'
end-of-response marker `RESPONSE_END`. They sit apart from the loops that use them
(`jigsawrl.engine.session.RolloutSession`, `jigsawrl.engine.agent.AgentLoop`, the warm start) so
that those import them one way: the agent loop runs on a session, and the session builds
trajectories. `jigsawrl.engine.agent` re-exports all four names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RESPONSE_END", "Trajectory", "encode_prompt", "encode_text"]

RESPONSE_END = "\n"  # the tasks' end-of-response marker (tasks/base.py)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Prompt ids: ``<bos>`` then the text's tokens (no other special tokens).

    A tokenizer without a BOS token (Qwen's) gives the text's tokens only, and a text that
    already starts with the BOS token (a chat template that writes it) does not get a second.
    """
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    bos = tokenizer.bos_token_id
    if bos is None or (ids and ids[0] == bos):
        return ids
    return [bos, *ids]


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
