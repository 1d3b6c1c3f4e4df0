"""Fuzz the tools and rewards of the built-in tasks with hostile model output (issue "Reliability").

What the rollout does with a turn that ends in a stop string is ``task.call_tool(call_text,
state)`` (``engine/session.py``); the trainer scores every response with ``task.compute_score``
through :func:`jigsawrl.tasks.safe_score`. Both read text a model wrote, so both are thrown
random unicode, NUL bytes, surrogates, tag soup, and pathological constructions (deep nesting,
``9*9*9*...``, 10^6-character inputs, whitespace floods, unbalanced parentheses, division by
zero, huge queries, a query of every word of the corpus). Each call must:

- return (a :class:`ToolResult` whose text is a ``str`` / a finite score in ``[0, 1]``), never
  raise — the tools are called *without* their :func:`~jigsawrl.tasks.tool_guard` safety net
  (``call_tool.__wrapped__``), so the guard cannot hide a bug from this test;
- answer at most a bounded number of characters;
- finish well under 1 s (a guard against unbounded work, not a speed test: the bounds come from
  caps on size and complexity, not from timeouts).

Run it alone with ``pytest tests/tasks/test_tool_fuzz.py``; example counts are capped so that the
module takes a few seconds. Hypothesis draws new examples each run (failures are replayed from
its database and printed with a reproducer).
"""

from __future__ import annotations

import contextlib
import math
import string
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jigsawrl.tasks import (
    Example,
    Task,
    ToolResult,
    get_task,
    safe_call_tool,
    safe_score,
    segments,
    tool_guard,
)
from jigsawrl.tasks.base import BaseTask
from jigsawrl.tasks.calculator import MAX_RESULT_CHARS
from jigsawrl.tasks.corpus import tokenize
from jigsawrl.tasks.expression import CEILINGS, ArithError, Limits, evaluate
from jigsawrl.tasks.search import MAX_QUERY_CHARS, MAX_QUERY_TERMS

BOUND_S = 1.0  # per call; generous on purpose (a shared, loaded CI machine)
FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TOOL_TASKS: dict[str, Task] = {
    "calculator-easy": get_task("calculator"),
    "calculator-hard": get_task("calculator", difficulty="hard"),
    "search-easy": get_task("search"),
    "search-hard": get_task("search", difficulty="hard"),
    "search-top5": get_task("search", difficulty="hard", top_k=5),
    "arithmetic": get_task("arithmetic"),  # single turn: every call is an error
    "countdown": get_task("countdown"),
}
REWARD_TASKS: dict[str, Task] = {
    f"{name}-{level}": get_task(name, difficulty=level)
    for name in ("arithmetic", "countdown", "calculator", "search")
    for level in ("easy", "hard")
}
EXAMPLES: dict[str, list[Example]] = {
    key: task.make_dataset(6, seed=1) for key, task in {**TOOL_TASKS, **REWARD_TASKS}.items()
}


def _max_answer_chars(task: Task) -> int:
    """The longest text ``task``'s tool may answer (the bound the test asserts)."""
    error = len(getattr(task, "error_text", ""))
    if task.name == "calculator":
        return max(error, len("<r></r>") + MAX_RESULT_CHARS)
    if task.name == "search":
        longest = max(len(d) for d in task.index.docs)  # type: ignore[attr-defined]
        k = task.top_k  # type: ignore[attr-defined]
        return max(error, len("<doc></doc>") + k * longest + (k - 1))
    return error


# ----------------------------------------------------------------------------- strategies

