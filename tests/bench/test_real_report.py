"""bench/real_report.py: the lines that put a real run's prediction beside it."""

from __future__ import annotations

from jigsawrl.bench.real_report import speed_note
from jigsawrl.experiments.calibrate import Calibration


def calibration(factor: float | None, makespan_err: float | None = 0.04) -> Calibration:
    cal = Calibration("jigsaw", "test profile", {}, {}, {})
    if factor is not None:
        cal.speed_factor = factor
        cal.speed_adjusted = {"pool": {
            "makespan_s": {"measured": 100.0, "predicted": 104.0, "rel_error": makespan_err},
            "throughput_tokens_per_s": {"measured": 10.0, "predicted": None,
                                        "rel_error": None}}, "pipelines": {}}
    return cal


def test_speed_note_says_how_much_slower_or_faster_and_the_scaled_error() -> None:
    assert speed_note(None) is None
    assert speed_note(calibration(None)) is None
    slow = speed_note(calibration(1.25))
    assert slow is not None and "1.25× slower" in slow and "makespan +4%" in slow
    assert "tokens/s" not in slow  # no prediction to compare
    fast = speed_note(calibration(0.8, makespan_err=-0.1))
    assert fast is not None and "1.25× faster" in fast and "makespan -10%" in fast
    assert "nothing to compare" in (speed_note(calibration(1.0, makespan_err=None)) or "")
