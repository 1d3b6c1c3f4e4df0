"""The multi-turn agent loop against a scripted fake engine and a fake tool (no model needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from _fakes import FakeEngine, FakeTask, FakeTok  # noqa: E402

from jigsawrl.engine.agent import AgentLoop  # noqa: E402


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        self.now += dt


def _requests(ids: list[str]) -> list:
    params = SimpleNamespace(max_new_tokens=64)
    return [(f"ex-{i}", SimpleNamespace(request_id=i, prompt_ids=[1, 65], params=params))
            for i in ids]


def test_tool_call_result_is_appended_with_mask_zero() -> None:
    engine = FakeEngine({"a": ["<c>2+3</c>", "=5"]}, ("</c>",))
    task = FakeTask()
    (traj,) = AgentLoop(engine, FakeTok(), task).run(_requests(["a"]))
    assert task.calls == ["<c>2+3</c>"]
    assert traj.response_text == "<c>2+3</c><r>5</r>=5"
    assert traj.num_tool_calls == 1 and traj.finish_reason == "eos"
    tool_span = len("<c>2+3</c>"), len("<c>2+3</c><r>5</r>")
    assert traj.response_mask[tool_span[0]: tool_span[1]] == [0] * 8
    assert traj.response_mask[: tool_span[0]] == [1] * tool_span[0]
    assert traj.response_mask[tool_span[1]:] == [1, 1, 1]  # "=5" and EOS


def test_max_turns_ends_the_response() -> None:
    engine = FakeEngine({"a": ["<c>1</c>"] * 5}, ("</c>",))
    task = FakeTask()
    (traj,) = AgentLoop(engine, FakeTok(), task).run(_requests(["a"]))
    assert traj.num_tool_calls == 2 and traj.finish_reason == "max_turns"
    assert engine.released == ["a"]


def test_other_requests_decode_while_a_tool_waits() -> None:
    engine = FakeEngine({"a": ["<c>1</c>", "x"], "b": ["y" * 30]}, ("</c>",))
    clock = FakeClock()
    task = FakeTask(latency_s=1.0)

    def tick() -> float:  # every engine step takes 0.1 s of the fake clock
        return clock.now

    original_step = engine.step

    def timed_step():  # noqa: ANN202
        clock.now += 0.1
        return original_step()

    engine.step = timed_step
    trajs = AgentLoop(engine, FakeTok(), task, clock=tick, sleep=clock.sleep).run(
        _requests(["a", "b"]))
    assert [t.response_text for t in trajs] == ["<c>1</c><r>5</r>x", "y" * 30]
    # "b" kept decoding during a's 1 s tool wait (steps 9..18), then "a" rejoined before b ended
    a_steps = [s for s, rid, _ in engine.log if rid == "a"]
    b_steps = [s for s, rid, _ in engine.log if rid == "b"]
    assert a_steps[-1] < b_steps[-1]
    assert a_steps[-1] - a_steps[-2] >= 10
    assert trajs[0].tool_wait_s == pytest.approx(1.0)


def test_tool_wait_with_nothing_running_sleeps() -> None:
    engine = FakeEngine({"a": ["<c>1</c>", "x"]}, ("</c>",))
    clock = FakeClock()
    (traj,) = AgentLoop(engine, FakeTok(), FakeTask(latency_s=2.0), extra_latency_s=0.5,
                        clock=clock, sleep=clock.sleep).run(_requests(["a"]))
    assert clock.now == pytest.approx(2.5)
    assert traj.response_text.endswith("x")
