"""The built-in tasks: demos are correct and consistent with the tools, texts are short and
printable, wrong answers lose reward, and hostile tool calls get a defined answer quickly."""

from __future__ import annotations

import string
import time

import pytest

from jigsawrl.tasks import Example, Task, get_task, safe_score, segments

TASKS = ["countdown", "arithmetic", "calculator", "search"]
DIFFICULTIES = ["easy", "medium", "hard"]
ALLOWED = set(string.printable) - set("\t\r\x0b\x0c")


def _replay(task: Task, ex: Example) -> int:
    """Re-run the demo's tool calls through ``task.call_tool``: each inserted text must be exactly
    what the tool answers. Returns the number of calls."""
    demo, pos, calls, state = ex.demo, 0, 0, {}
    while True:
        ends = [(demo.find(s, pos), s) for s in task.stop if demo.find(s, pos) >= 0]
        if not ends:
            return calls
        idx, stop = min(ends)
        cut = idx + len(stop)
        result = task.call_tool(demo[pos:cut], state)
        assert result.ok, (ex.demo, demo[pos:cut])
        assert demo[cut:].startswith(result.text), (ex.demo, result.text)
        pos, calls = cut + len(result.text), calls + 1


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
@pytest.mark.parametrize("name", TASKS)
def test_demos_score_one_and_replay_through_the_tool(name: str, difficulty: str) -> None:
    task = get_task(name, difficulty=difficulty)
    data = task.make_dataset(60, seed=3) + task.make_dataset(20, seed=3, split="test")
    for ex in data:
        assert safe_score(task, ex.demo, ex)[0] == 1.0, ex
        assert ex.data_source == name and ex.prompt.endswith("\n")
        assert set(ex.prompt + ex.demo) <= ALLOWED and "\n" not in ex.demo
        assert len(ex.demo) <= task.max_response_chars
        calls = _replay(task, ex)
        assert calls == 0 if not task.multi_turn else 1 <= calls < task.max_turns


@pytest.mark.parametrize("name", TASKS)
def test_default_sizes_fit_a_tiny_char_model(name: str) -> None:
    task = get_task(name)
    data = task.make_dataset(200, seed=0)
    assert max(len(e.prompt) for e in data) <= 48
    limit = 160 if task.multi_turn else 32
    assert max(len(e.demo) for e in data) <= limit
    assert task.max_response_chars <= (200 if task.multi_turn else 32)


@pytest.mark.parametrize("name", TASKS)
def test_datasets_are_deterministic_and_splits_disjoint(name: str) -> None:
    task = get_task(name, difficulty="medium")
    train = task.make_dataset(50, seed=7)
    assert train == get_task(name, difficulty="medium").make_dataset(50, seed=7)
    test = task.make_dataset(20, seed=7, split="test")
    assert not {e.prompt for e in train} & {e.prompt for e in test}


@pytest.mark.parametrize("name", TASKS)
def test_wrong_and_garbage_answers_score_below_one(name: str) -> None:
    task = get_task(name)
    for ex in task.make_dataset(20, seed=5):
        head, sep, answer = ex.demo.rpartition("=" if not task.multi_turn else "A: ")
        wrong = f"{head}{sep}{int(answer) + 1}" if answer.isdigit() else f"{head}{sep}Xyzzy"
        assert safe_score(task, wrong, ex)[0] < 1.0
        for junk in ["", "\n", "A:", "=", "x" * 10_000, "__import__('os')", head + sep]:
            score, _ = safe_score(task, junk, ex)
            assert 0.0 <= score < 1.0


