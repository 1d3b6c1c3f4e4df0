"""Countdown: reach a target number with the given numbers and ``+ - * /`` (single turn).

The CPU-sized counterpart of the TinyZero / verl countdown workload. Every example is generated
from a known solution, so it is always solvable and its demo is that solution::

    prompt  "3 5 7 -> 22\\n"          numbers in sampled order, then the target
    demo    "3*5+7=22"                an expression, "=", the target

Reward (rule-based, TinyZero's scheme): 1.0 when the expression (the text before the last ``=``)
uses each given number at most once and evaluates exactly to the target (and the integer after
``=``, which may be omitted, is that target); ``format_score`` (0.1) when it is a well-formed
expression that misses (wrong value, numbers not allowed, wrong claimed result); 0.0 when it does
not parse. Expressions are evaluated by the safe evaluator of :mod:`jigsawrl.tasks.expression`;
division is exact (rational), as in the standard game where only exact divisions are useful.

Difficulty presets (``easy`` / ``medium`` / ``hard``) set how many numbers there are, how large
they are and how large the target may be; each can be overridden.
"""

from __future__ import annotations

import json
import random
from collections import Counter
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
from jigsawrl.tasks.expression import (
    ArithError,
    BinOp,
    Limits,
    Node,
    Num,
    eval_node,
    literals,
    parse,
)
from jigsawrl.tasks.expression import render as render_expr

PRESETS: dict[str, dict[str, Any]] = {
    "easy": {"num_numbers": 3, "max_number": 9, "max_target": 99},
    "medium": {"num_numbers": 3, "max_number": 20, "max_target": 200},
    "hard": {"num_numbers": 4, "max_number": 25, "max_target": 500},
}
LIMITS = Limits(max_chars=64, max_digits=6, max_depth=16, max_bits=64)


def parse_ground_truth(ground_truth: str | dict) -> tuple[list[int], int]:
    """``(numbers, target)`` from the JSON ground truth (a dict is accepted too)."""
    gt = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    return [int(x) for x in gt["numbers"]], int(gt["target"])


@register_task("countdown")
class CountdownTask(BaseTask):
    """Countdown (see module docstring).

    Args:
        difficulty: preset name.
        num_numbers, max_number, max_target: override the preset (numbers are 1..max_number).
        test_fraction: share of the prompt space reserved for the test split.
        format_score, tool_latency_s, tool_latency_jitter: see :class:`BaseTask`.
    """

    multi_turn = False
    max_turns = 1
    stop = ()
    max_response_chars = 32

    def __init__(self, difficulty: str = "easy", num_numbers: int | None = None,
                 max_number: int | None = None, max_target: int | None = None,
                 test_fraction: float = 0.2, format_score: float = 0.1,
                 tool_latency_s: float = 0.0, tool_latency_jitter: float = 0.0) -> None:
        super().__init__(tool_latency_s, tool_latency_jitter, format_score)
        p = resolve_preset(PRESETS, difficulty, num_numbers=num_numbers, max_number=max_number,
                           max_target=max_target)
        if not 2 <= p["num_numbers"] <= 6:
            raise ValueError(f"num_numbers must be in 2..6, got {p['num_numbers']}")
        if not 2 <= p["max_number"] <= 999 or p["max_target"] < 2:
            raise ValueError("need 2 <= max_number <= 999 and max_target >= 2")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        self.num_numbers: int = p["num_numbers"]
        self.max_number: int = p["max_number"]
        self.max_target: int = p["max_target"]
        self.test_fraction = test_fraction
        self.max_response_chars = 8 * self.num_numbers + 8

    def make_dataset(self, n: int, seed: int, split: str = "train") -> list[Example]:
        """``n`` solvable examples, deterministic per ``(seed, split)``; splits are disjoint."""
        return sample_examples(self.name, self._make_one, n, seed, split, self.test_fraction)

    def _make_one(self, rng: random.Random) -> Example:
        while True:
            nums = [rng.randint(1, self.max_number) for _ in range(self.num_numbers)]
            solution = self._random_solution(rng, nums)
            if solution is not None and 1 < solution[1] <= self.max_target \
                    and solution[1] not in nums:
                break
        node, t = solution
        prompt = " ".join(map(str, nums)) + f" -> {t}\n"
        gt = json.dumps({"numbers": nums, "target": t}, separators=(",", ":"))
        return Example(prompt, gt, self.name, {"numbers": nums, "target": t},
                       f"{render_expr(node)}={t}")

    @staticmethod
    def _random_solution(rng: random.Random, nums: list[int]) -> tuple[Node, int] | None:
        """A left-deep expression over all ``nums`` in random order and its value; None if a
        step goes negative (keeps demos simple). Divisions are only drawn when exact."""
        order = rng.sample(nums, len(nums))
        node: Node = Num(order[0])
        value = order[0]
        for x in order[1:]:
            op = rng.choice("+-*/" if x > 1 and value % x == 0 else "+-*")
            value = {"+": value + x, "-": value - x, "*": value * x}.get(op, value // x)
            if value < 0:
                return None
            node = BinOp(op, node, Num(x))
        return node, value

    def compute_score(self, data_source: str, solution_str: str, ground_truth: str,
                      extra_info: dict | None = None) -> dict:
        """1.0 if the expression reaches the target with allowed numbers, ``format_score`` if it
        is well-formed but misses, 0.0 otherwise. Returns ``{"score", "acc", "reason"}``."""
        numbers, target = parse_ground_truth(ground_truth)
        line = first_line(solution_str).strip()
        expr_text, eq, claim = line.rpartition("=")
        if not eq:
            expr_text, claim = line, ""
        if eq and parse_int(claim) is None:
            return _result(0.0, "the text after '=' is not an integer")
        try:
            node = parse(expr_text, LIMITS)
            value = eval_node(node, LIMITS)
        except ArithError as exc:
            return _result(0.0, f"not an expression: {exc}")
        if Counter(literals(node)) - Counter(numbers):
            return _result(self.format_score, "uses numbers not given (or too often)")
        if value != target:
            return _result(self.format_score, "wrong value")
        if eq and parse_int(claim) != target:
            return _result(self.format_score, "the claimed result is not the expression's value")
        return _result(1.0, "ok")


def _result(score: float, reason: str) -> dict:
    return {"score": score, "acc": float(score == 1.0), "reason": reason}
