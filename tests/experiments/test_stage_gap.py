"""The profile's stage-gap probe: what a worker pool waits between two stages of a real run."""

from __future__ import annotations

import pytest

from jigsawrl.costmodel.fit import fit_runtime
from jigsawrl.events import Span, StepFinished
from jigsawrl.experiments.stage_gap import gap_summary, probe_config, stage_gaps
from jigsawrl.stages import Stage


def span(pipe: str, step: int, stage: Stage, start: float, end: float, rank: int = 0) -> Span:
    return Span(pipe, step, stage, rank, (rank,), start, end)


def test_gaps_run_from_a_stage_last_span_to_the_next_first_one() -> None:
    events = [
        span("a", 0, Stage.PREFILL, 0.00, 0.01), span("a", 0, Stage.DECODE_SMALL, 0.02, 0.20),
        span("a", 0, Stage.DECODE_SMALL, 0.03, 0.25, rank=1),  # the rollout ends with rank 1
        span("a", 0, Stage.REWARD, 0.26, 0.27),
        span("a", 0, Stage.OLD_LOGPROB, 0.28, 0.30),
        span("a", 1, Stage.PREFILL, 0.33, 0.34),  # the next step's rollout
        span("b", 0, Stage.PREFILL, 0.00, 0.01), span("b", 0, Stage.REWARD, 0.015, 0.02),
    ]
    gaps = stage_gaps(events)
    assert gaps == {"rollout->reward": [pytest.approx(0.01), pytest.approx(0.005)],
                    "reward->old_logprob": [pytest.approx(0.01)],
                    "old_logprob->rollout": [pytest.approx(0.03)]}


def test_overlapping_stages_give_no_gap() -> None:
    events = [span("a", 0, Stage.PREFILL, 0.0, 0.5), span("a", 0, Stage.OLD_LOGPROB, 0.4, 0.6)]
    assert stage_gaps(events) == {}


def test_the_probe_is_two_pipelines_one_per_device() -> None:
    cfg = probe_config("qwen2-1m")
    assert cfg.cluster.accelerator == "cpu-worker" and cfg.cluster.accelerators_per_node == 2
    assert [p.task for p in cfg.pipelines] == ["arithmetic", "arithmetic"]
    assert cfg.scheduler.name == "verl-split"


def test_the_fit_keeps_what_the_empty_call_does_not_charge() -> None:
    ray = {"call_s": 0.002, "transfer": [{"bytes": 1e6, "time_s": 0.01},
                                         {"bytes": 8e6, "time_s": 0.03}]}
    assert fit_runtime({"ray": ray, "stage_gap": {"gap_s": 0.009}})["stage_gap_s"] == \
        pytest.approx(0.007)
    assert fit_runtime({"ray": ray, "stage_gap": {"gap_s": 0.001}})["stage_gap_s"] == 0.0
    assert "stage_gap_s" not in fit_runtime({"ray": ray})


def test_the_host_load_becomes_slots_of_a_device() -> None:
    host = {"cores": 8.0, "load_cores": 1.0, "worker_cores": 6.0, "seconds": 2.0}
    fit = fit_runtime({"host_load": host}, threads=2)
    assert fit["host_slots"] == 4.0 and fit["host_load_slots"] == 0.5
    assert "host_slots" not in fit_runtime({})


def test_the_summary_times_the_weight_sync_whole_and_the_fit_keeps_it() -> None:
    """A step's weight sync from the driver's call to its result back (its timing), as the
    executor's publish costs it: the fit keeps the median whole, its call and wait included."""
    events = [span("a", 0, Stage.PREFILL, 0.00, 0.01), span("a", 0, Stage.REWARD, 0.02, 0.03),
              *(StepFinished("a", s, 0.0, 1.0, {"update_weights": t, "step": 1.0})
                for s, t in enumerate((0.006, 0.011, 0.008)))]
    summary = gap_summary(events)
    assert summary is not None and summary["weight_sync_s"] == pytest.approx(0.008)
    no_sync = gap_summary(events[:2])
    assert no_sync is not None and "weight_sync_s" not in no_sync
    ray = {"call_s": 0.002, "transfer": [{"bytes": 1e6, "time_s": 0.01},
                                         {"bytes": 8e6, "time_s": 0.03}]}
    assert fit_runtime({"ray": ray, "stage_gap": summary})["weight_sync_s"] == \
        pytest.approx(0.008)
    assert "weight_sync_s" not in fit_runtime({"ray": ray, "stage_gap": no_sync})
