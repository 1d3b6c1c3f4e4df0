"""Arithmetic word problems: a GSM8K-like task shrunk to what a tiny character-level LM can learn.

Single turn. A short templated story with one or two operations; the response is the equation
that solves it, whose last number is the answer::

    prompt  "Ann has 12 figs, gets 7 more. Total?\\n"
    demo    "12+7=19"

Reward (rule-based): the answer is the integer after the last ``=`` of the response's first
line; 1.0 when it equals the ground truth, ``format_score`` (0.1) when the response has the form
``<expression>=<integer>`` but the answer is wrong, 0.0 otherwise. The equation itself is not
checked (as in GSM8K rewards, only the final answer counts).

Difficulty presets: ``easy`` (one operation, numbers up to 20), ``medium`` (up to 50, half of the
problems with two operations), ``hard`` (up to 99, always two operations).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from jigsawrl.tasks.base import (
    BaseTask,
    Example,
    first_line,
    parse_int,
    register_task,
    resolve_preset,
    sample_examples,
)
from jigsawrl.tasks.expression import ArithError, Limits, parse

PRESETS: dict[str, dict[str, Any]] = {
    "easy": {"max_value": 20, "two_step_fraction": 0.0},
    "medium": {"max_value": 50, "two_step_fraction": 0.5},
    "hard": {"max_value": 99, "two_step_fraction": 1.0},
}
NAMES = ("Ann", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Ivy", "Jo", "Kim")
ITEMS = ("figs", "pens", "cups", "eggs", "hats", "jars", "nuts", "owls")
LIMITS = Limits(max_chars=32, max_digits=6, max_depth=8, max_bits=64)

# A problem: (prompt without "\n", equation without "=answer", answer).
Problem = tuple[str, str, int]


def _add(rng: random.Random, m: int, who: str, it: str) -> Problem:
    a, b = rng.randint(1, m), rng.randint(1, m)
    return f"{who} has {a} {it}, gets {b} more. Total?", f"{a}+{b}", a + b


def _sub(rng: random.Random, m: int, who: str, it: str) -> Problem:
    a = rng.randint(2, m)
    b = rng.randint(1, a - 1)
    return f"{who} has {a} {it}, loses {b}. Left?", f"{a}-{b}", a - b


def _mul(rng: random.Random, m: int, who: str, it: str) -> Problem:
    a, b = rng.randint(2, min(m, 12)), rng.randint(2, m)
    return f"{who} has {a} bags of {b} {it}. Total?", f"{a}*{b}", a * b


def _div(rng: random.Random, m: int, who: str, it: str) -> Problem:
    b, q = rng.randint(2, min(m, 12)), rng.randint(1, m)
    return f"{who} splits {b * q} {it} into {b} bags. Each?", f"{b * q}/{b}", q


def _add_sub(rng: random.Random, m: int, who: str, it: str) -> Problem:
    a, b = rng.randint(1, m), rng.randint(1, m)
    c = rng.randint(1, a + b - 1)
    return f"{who} has {a} {it}, gets {b}, loses {c}. Left?", f"{a}+{b}-{c}", a + b - c


def _mul_sub(rng: random.Random, m: int, who: str, it: str) -> Problem:
    a, b = rng.randint(2, min(m, 9)), rng.randint(2, m)
    c = rng.randint(1, a * b - 1)
    return f"{who} has {a} bags of {b} {it}, loses {c}. Left?", f"{a}*{b}-{c}", a * b - c


ONE_STEP: tuple[Callable[..., Problem], ...] = (_add, _sub, _mul, _div)
TWO_STEP: tuple[Callable[..., Problem], ...] = (_add_sub, _mul_sub)


@register_task("arithmetic")
class ArithmeticTask(BaseTask):
    """Arithmetic word problems (see module docstring).

    Args:
        difficulty: preset name.
        max_value: largest number in a story (overrides the preset).
        two_step_fraction: share of two-operation problems (overrides the preset).
        test_fraction: share of the prompt space reserved for the test split.
        format_score, tool_latency_s, tool_latency_jitter: see :class:`BaseTask`.
    """

    multi_turn = False
    max_turns = 1
    stop = ()
    max_response_chars = 32

    def __init__(self, difficulty: str = "easy", max_value: int | None = None,
                 two_step_fraction: float | None = None, test_fraction: float = 0.2,
                 format_score: float = 0.1, tool_latency_s: float = 0.0,
                 tool_latency_jitter: float = 0.0) -> None:
        super().__init__(tool_latency_s, tool_latency_jitter, format_score)
        p = resolve_preset(PRESETS, difficulty, max_value=max_value,
                           two_step_fraction=two_step_fraction)
        if not 2 <= p["max_value"] <= 99:
            raise ValueError(f"max_value must be in 2..99 (short prompts), got {p['max_value']}")
        if not 0 <= p["two_step_fraction"] <= 1:
            raise ValueError("two_step_fraction must be in [0, 1]")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        self.max_value: int = p["max_value"]
        self.two_step_fraction: float = p["two_step_fraction"]
        self.test_fraction = test_fraction

    def make_dataset(self, n: int, seed: int, split: str = "train") -> list[Example]:
        """``n`` problems, deterministic per ``(seed, split)``; splits are disjoint."""
        return sample_examples(self.name, self._make_one, n, seed, split, self.test_fraction)

    def _make_one(self, rng: random.Random) -> Example:
        two = rng.random() < self.two_step_fraction
        template = rng.choice(TWO_STEP if two else ONE_STEP)
        text, equation, answer = template(rng, self.max_value, rng.choice(NAMES),
                                          rng.choice(ITEMS))
        return Example(f"{text}\n", str(answer), self.name,
                       {"equation": equation, "steps": 2 if two else 1}, f"{equation}={answer}")

    def compute_score(self, data_source: str, solution_str: str, ground_truth: str,
                      extra_info: dict | None = None) -> dict:
        """1.0 for the right final answer, ``format_score`` for a wrong but well-formed
        ``expr=int`` line, 0.0 otherwise. Returns ``{"score", "acc", "reason"}``."""
        truth = parse_int(str(ground_truth))
        expr_text, eq, answer_text = first_line(solution_str).strip().rpartition("=")
        answer = parse_int(answer_text)
        if not eq or answer is None:
            return _result(0.0, "no '<expression>=<integer>' answer")
        try:
            parse(expr_text, LIMITS)
        except ArithError as exc:
            return _result(0.0, f"not an expression: {exc}")
        if answer != truth:
            return _result(self.format_score, "wrong answer")
        return _result(1.0, "ok")


def _result(score: float, reason: str) -> dict:
    return {"score": score, "acc": float(score == 1.0), "reason": reason}
