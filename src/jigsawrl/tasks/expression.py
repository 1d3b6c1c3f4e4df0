"""A safe, bounded evaluator for integer arithmetic: ``+ - * /``, unary minus and parentheses.

Reward functions and the calculator tool evaluate text written by a model, so they must never call
``eval``: this module scans the text into tokens, parses it with a small recursive-descent parser
into a tree (:class:`Num`, :class:`Neg`, :class:`BinOp`) and evaluates the tree with exact
rational arithmetic (:class:`fractions.Fraction`), so ``7/2*2`` is exactly 7 and there are no float
surprises. Every resource is bounded by :class:`Limits` before any work grows with it:

- input length (``max_chars``) is checked before scanning;
- the number of tokens (``max_tokens``: numbers, operators, parentheses) is counted while
  scanning, so the number of operations, and with it the height of the tree that the recursive
  evaluator walks, is bounded whatever ``max_chars`` is;
- integer literals have at most ``max_digits`` digits (no ``10**10**10``: ``**`` is not syntax);
- nesting depth (parentheses and unary minus) is at most ``max_depth``, far below Python's
  recursion limit;
- every intermediate numerator and denominator has at most ``max_bits`` bits, so products stay
  cheap (``9*9*9*...`` fails on its first too-large product, not after building a huge number).

:class:`Limits` itself refuses bounds above hard ceilings (:data:`CEILINGS`), so no
configuration can make the evaluator recurse near Python's limit or parse a literal longer than
``int()`` accepts. Nothing here relies on a timeout: each bound is checked before the work it
bounds grows.

Anything else (unknown characters, unbalanced parentheses, division by zero, a bound exceeded)
raises :class:`ArithError`, a ``ValueError`` whose message is short and safe to log. Grammar::

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := INT | '(' expr ')' | '-' factor
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

_OPS = "+-*/"
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


class ArithError(ValueError):
    """The text is not a valid bounded arithmetic expression, or evaluating it failed."""


# Hard ceilings on each bound of Limits (inclusive). max_tokens bounds the tree height (at most
# max_tokens / 2 binary operations) and max_depth the parser's recursion (three frames a level),
# both far below Python's default recursion limit of 1000; max_digits stays below CPython's
# 4300-digit int() limit; max_bits keeps a product of two bounded values microseconds cheap.
CEILINGS: dict[str, int] = {"max_chars": 1_000_000, "max_tokens": 512, "max_digits": 1000,
                            "max_depth": 64, "max_bits": 65_536}


@dataclass(frozen=True)
class Limits:
    """Bounds on the evaluator's input and work (all inclusive).

    ``max_tokens`` defaults to 512, which never binds under the default ``max_chars`` of 128 (a
    token is at least one character); it bounds the work of callers that allow longer text.

    Raises:
        ValueError: a bound below 1 or above its ceiling in :data:`CEILINGS`.
    """

    max_chars: int = 128
    max_digits: int = 12
    max_depth: int = 32
    max_bits: int = 256
    max_tokens: int = 512

    def __post_init__(self) -> None:
        for name, ceiling in CEILINGS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= ceiling:
                raise ValueError(f"Limits.{name} must be an int in 1..{ceiling}, got {value!r}")


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Num:
    value: int


@dataclass(frozen=True)
class Neg:
    operand: Node


@dataclass(frozen=True)
class BinOp:
    op: str
    left: Node
    right: Node


Node = Num | Neg | BinOp


def _short(text: str, n: int = 12) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def tokenize(text: str, limits: Limits = DEFAULT_LIMITS) -> list[str | int]:
    """Split ``text`` into ints and one-character operator / parenthesis tokens.

    Raises:
        ArithError: text too long, too many tokens, a literal too long, or a character outside
            the grammar.
    """
    if len(text) > limits.max_chars:
        raise ArithError(f"expression longer than {limits.max_chars} chars")
    tokens: list[str | int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
            continue
        if len(tokens) == limits.max_tokens:  # one more token is about to be read
            raise ArithError(f"expression of more than {limits.max_tokens} tokens")
        if c in "0123456789":
            j = i
            while j < n and text[j] in "0123456789":
                j += 1
            if j - i > limits.max_digits:
                raise ArithError(f"number longer than {limits.max_digits} digits")
            tokens.append(int(text[i:j]))
            i = j
        elif c in _OPS or c in "()":
            tokens.append(c)
            i += 1
        else:
            raise ArithError(f"unexpected character {_short(c)}")
    if not tokens:
        raise ArithError("empty expression")
    return tokens


class _Parser:
    """Recursive-descent parser over a token list; depth is counted, never unbounded."""

    def __init__(self, tokens: list[str | int], limits: Limits) -> None:
        self.tokens = tokens
        self.pos = 0
        self.limits = limits

    def peek(self) -> str | int | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str | int | None:
        tok = self.peek()
        self.pos += 1
        return tok

    def expr(self, depth: int) -> Node:
        node = self.term(depth)
        while self.peek() in ("+", "-"):
            op = str(self.take())
            node = BinOp(op, node, self.term(depth))
        return node

    def term(self, depth: int) -> Node:
        node = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = str(self.take())
            node = BinOp(op, node, self.factor(depth))
        return node

    def factor(self, depth: int) -> Node:
        if depth > self.limits.max_depth:
            raise ArithError(f"nesting deeper than {self.limits.max_depth}")
        tok = self.take()
        if isinstance(tok, int):
            return Num(tok)
        if tok == "(":
            node = self.expr(depth + 1)
            if self.take() != ")":
                raise ArithError("unbalanced parentheses")
            return node
        if tok == "-":
            return Neg(self.factor(depth + 1))
        raise ArithError("unexpected end" if tok is None else f"unexpected {_short(str(tok))}")


def parse(text: str, limits: Limits = DEFAULT_LIMITS) -> Node:
    """Parse ``text`` into an expression tree.

    Raises:
        ArithError: the text is not a complete expression within ``limits``.
    """
    parser = _Parser(tokenize(text, limits), limits)
    node = parser.expr(0)
    if parser.peek() is not None:
        tok = parser.peek()
        raise ArithError("unbalanced parentheses" if tok == ")" else f"unexpected {tok!r}")
    return node


def _check(value: Fraction, limits: Limits) -> Fraction:
    if (value.numerator.bit_length() > limits.max_bits
            or value.denominator.bit_length() > limits.max_bits):
        raise ArithError(f"intermediate value larger than {limits.max_bits} bits")
    return value


def apply_op(op: str, left: Fraction, right: Fraction, limits: Limits = DEFAULT_LIMITS) -> Fraction:
    """``left op right`` exactly; raises :class:`ArithError` on division by zero or overflow."""
    if op == "+":
        return _check(left + right, limits)
    if op == "-":
        return _check(left - right, limits)
    if op == "*":
        return _check(left * right, limits)
    if op != "/":
        raise ArithError(f"unknown operator {_short(op)}")
    if right == 0:
        raise ArithError("division by zero")
    return _check(left / right, limits)


def eval_node(node: Node, limits: Limits = DEFAULT_LIMITS) -> Fraction:
    """Evaluate a tree exactly; raises :class:`ArithError` on division by zero or overflow."""
    if isinstance(node, Num):
        return _check(Fraction(node.value), limits)
    if isinstance(node, Neg):
        return -eval_node(node.operand, limits)
    return apply_op(node.op, eval_node(node.left, limits), eval_node(node.right, limits), limits)


def evaluate(text: str, limits: Limits = DEFAULT_LIMITS) -> Fraction:
    """Parse and evaluate ``text`` exactly. Never calls ``eval``; bounded by ``limits``.

    Raises:
        ArithError: invalid syntax, a bound exceeded, or division by zero.
    """
    return eval_node(parse(text, limits), limits)


def literals(node: Node) -> list[int]:
    """The integer literals of a tree, left to right (what countdown checks against its numbers)."""
    if isinstance(node, Num):
        return [node.value]
    if isinstance(node, Neg):
        return literals(node.operand)
    return literals(node.left) + literals(node.right)


def format_number(value: Fraction) -> str:
    """``12``, ``-7``, or a reduced fraction ``7/2`` (which :func:`evaluate` reads back exactly)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


def render(node: Node) -> str:
    """Write a tree with the fewest parentheses that keep its meaning (no spaces)."""
    if isinstance(node, Num):
        return str(node.value)
    if isinstance(node, Neg):
        inner = render(node.operand)
        return f"-({inner})" if isinstance(node.operand, BinOp) else f"-{inner}"
    prec = _PREC[node.op]
    left, right = render(node.left), render(node.right)
    if isinstance(node.left, BinOp) and _PREC[node.left.op] < prec:
        left = f"({left})"
    if isinstance(node.right, BinOp) and (
        _PREC[node.right.op] < prec or (_PREC[node.right.op] == prec and node.op in "-/")
    ):
        right = f"({right})"
    if isinstance(node.right, Neg):
        right = f"({right})"
    return f"{left}{node.op}{right}"