def test_partial_rewards() -> None:
    cd = get_task("countdown")
    ex = Example("3 5 7 -> 22\n", '{"numbers":[3,5,7],"target":22}', "countdown", {}, "3*5+7=22")
    assert cd.compute_score("countdown", "3*5+7=22", ex.ground_truth)["score"] == 1.0
    assert cd.compute_score("countdown", "(3*5)+7", ex.ground_truth)["score"] == 1.0
    assert cd.compute_score("countdown", "3*5+7=22\ngarbage", ex.ground_truth)["score"] == 1.0
    assert cd.compute_score("countdown", "3+5+7=15", ex.ground_truth)["score"] == 0.1
    # 0 is not one of the given numbers
    assert cd.compute_score("countdown", "3*5+7+0=22", ex.ground_truth)["score"] == 0.1
    assert cd.compute_score("countdown", "3*5*1+7=22", ex.ground_truth)["score"] == 0.1
    assert cd.compute_score("countdown", "7*3+5-7+3=22", ex.ground_truth)["score"] == 0.1
    assert cd.compute_score("countdown", "3*5+7=x", ex.ground_truth)["score"] == 0.0
    assert cd.compute_score("countdown", "3*/5", ex.ground_truth)["score"] == 0.0
    calc = get_task("calculator")
    assert calc.compute_score("calculator", "<calc>1+1</calc><r>2</r>A: 3", "2")["score"] == 0.1
    assert calc.compute_score("calculator", "A: 2", "2")["score"] == 1.0
    # an "A:" inside a tool result does not count as the answer
    assert calc.compute_score("calculator", "A: 2<calc>1</calc><r>1</r>", "2")["score"] == 0.0
    search = get_task("search")
    assert search.compute_score("search", "A: kelm.", "Kelm")["score"] == 1.0


HOSTILE = [
    "", "garbage", "<calc>", "</calc>", "<search></search>", "<calc></calc>",
    "<calc>__import__('os')</calc>", "<calc>10**10**10</calc>", "<calc>1/0</calc>",
    "<calc>((1+2)</calc>", "<calc>" + "9" * 100_000 + "</calc>", "<calc>" * 50_000 + "</calc>",
    "<search>" + "a " * 50_000 + "</search>", "<search>!!!</search>", "\x00\xff</search>",
    "<calc>99999999999*99999999999*99999999999*99999999999</calc>",
    "<search>" + "(" * 10_000 + "</search>",
]


@pytest.mark.parametrize("name", ["calculator", "search"])
def test_hostile_tool_calls_get_a_defined_answer_fast(name: str) -> None:
    task = get_task(name, tool_latency_s=0.01)
    state: dict = {}
    for call in HOSTILE:
        start = time.perf_counter()
        result = task.call_tool(call, state)
        assert time.perf_counter() - start < 1.0  # a guard, not a speed test
        assert isinstance(result.text, str) and len(result.text) <= 200
        assert result.latency_s == 0.01
        if not result.ok:
            assert result.text in ("<r>error</r>", "<doc>error</doc>")
    assert state["calls"] == len(HOSTILE) and state["errors"] >= len(HOSTILE) // 2


def test_calculator_tool_answers() -> None:
    calc = get_task("calculator")
    assert calc.call_tool("<calc>37*12</calc>", {}).text == "<r>444</r>"
    assert calc.call_tool("x<calc>1+1</calc><r>2</r><calc>2*7</calc>", {}).text == "<r>14</r>"
    assert calc.call_tool("<calc>7/2</calc>", {}).text == "<r>7/2</r>"
    assert calc.call_tool("<calc>1/0</calc>", {}).ok is False


@pytest.mark.parametrize("name", TASKS)
def test_segments_separate_tool_text_from_model_text(name: str) -> None:
    task = get_task(name, difficulty="medium")
    for ex in task.make_dataset(10, seed=2):
        parts = segments(task, ex.demo)
        assert "".join(text for text, _ in parts) == ex.demo
        tool = [text for text, by_model in parts if not by_model]
        assert len(tool) == (ex.demo.count(task.stop[0]) if task.stop else 0)
        assert all(t.startswith(("<r>", "<doc>")) for t in tool)
    # text after a call that is not the tool's answer is the model's own (a hallucinated result)
    if task.stop:
        fake = f"x{task.stop[0]}<r>zzz</r>A: 1"
        assert segments(task, fake) == [(f"x{task.stop[0]}", True), ("<r>zzz</r>A: 1", True)]
