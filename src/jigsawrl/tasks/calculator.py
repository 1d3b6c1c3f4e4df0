"""Calculator: multi-turn tool use. The model calls a calculator, reads its answer, continues.

The model writes one operation per call and stops at ``</calc>`` (the task's stop string); the
environment evaluates the last call with the safe evaluator and inserts ``<r>value</r>``; after
the last call the model writes ``A: <answer>``::

    prompt  "Q: 37*12+5?\\n"
    demo    "<calc>37*12</calc><r>444</r><calc>444+5</calc><r>449</r>A: 449"

The demo evaluates the question's tree bottom-up (each operation of the tree is one call, operands
are the values already computed), which is the decomposition a tiny model can copy. Reward on the
final answer only: the integer after the last ``A:`` that follows the last tool result; 1.0 if it
is right, ``format_score`` (0.1) if it is an integer but wrong, 0.0 if there is none. The tool
answers anything it cannot evaluate (garbage, ``__import__('os')``, ``10**10**10``, huge or
unbalanced input, division by zero) with ``<r>error</r>`` and ``ok=False``; non-integer results are
written as reduced fractions (``7/2``), which the evaluator reads back exactly.

Caps (all checked before the work they bound, none a timeout): a call's content is at most
``MAX_CALL_CHARS`` (64) characters and 32 tokens, literals at most 12 digits, nesting at most 16
deep, every intermediate value at most 128 bits (``9*9*9*...`` fails at the first product that
is too large), and an answer at most ``MAX_RESULT_CHARS`` (24) characters. Finding the call is
one backwards scan of the text (linear, whatever its length).

Difficulty presets set the number of operations (calls), the operand range and whether exact
divisions appear.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

from jigsawrl.tasks.base import (
    BaseTask,
    Example,
    ToolResult,
    first_line,
    last_tagged,
    parse_int,
    register_task,
    resolve_preset,
    sample_examples,
    tool_guard,
)
from jigsawrl.tasks.expression import (
    ArithError,
    BinOp,
    Limits,
    Node,
    Num,
    apply_op,
    eval_node,
    evaluate,
    format_number,
    render,
)

PRESETS: dict[str, dict[str, Any]] = {
    "easy": {"num_ops": 2, "max_operand": 20, "use_division": False},
    "medium": {"num_ops": 2, "max_operand": 99, "use_division": False},
    "hard": {"num_ops": 3, "max_operand": 99, "use_division": True},
}
CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
RESULT_OPEN, RESULT_CLOSE = "<r>", "</r>"
ANSWER = "A:"
MAX_CALL_CHARS = 64  # longer call contents are rejected before parsing
MAX_RESULT_CHARS = 24  # results longer than this are an error (keeps contexts short)
# a demo call is "a op b" (3 tokens); 32 leaves room for a model that writes a longer expression
LIMITS = Limits(max_chars=MAX_CALL_CHARS, max_digits=12, max_depth=16, max_bits=128,
                max_tokens=32)


def answer_of(solution_str: str) -> int | None:
    """The integer after the last ``A:`` that follows the last tool result, or None."""
    end = solution_str.rfind(RESULT_CLOSE)
    tail = solution_str if end < 0 else solution_str[end + len(RESULT_CLOSE):]
    pos = tail.rfind(ANSWER)
    return None if pos < 0 else parse_int(first_line(tail[pos + len(ANSWER):]))


@register_task("calculator")
class CalculatorTask(BaseTask):
    """Calculator tool use (see module docstring).

    Args:
        difficulty: preset name.
        num_ops: operations per question (= tool calls in the demo); overrides the preset.
        max_operand: operands are 1..max_operand; overrides the preset.
        use_division: include exact divisions; overrides the preset.
        test_fraction: share of the prompt space reserved for the test split.
        format_score, tool_latency_s, tool_latency_jitter: see :class:`BaseTask`.
    """

    multi_turn = True
    stop = (CALL_CLOSE,)
    error_text = f"{RESULT_OPEN}error{RESULT_CLOSE}"

    def __init__(self, difficulty: str = "easy", num_ops: int | None = None,
                 max_operand: int | None = None, use_division: bool | None = None,
                 test_fraction: float = 0.2, format_score: float = 0.1,
                 tool_latency_s: float = 0.0, tool_latency_jitter: float = 0.0) -> None:
        super().__init__(tool_latency_s, tool_latency_jitter, format_score)
        p = resolve_preset(PRESETS, difficulty, num_ops=num_ops, max_operand=max_operand,
                           use_division=use_division)
        if not 1 <= p["num_ops"] <= 4:
            raise ValueError(f"num_ops must be in 1..4 (short trajectories), got {p['num_ops']}")
        if not 2 <= p["max_operand"] <= 999:
            raise ValueError(f"max_operand must be in 2..999, got {p['max_operand']}")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        self.num_ops: int = p["num_ops"]
        self.max_operand: int = p["max_operand"]
        self.use_division: bool = bool(p["use_division"])
        self.test_fraction = test_fraction
        self.max_turns = self.num_ops + 2  # one call per operation, the answer, one spare
        self.expected_tool_calls = float(self.num_ops)  # one call per operation
        # "<r>" + a result of up to ~6 digits + "</r>" (character tokens)
        self.expected_tool_result_tokens = len(RESULT_OPEN) + 6 + len(RESULT_CLOSE)
        self.max_response_chars = 44 * self.num_ops + 16

    # ------------------------------------------------------------------ data

    def make_dataset(self, n: int, seed: int, split: str = "train") -> list[Example]:
        """``n`` questions, deterministic per ``(seed, split)``; splits are disjoint."""
        return sample_examples(self.name, self._make_one, n, seed, split, self.test_fraction)

    def _make_one(self, rng: random.Random) -> Example:
        while True:
            node = self._random_tree(rng, self.num_ops)
            steps: list[str] = []
            try:
                value = self._demo_steps(node, steps)
            except ArithError:
                continue
            if value.denominator == 1 and value >= 0:
                break
        answer = format_number(value)
        demo = "".join(steps) + f"{ANSWER} {answer}"
        return Example(f"Q: {render(node)}?\n", answer, self.name, {"num_ops": self.num_ops}, demo)

    def _random_tree(self, rng: random.Random, ops: int) -> Node:
        if ops == 0:
            return Num(rng.randint(1, self.max_operand))
        left_ops = rng.randint(0, ops - 1)
        op = rng.choice("+-*/" if self.use_division else "+-*")
        left = self._random_tree(rng, left_ops)
        return BinOp(op, left, self._random_tree(rng, ops - 1 - left_ops))

    def _demo_steps(self, node: Node, steps: list[str]) -> Fraction:
        """Evaluate bottom-up, appending one call + result per operation. Raises ArithError when
        an intermediate value is negative, fractional or too long (such questions are redrawn)."""
        if not isinstance(node, BinOp):
            return eval_node(node, LIMITS)
        left = self._demo_steps(node.left, steps)
        right = self._demo_steps(node.right, steps)
        call = f"{format_number(left)}{node.op}{format_number(right)}"
        value = apply_op(node.op, left, right, LIMITS)  # what the tool answers (tests replay it)
        text = format_number(value)
        if value < 0 or value.denominator != 1 or len(text) > 6:
            raise ArithError("demo step out of range")
        steps.append(f"{CALL_OPEN}{call}{CALL_CLOSE}{RESULT_OPEN}{text}{RESULT_CLOSE}")
        return value

    # ------------------------------------------------------------------ tool and reward

    @tool_guard
    def call_tool(self, call_text: str, state: dict) -> ToolResult:
        """Evaluate the last ``<calc>...</calc>`` of ``call_text``; never raises.

        ``state`` (one dict per trajectory) counts ``calls`` and ``errors``.
        """
        state["calls"] = state.get("calls", 0) + 1
        content = last_tagged(call_text, CALL_OPEN, CALL_CLOSE, MAX_CALL_CHARS)
        if content is None:
            state["errors"] = state.get("errors", 0) + 1
            return self.error(call_text, "no complete <calc>...</calc> within size bounds")
        try:
            text = format_number(evaluate(content, LIMITS))
        except ArithError as exc:
            state["errors"] = state.get("errors", 0) + 1
            return self.error(call_text, str(exc))
        if len(text) > MAX_RESULT_CHARS:
            state["errors"] = state.get("errors", 0) + 1
            return self.error(call_text, "result too long")
        return ToolResult(f"{RESULT_OPEN}{text}{RESULT_CLOSE}", ok=True,
                          latency_s=self.latency_for(call_text))

    def compute_score(self, data_source: str, solution_str: str, ground_truth: str,
                      extra_info: dict | None = None) -> dict:
        """1.0 for the right final answer, ``format_score`` for a wrong integer answer, else 0.0.
        Returns ``{"score", "acc", "reason", "calls"}``."""
        calls = float(solution_str.count(CALL_CLOSE))
        answer = answer_of(solution_str)
        if answer is None:
            score, reason = 0.0, "no 'A: <integer>' after the last tool result"
        elif answer != parse_int(str(ground_truth)):
            score, reason = self.format_score, "wrong answer"
        else:
            score, reason = 1.0, "ok"
        return {"score": score, "acc": float(score == 1.0), "reason": reason, "calls": calls}

