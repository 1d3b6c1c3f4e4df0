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


def test_a_prediction_from_replays_shows_their_range_and_how_many_hold_the_measurement(
) -> None:
    from jigsawrl.bench.real_report import _pred_err, error_note
    from jigsawrl.experiments.calibrate import Compared

    cal = calibration(None)
    cal.pool = {"makespan_s": Compared(100.0, 104.0, 98.0, 110.0)}
    cal.pipelines = {"a": {"step_latency_s": Compared(1.0, 1.3, 1.1, 1.6),
                           "tokens_per_s": Compared(5.0, 5.0)}}
    assert _pred_err(cal.pool["makespan_s"], ".1f") == "104.0 (+4%) [98.0–110.0]"
    assert _pred_err(cal.pool["makespan_s"], ".1f", ranged=False) == "104.0 (+4%)"
    assert _pred_err(cal.pipelines["a"]["tokens_per_s"], ".1f") == "5.0 (+0%)"
    assert "σ" not in error_note(cal)  # no replays: the noise-free replay's line alone
    cal.noise_sigma, cal.replays = 0.065, 8
    note = error_note(cal)
    assert "largest error 30%" in note and "of 8 replays" in note
    assert "σ 6.5%" in note and "within it for 1 of 2" in note


def test_the_run_table_gives_the_range_a_row_of_its_own() -> None:
    from rich.console import Console

    from jigsawrl.bench.real_report import run_table
    from jigsawrl.experiments.calibrate import Compared

    summary = {"name": "r", "policy": "jigsaw", "steps": 4, "throughput_tokens_per_s": 10.0,
               "pipelines": [{"name": "a", "steps": 4, "mean_step_latency_s": 1.0,
                              "tokens_per_s": 10.0}]}
    cal = calibration(None)
    cal.pool = {"makespan_s": Compared(8.0, 8.4, 8.1, 8.9),
                "throughput_tokens_per_s": Compared(10.0, 9.5, 9.0, 9.9)}
    cal.pipelines = {"a": {"step_latency_s": Compared(1.0, 1.3, 0.9, 1.6),
                           "tokens_per_s": Compared(10.0, 9.5, 9.0, 9.9)}}

    def text(c: object) -> str:
        console = Console(width=80, record=True)
        console.print(run_table(summary, c))  # type: ignore[arg-type]
        return console.export_text()

    assert "range" not in text(cal)  # no replays were run: no range row
    cal.replays, cal.noise_sigma = 8, 0.07
    out = text(cal)
    assert "0.90–1.60" in out and "9–10" in out and "1.30 (+30%)" in out
    assert "…" not in out  # fits 80 columns