# Pieces a confused model (or an attacker) strings together: tags of both tools, operators,
# digits of other scripts, NUL, a lone surrogate, case-folding traps, the corpus' own words.
PIECES = [
    "<calc>", "</calc>", "<search>", "</search>", "<r>", "</r>", "<doc>", "</doc>", "A:", "A: ",
    "(", ")", "+", "-", "*", "/", "**", "^", "%", "=", ".", "e9", "0", "1", "9", "12", "7/2",
    "99999999999", "999999999999", "9999999999999", " ", "\t", "\n", "\r", "\x00", "\x7f",
    "\ufeff", "\u200b", "\ud800", "é", "İ", "ß", "ﬃ", "𝟗", "٣", "１", "Ⅻ", "½", "∞", "NaN",
    "__import__('os')", "capital", "fruit", "home", "job", "of", "Kelm", "Zorv", "fig", "|",
]
pieces = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
any_unicode = st.text(st.characters(exclude_categories=()), max_size=200)  # surrogates too
printable = st.text(string.printable, max_size=200)
garbage = st.one_of(any_unicode, printable, pieces)

REPEAT = st.sampled_from([0, 1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 127, 128, 129,
                          511, 512, 513, 4300, 10**5, 10**6]) | st.integers(0, 10**6)
UNITS = ["(", ")", "-", "9*", "1+", "9", " ", "\t", "\n", "\x00", "((", "(1", "1/0+", "-(",
         "a ", "capital ", "<calc>", "</calc>", "<search>", "</search>", "é", "\ud800"]


@st.composite
def pathological(draw: Any) -> str:
    """A repeated unit (a deep nest, a long product, a flood), optionally closed and wrapped."""
    unit, n = draw(st.sampled_from(UNITS)), draw(REPEAT)
    body = unit * n
    if draw(st.booleans()):
        body = body + "9" + ")" * (n if "(" in unit else draw(st.integers(0, 3)))
    return draw(wrapped(st.just(body)))


