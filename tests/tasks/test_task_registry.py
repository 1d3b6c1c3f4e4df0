"""Registry, safe scoring and dataset sampling of the task contract."""

from __future__ import annotations

import logging
import random
import subprocess
import sys

import pytest

from jigsawrl.errors import ConfigError
from jigsawrl.tasks import (
    BaseTask,
    Example,
    Task,
    ToolResult,
    get_task,
    list_tasks,
    register_task,
    safe_score,
)
from jigsawrl.tasks.base import sample_examples, split_of


@register_task("test-echo")
class EchoTask(BaseTask):
    """A user-defined task: repeat a word; its tool upper-cases the last <up>...</up>."""

    multi_turn = True
    max_turns = 2
    stop = ("</up>",)
    max_response_chars = 40

    def __init__(self, words: int = 50, tool_latency_s: float = 0.0) -> None:
        super().__init__(tool_latency_s=tool_latency_s)
        self.words = words

    def make_dataset(self, n: int, seed: int, split: str = "train") -> list[Example]:
        def one(rng: random.Random) -> Example:
            w = f"w{rng.randrange(self.words)}"
            return Example(f"{w}\n", w, self.name, {}, w)
        return sample_examples(self.name, one, n, seed, split)

    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None) -> float:
        return float(solution_str.strip() == ground_truth)

    def call_tool(self, call_text: str, state: dict) -> ToolResult:
        start = call_text.rfind("<up>")
        if start < 0:
            return self.error(call_text, "no call")
        return ToolResult(call_text[start + 4:-5].upper(), ok=True, latency_s=self.tool_latency_s)


class _Bad(BaseTask):
    def __init__(self, result: object) -> None:
        super().__init__()
        self.result = result

    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


EX = Example("p\n", "1", "bad", {}, "1")


def test_user_task_is_registered_and_built_with_params() -> None:
    assert "test-echo" in list_tasks()
    task = get_task("test-echo", words=3, tool_latency_s=0.5)
    assert isinstance(task, Task) and task.name == "test-echo"
    ex = task.make_dataset(2, seed=0)[0]
    assert safe_score(task, ex.demo, ex) == (1.0, {})
    result = task.call_tool("x<up>abc</up>", {})
    assert result == ToolResult("ABC", ok=True, latency_s=0.5)


def test_builtin_tasks_are_registered() -> None:
    assert {"countdown", "arithmetic", "calculator", "search"} <= set(list_tasks())


def test_get_task_errors_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="known tasks: .*countdown"):
        get_task("nope")
    with pytest.raises(ConfigError, match="no parameter"):
        get_task("countdown", bogus=1)
    with pytest.raises(ConfigError, match="difficulty"):
        get_task("countdown", difficulty="extreme")
    with pytest.raises(ConfigError, match="tool_latency_s"):
        get_task("search", tool_latency_s=-1.0)
    with pytest.raises(ConfigError, match="cannot import"):
        get_task("no_such_module_xyz:task")


def test_get_task_by_module_path() -> None:
    assert get_task("jigsawrl.tasks.countdown:countdown").name == "countdown"


def test_register_twice_with_another_class_fails() -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_task("countdown")(type("Other", (BaseTask,), {}))


@pytest.mark.parametrize(
    "result, expected",
    [(0.5, (0.5, {})), (1, (1.0, {})),
     ({"score": 0.25, "acc": 0.0}, (0.25, {"score": 0.25, "acc": 0.0}))],
)
def test_safe_score_accepts_numbers_and_dicts(result: object, expected: tuple) -> None:
    assert safe_score(_Bad(result), "x", EX) == expected


@pytest.mark.parametrize(
    "result",
    [RuntimeError("boom"), ZeroDivisionError(), "1.0", None, float("nan"), float("inf"),
     {"acc": 1.0}, {"score": "high"}, [1.0], 1j],
)
def test_safe_score_never_raises(result: object, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="jigsawrl.tasks.base"):
        score, info = safe_score(_Bad(result), "x", EX)
    assert score == 0.0 and "error" in info
    assert ("raised" in info["error"]) == isinstance(result, Exception)
    assert "reward of task" in caplog.text


def test_single_turn_tool_is_a_defined_error() -> None:
    result = get_task("countdown").call_tool("<calc>1</calc>", {})
    assert result.ok is False and result.text == "<r>error</r>"


def test_latency_is_configurable_and_jitter_reproducible() -> None:
    task = get_task("calculator", tool_latency_s=0.2, tool_latency_jitter=0.5)
    a = task.call_tool("<calc>1+1</calc>", {}).latency_s
    assert a == task.call_tool("<calc>1+1</calc>", {}).latency_s
    assert 0.1 <= a <= 0.3
    lat = {task.call_tool(f"<calc>{i}+1</calc>", {}).latency_s for i in range(20)}
    assert len(lat) > 1 and all(0.1 <= x <= 0.3 for x in lat)
    assert get_task("calculator", tool_latency_s=0.3).call_tool("junk", {}).latency_s == 0.3


def test_sampling_is_deterministic_and_splits_disjoint() -> None:
    task = get_task("test-echo", words=200)
    train = task.make_dataset(100, seed=1)
    assert train == task.make_dataset(100, seed=1)
    assert train != task.make_dataset(100, seed=2)
    test = task.make_dataset(30, seed=1, split="test")
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert all(split_of(e.prompt, 0.2) == "test" for e in test)
    assert [e.extra_info["index"] for e in test] == list(range(30))


def test_small_space_repeats_instead_of_looping() -> None:
    task = get_task("test-echo", words=5)
    data = task.make_dataset(50, seed=0)
    assert len(data) == 50 and len({e.prompt for e in data}) <= 5
    with pytest.raises(ConfigError, match="split"):
        task.make_dataset(1, seed=0, split="valid")


def test_reward_error_warnings_are_throttled(caplog: pytest.LogCaptureFixture) -> None:
    task = _Bad(RuntimeError("boom"))
    task.name = "throttle-test"
    with caplog.at_level(logging.WARNING, logger="jigsawrl.tasks.base"):
        for _ in range(50):
            score, info = safe_score(task, "x", EX)
            assert score == 0.0 and info == {"error": "compute_score raised RuntimeError: boom"}
    assert caplog.text.count("throttle-test") == 10


def test_default_compute_score_dispatches_on_data_source() -> None:
    from jigsawrl.tasks import default_compute_score

    assert default_compute_score("arithmetic", "2+3=5", "5")["score"] == 1.0
    with pytest.raises(ConfigError):
        default_compute_score("nope", "x", "y")


def test_builtin_tasks_satisfy_the_protocol() -> None:
    for name in ["countdown", "arithmetic", "calculator", "search"]:
        task = get_task(name)
        assert isinstance(task, Task)
        assert task.multi_turn == bool(task.stop) and task.max_turns >= 1


def test_tasks_do_not_import_torch() -> None:
    code = "import sys, jigsawrl.tasks; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_small_test_split_is_still_drawn_completely() -> None:
    task = get_task("test-echo", words=400)
    space = {f"w{i}\n" for i in range(400)}
    want = {p for p in space if split_of(p, 0.02) == "test"}

    def one(rng: random.Random) -> Example:
        w = f"w{rng.randrange(400)}"
        return Example(f"{w}\n", w, "test-echo", {}, w)

    got = sample_examples(task.name, one, 50, seed=0, split="test", test_fraction=0.02)
    assert {e.prompt for e in got} == want
