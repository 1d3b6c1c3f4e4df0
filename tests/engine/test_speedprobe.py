"""engine/speedprobe.py: the fixed pass timed with a profile and again before a real run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jigsawrl.engine.speedprobe import speed_probe_s  # noqa: E402


def test_the_probe_times_a_pass_and_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    seconds = speed_probe_s(repeats=1)
    assert 0 < seconds < 60
    assert torch.get_num_threads() == before


def test_a_probe_without_repeats_is_refused() -> None:
    with pytest.raises(ValueError, match="repeats"):
        speed_probe_s(repeats=0)