def wrapped(bodies: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A body as a tool call of either tool (or bare), with a garbage prefix."""
    def wrap(prefix: str, tags: tuple[str, str], body: str) -> str:
        return f"{prefix}{tags[0]}{body}{tags[1]}"
    tags = st.sampled_from([("<calc>", "</calc>"), ("<search>", "</search>"), ("", ""),
                            ("<calc>", ""), ("", "</search>")])
    return st.builds(wrap, st.sampled_from(["", "x", "<r>2</r>", "A: 1"]) | printable, tags,
                     bodies)


# Near-valid calls, so that the evaluator and the ranking run too, not only the refusals.
ARITH = ["(", ")", "+", "-", "*", "/", " ", "0", "1", "2", "7", "9", "12", "99", "999999",
         "999999999999"]
arith_call = st.lists(st.sampled_from(ARITH), min_size=1, max_size=40).map(
    lambda xs: f"<calc>{''.join(xs)}</calc>")
WORDS = ["capital", "fruit", "home", "job", "of", "the", "fig", "smith", "Kelm", "zorv", ",",
         "?", " ", "  ", "A1", "\x00"] + [d.split(":")[0] for d in TOOL_TASKS["search-hard"]
                                          .index.docs[:12]]  # type: ignore[attr-defined]
search_call = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(
    lambda xs: f"<search>{' '.join(xs)}</search>")
hostile = st.one_of(garbage, wrapped(garbage), pathological(), arith_call, search_call)


# ----------------------------------------------------------------------------- tool calls

def _unguarded(task: Task) -> Any:
    """``call_tool`` without :func:`tool_guard` (a guarded built-in keeps it as __wrapped__)."""
    method = type(task).call_tool
    return getattr(method, "__wrapped__", method).__get__(task)


def _check_call(key: str, call_text: str) -> ToolResult:
    task = TOOL_TASKS[key]
    state: dict = {"example": EXAMPLES[key][0], "turn": 0}
    start = time.perf_counter()
    result = _unguarded(task)(call_text, state)
    elapsed = time.perf_counter() - start
    assert elapsed < BOUND_S, (key, call_text[:80], elapsed)
    assert isinstance(result, ToolResult) and isinstance(result.text, str)
    assert len(result.text) <= _max_answer_chars(task), (key, call_text[:80], result.text)
    assert math.isfinite(result.latency_s) and result.latency_s >= 0
    assert result.ok or result.text == task.error_text  # type: ignore[attr-defined]
    if task.multi_turn:
        assert state["calls"] == 1 and state.get("errors", 0) == (0 if result.ok else 1)
    # the guarded method (what the rollout calls) answers the same
    assert task.call_tool(call_text, {}) == result
    return result


@pytest.mark.parametrize("key", sorted(TOOL_TASKS))
@FUZZ
@given(call_text=hostile)
def test_tool_call_fuzz_never_raises_and_is_bounded(key: str, call_text: str) -> None:
    _check_call(key, call_text)


PATHOLOGICAL = {
    "empty": "",
    "empty-call": "<calc></calc>",
    "empty-query": "<search></search>",
    "whitespace-flood": "<calc>" + " " * 10**6 + "</calc>",
    "whitespace-flood-short": "<calc>" + " \t" * 20 + "1" + " " * 20 + "</calc>",
    "megabyte-digits": "<calc>" + "9" * 10**6 + "</calc>",
    "megabyte-garbage": "\x00\ud800é" * (10**6 // 3) + "</calc></search>",
    "deep-nesting-long": "<calc>" + "(" * 10**5 + "1" + ")" * 10**5 + "</calc>",
    "deep-nesting-short": "<calc>" + "(" * 17 + "1" + ")" * 17 + "</calc>",
    "unary-chain": "<calc>" + "-" * 40 + "1</calc>",
    "product-chain-fits-chars": "<calc>" + "9*" * 31 + "9</calc>",
    "product-chain-fits-tokens": "<calc>" + "9*" * 15 + "9</calc>",  # 31 tokens, 9^16: fine
    "big-products": "<calc>" + "999999999999*" * 4 + "999999999999</calc>",
    "sum-chain": "<calc>" + "1+" * 31 + "1</calc>",
    "unbalanced-open": "<calc>((1+2)</calc>",
    "unbalanced-close": "<calc>(1+2))</calc>",
    "division-by-zero": "<calc>1/0</calc>",
    "division-by-zero-late": "<calc>1/(2-2)</calc>",
    "python-syntax": "<calc>__import__('os').system('x')</calc>",
    "power": "<calc>10**10**10</calc>",
    "unicode-digits": "<calc>١+２</calc>",
    "nul-inside": "<calc>1\x00+2</calc>",
    "many-opens": "<calc>" * 10**5 + "1</calc>",
    "many-closes": "<calc>1" + "</calc>" * 10**5,
    "query-flood": "<search>" + "a " * 10**5 + "</search>",
    "query-long-word": "<search>" + "z" * 10**5 + "</search>",
    "query-nine-terms": "<search>" + " ".join(["a"] * (MAX_QUERY_TERMS + 1)) + "</search>",
    "query-at-cap": "<search>" + "x" * (MAX_QUERY_CHARS - 8) + " capital</search>",
    "query-punctuation": "<search>!!! ,,, ...</search>",
    "query-unicode": "<search>İİİ ßß ﬃ \ud800</search>",
    "tags-swapped": "</calc>1+1<calc>",
    "nested-tags": "<calc><calc>1</calc></calc>",
}


@pytest.mark.parametrize("key", sorted(TOOL_TASKS))
@pytest.mark.parametrize("case", sorted(PATHOLOGICAL))
def test_tool_call_pathological_inputs(key: str, case: str) -> None:
    result = _check_call(key, PATHOLOGICAL[case])
    if case in MUST_FAIL:
        assert not result.ok, (key, case, result.text)


MUST_FAIL = {  # refused by every tool (either it is not this tool's call, or a cap refuses it)
    "empty", "empty-call", "empty-query", "whitespace-flood", "megabyte-digits",
    "megabyte-garbage", "deep-nesting-long", "deep-nesting-short", "unary-chain",
    "product-chain-fits-chars", "big-products", "sum-chain", "unbalanced-open",
    "unbalanced-close", "division-by-zero", "division-by-zero-late", "python-syntax", "power",
    "unicode-digits", "nul-inside", "many-closes", "query-flood", "query-long-word",
    "query-nine-terms", "query-punctuation", "tags-swapped", "nested-tags",
}


@pytest.mark.parametrize("key", ["search-easy", "search-hard", "search-top5"])
def test_search_query_of_every_corpus_word_is_refused(key: str) -> None:
    task = TOOL_TASKS[key]
    words = sorted({w for doc in task.index.docs for w in tokenize(doc)})  # type: ignore[attr-defined]
    for query in (" ".join(words), " ".join(words[:MAX_QUERY_TERMS + 1]), " ".join(words * 50)):
        assert not _check_call(key, f"<search>{query}</search>").ok
    # the index itself, asked directly for the whole corpus, ranks it quickly
    start = time.perf_counter()
    assert task.index.top(" ".join(words), 5)  # type: ignore[attr-defined]
    assert time.perf_counter() - start < BOUND_S


def test_calculator_caps_tokens_not_just_characters() -> None:
    calc = TOOL_TASKS["calculator-easy"]
    assert _check_call("calculator-easy", "<calc>" + "1+" * 15 + "1</calc>").text == "<r>16</r>"
    assert not _check_call("calculator-easy", "<calc>" + "1+" * 16 + "1</calc>").ok  # 33 tokens
    assert calc.call_tool("<calc>" + "9*" * 12 + "9</calc>", {}).text == f"<r>{9**13}</r>"


# ----------------------------------------------------------------------------- rewards

def _check_score(key: str, response: str, index: int) -> None:
    task = REWARD_TASKS[key]
    ex = EXAMPLES[key][index % len(EXAMPLES[key])]
    start = time.perf_counter()
    result = task.compute_score(ex.data_source, response, ex.ground_truth, ex.extra_info)
    assert time.perf_counter() - start < BOUND_S, (key, response[:80])
    assert isinstance(result, dict)
    score = result["score"]
    assert isinstance(score, float) and math.isfinite(score) and 0.0 <= score <= 1.0
    assert score in (0.0, task.format_score, 1.0)  # type: ignore[attr-defined]
    assert result["acc"] == float(score == 1.0)
    if "calls" in result:
        assert math.isfinite(result["calls"]) and result["calls"] >= 0
    safe, info = safe_score(task, response, ex)
    assert safe == score and "error" not in info  # the reward itself did not fail


@st.composite
def mangled_demo(draw: Any, key: str) -> tuple[str, int]:
    """A correct demo with garbage spliced in, cut, or a huge tail: close to a real response."""
    index = draw(st.integers(0, 5))
    demo = EXAMPLES[key][index % len(EXAMPLES[key])].demo
    cut = draw(st.integers(0, len(demo)))
    junk = draw(st.one_of(garbage, pathological()))
    text = draw(st.sampled_from([demo[:cut] + junk + demo[cut:], demo[:cut] + junk, junk + demo,
                                 demo + junk, demo[:cut]]))
    return text, index


@pytest.mark.parametrize("key", sorted(REWARD_TASKS))
@FUZZ
@given(response=hostile, index=st.integers(0, 5))
def test_reward_fuzz_is_finite_and_in_range(key: str, response: str, index: int) -> None:
    _check_score(key, response, index)


@pytest.mark.parametrize("key", sorted(REWARD_TASKS))
@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_reward_fuzz_on_mangled_demos(key: str, data: st.DataObject) -> None:
    response, index = data.draw(mangled_demo(key))
    _check_score(key, response, index)


@pytest.mark.parametrize("key", sorted(REWARD_TASKS))
@pytest.mark.parametrize("case", sorted(PATHOLOGICAL))
def test_reward_pathological_responses(key: str, case: str) -> None:
    text = PATHOLOGICAL[case]
    for response in (text, text + "A: 1", text + "=1", "A: " + text, text.replace("calc", "r")):
        _check_score(key, response, 0)


# ----------------------------------------------------------------------------- the evaluator

LIMIT_SETS = [Limits(), Limits(max_chars=64, max_tokens=32, max_depth=16, max_bits=128),
              Limits(**CEILINGS), Limits(max_chars=1, max_tokens=1, max_depth=1, max_digits=1,
                                         max_bits=1)]


@FUZZ
@given(text=st.one_of(garbage, pathological()), which=st.integers(0, len(LIMIT_SETS) - 1))
def test_evaluator_raises_only_arith_error(text: str, which: int) -> None:
    start = time.perf_counter()
    with contextlib.suppress(ArithError):
        evaluate(text, LIMIT_SETS[which])
    assert time.perf_counter() - start < BOUND_S


def test_evaluator_at_its_ceilings_stays_bounded() -> None:
    """With every limit at its ceiling, no input reaches Python's recursion or int() limits."""
    widest = Limits(**CEILINGS)
    for text in ["1+" * 10**5 + "1", "(" * 65 + "1" + ")" * 65, "-" * 65 + "1", "9" * 1001,
                 "9*" * 300 + "9", "(" * 10**5, "1" * 10**6]:
        start = time.perf_counter()
        with pytest.raises(ArithError):
            evaluate(text, widest)
        assert time.perf_counter() - start < BOUND_S
    assert evaluate("1+" * 255 + "1", widest) == 256  # 511 tokens: the longest chain allowed
    assert evaluate("-(" * 21 + "1" + ")" * 21, widest) == -1


@pytest.mark.parametrize("bad", [{"max_tokens": 0}, {"max_tokens": 513}, {"max_depth": 65},
                                 {"max_digits": 4300}, {"max_chars": 10**7}, {"max_bits": 0},
                                 {"max_chars": 1.5}])
def test_limits_refuse_bounds_beyond_their_ceilings(bad: dict) -> None:
    with pytest.raises(ValueError, match="Limits"):
        Limits(**bad)


# ----------------------------------------------------------------------------- the safety nets

@pytest.mark.parametrize("key", ["calculator-hard", "search-top5"])
@settings(FUZZ, max_examples=50)
@given(response=st.one_of(garbage, pathological()))
def test_segments_fuzz_never_raises_and_covers_the_response(key: str, response: str) -> None:
    parts = segments(TOOL_TASKS[key], response)
    assert "".join(text for text, _ in parts) == response


class _Raising(BaseTask):
    name, multi_turn, stop, error_text = "test-raising", True, ("</x>",), "<e/>"

    @tool_guard
    def call_tool(self, call_text: str, state: dict) -> ToolResult:
        raise RecursionError("a bug")


class _Unguarded(BaseTask):
    name, multi_turn, stop = "test-unguarded", True, ("</x>",)

    def call_tool(self, call_text: str, state: dict) -> Any:
        if call_text == "raise":
            raise KeyError(call_text)
        return ToolResult("fine", ok=True) if call_text == "ok" else "not a ToolResult"


def test_tool_guard_and_safe_call_tool_turn_bugs_into_error_results(caplog) -> None:
    state: dict = {}
    assert _Raising(tool_latency_s=0.5).call_tool("x", state) == ToolResult("<e/>", False, 0.5)
    assert state == {"errors": 1}
    user = _Unguarded()
    for text in ("raise", "other"):
        result = safe_call_tool(user, text, state)
        assert result == ToolResult(BaseTask.error_text, ok=False)
    assert state["errors"] == 3
    assert safe_call_tool(user, "ok", state) == ToolResult("fine", ok=True)
    assert safe_call_tool(user, "raise", None).ok is False  # type: ignore[arg-type]
    assert "test-unguarded" in caplog.text and "KeyError" in caplog.text
