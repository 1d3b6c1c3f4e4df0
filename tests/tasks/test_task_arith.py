"""The safe arithmetic evaluator: agrees with Python arithmetic, and refuses hostile input fast."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jigsawrl.tasks.expression import (
    ArithError,
    BinOp,
    Limits,
    Neg,
    Num,
    eval_node,
    evaluate,
    format_number,
    literals,
    parse,
    render,
)

# Small expression trees, with their exact value computed independently of the module.
leaves = st.integers(0, 999).map(lambda v: (str(v), Fraction(v)))


def _combine(children: st.SearchStrategy) -> st.SearchStrategy:
    def build(a: tuple[str, Fraction], op: str, b: tuple[str, Fraction]):
        if op == "/" and b[1] == 0:
            return (f"({a[0]})+({b[0]})", a[1] + b[1])
        value = {"+": a[1] + b[1], "-": a[1] - b[1], "*": a[1] * b[1]}.get(op)
        return (f"({a[0]}){op}({b[0]})", a[1] / b[1] if value is None else value)

    unary = children.map(lambda a: (f"-({a[0]})", -a[1]))
    return st.builds(build, children, st.sampled_from("+-*/"), children) | unary


expressions = st.recursive(leaves, _combine, max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(expressions)
def test_evaluator_matches_python_arithmetic(case: tuple[str, Fraction]) -> None:
    text, expected = case
    assert evaluate(text, Limits(max_chars=400)) == expected
    # cross-check with Python's own arithmetic on our generated text (tests only)
    if "/" not in text:
        assert eval(text) == expected  # noqa: S307 - trusted, generated here
    # rendering with minimal parentheses keeps the value
    node = parse(text, Limits(max_chars=400))
    assert evaluate(render(node), Limits(max_chars=400)) == expected


@pytest.mark.parametrize(
    "text, value",
    [("1+2*3", 7), ("(1+2)*3", 9), ("8-3-2", 3), ("8/4/2", 1), ("7/2", Fraction(7, 2)),
     ("-3+5", 2), ("2*-3", -6), (" 12 * 7 ", 84), ("--4", 4)],
)
def test_precedence_and_associativity(text: str, value: Fraction) -> None:
    assert evaluate(text) == value


@pytest.mark.parametrize(
    "text",
    ["__import__('os')", "10**10**10", "1/0", "(1+2", "1+2)", "", "   ", "1+", "abc", "2^3",
     "1.5+2", "(" * 1000 + "1" + ")" * 1000, "9" * 5000, "1+" * 3000 + "1", "9" * 13,
     "(" * 40 + "1" + ")" * 40, "-" * 60 + "1", "99999999999*" * 9 + "9", "1\x00+2", "1e9"],
)
def test_hostile_input_is_refused_quickly(text: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ArithError):
        evaluate(text)
    assert time.perf_counter() - start < 1.0  # a guard against hangs, not a speed test


def test_bounds_are_enforced() -> None:
    with pytest.raises(ArithError, match="bits"):
        evaluate("999999*999999*999999*999999", Limits(max_bits=64))
    with pytest.raises(ArithError, match="longer"):
        evaluate("1+1", Limits(max_chars=2))
    with pytest.raises(ArithError, match="nesting"):
        evaluate("((1))", Limits(max_depth=1))


def test_literals_format_and_render() -> None:
    node = parse("(3+5)*7-2")
    assert literals(node) == [3, 5, 7, 2]
    assert render(BinOp("-", Num(8), BinOp("-", Num(3), Num(2)))) == "8-(3-2)"
    assert render(BinOp("*", BinOp("+", Num(1), Num(2)), Num(3))) == "(1+2)*3"
    assert render(Neg(BinOp("+", Num(1), Num(2)))) == "-(1+2)"
    assert format_number(Fraction(7, 2)) == "7/2" and format_number(Fraction(-4)) == "-4"
    assert eval_node(parse(format_number(Fraction(7, 2)))) == Fraction(7, 2)
