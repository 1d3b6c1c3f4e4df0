"""The driver-kill drill's hook (``JIGSAWRL_DRILL_FREEZE``): which call it stops at."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jigsawrl.experiments import real


class FakeExecutor:
    """What the hook touches: an ``on_call`` attribute that may already hold a hook."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.on_call = self.seen.append


def calls(*specs: tuple[str, int]) -> list[SimpleNamespace]:
    return [SimpleNamespace(stage=stage, step=step) for stage, step in specs]


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(real.time, "sleep", slept.append)
    return slept


@pytest.mark.parametrize(("spec", "stops_at"), [
    ("rollout:3", 4),  # the 3rd rollout call of any step
    ("rollout@1:1", 3),  # the first rollout call of step 1
    ("rollout@1:2", 5),
    ("actor_update@0:1", None),  # no update call in the sequence
])
def test_the_drill_stops_at_the_nth_call_of_its_stage_and_step(
        tmp_path: Path, no_sleep: list[float], spec: str, stops_at: int | None) -> None:
    marker = tmp_path / "stopped"
    executor = FakeExecutor()
    real.freeze_drill(f"{spec}:{marker}")(executor)
    sequence = calls(("rollout", 0), ("weight_sync", 0), ("rollout", 1), ("rollout", 2),
                     ("rollout", 1))
    for i, call in enumerate(sequence):
        executor.on_call(call)
        if stops_at is not None and i + 1 == stops_at:
            assert marker.is_file() and no_sleep == [real.FREEZE_S]
            break
        assert not marker.is_file()
    assert executor.seen == sequence[:len(executor.seen)]  # the earlier hook still runs
    assert (stops_at is None) == (not no_sleep)
