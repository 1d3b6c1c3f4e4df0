"""summarize(): every headline metric against hand-worked answers, plus interval invariants."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jigsawrl.events import Span, StepFinished
from jigsawrl.metrics import RunInfo, summarize
from jigsawrl.metrics.summary import capped_share_integral, step_latencies, union_length


def _pipe(summary: dict, name: str) -> dict:
    return next(p for p in summary["pipelines"] if p["name"] == name)


def test_headline_metrics_known_answers(events, info):
    s = summarize(events, info)
    assert s["makespan_s"] == pytest.approx(10.0)
    assert s["tokens"] == 500
    assert s["throughput_tokens_per_s"] == pytest.approx(50.0)
    assert s["perf/throughput"] == pytest.approx(25.0)
    # dev0 busy 10 s, dev1 busy 5 s (tool_wait not busy, overlap counted once)
    assert s["busy_fraction"] == pytest.approx(15.0 / 20.0)
    assert s["device_busy_fraction"] == pytest.approx([1.0, 0.5])
    # 10 + 4.25 share-seconds (1.25 capped to 1 on dev1 during [6, 7])
    assert s["compute_utilisation"] == pytest.approx(14.25 / 20.0)
    assert s["mfu"] == pytest.approx(6e12 / (2 * 1e12 * 10))
    assert s["cost_usd"] == pytest.approx(0.02)
    assert s["cost_per_million_tokens_usd"] == pytest.approx(0.02 / 500e-6)
    # schema 2: the floor's ratio (``efficiency`` before) is ``efficiency_floor``; ``efficiency``
    # is against the realistic bound
    assert s["schema_version"] == 2
    assert (s["floor_s"], s["bound_s"]) == (5.0, 6.0)
    assert s["efficiency_floor"] == pytest.approx(0.5)
    assert s["efficiency"] == pytest.approx(0.6)
    assert s["bound_note"] is None
    assert s["mean_latency_vs_solo"] == pytest.approx(2.0)
    assert s["failed_pipelines"] == ["B"]
    json.dumps(s, allow_nan=False)  # JSON-able, no NaN


def test_pipeline_entries_known_answers(events, info):
    s = summarize(events, info)
    a, b = _pipe(s, "A"), _pipe(s, "B")
    assert [p["name"] for p in s["pipelines"]] == ["A", "B"]
    assert (a["steps"], a["samples"], a["tokens"]) == (1, 2, 200)
    assert a["tokens_per_s"] == pytest.approx(20.0)
    assert a["mean_step_latency_s"] == pytest.approx(8.0)
    assert a["latency_vs_solo"] == pytest.approx(2.0)
    assert b["latency_vs_solo"] is None  # no solo latency given for B
    assert a["timing_s/gen"] == pytest.approx(6.0)  # prefill..tool_wait extent [0, 6]
    assert a["timing_s/reward"] == pytest.approx(2.0)
    assert a["timing_s/update_actor"] == 0.0  # no span, no reported timing
    assert a["timing_s/step"] == pytest.approx(8.0)
    assert a["tool_wait_s"] == pytest.approx(4.0)
    assert a["device_s"] == pytest.approx(2.0 + 2.0 + 0.5)
    assert b["timing_s/gen"] == pytest.approx(4.0)
    assert b["timing_s/update_actor"] == pytest.approx(4.0)
    assert b["device_s"] == pytest.approx(2.0 + 8.0)
    assert b["perf/mfu/actor"] == pytest.approx(4e12 / (1e12 * 8.0))
    assert a["perf/mfu/actor"] is None
    assert (a["failed"], b["failed"], b["failed_step"]) == (None, "out of memory", 1)


def test_step_latency_percentiles_and_timing_fallback(info):
    # latencies 1, 2, 3, 4: each step ends that long after the previous one (steps 1-3
    # launched 0.5 s after they became ready: the wait counts, schema 2)
    ends = [1.0, 3.0, 6.0, 10.0]
    steps = [StepFinished("A", k, ends[k - 1] + 0.5 if k else 0.0, end, {"reward": 0.5})
             for k, end in enumerate(ends)]
    p = _pipe(summarize(steps, info), "A")
    assert p["mean_step_latency_s"] == pytest.approx(2.5)
    assert p["p50_step_latency_s"] == pytest.approx(2.5)
    assert p["p90_step_latency_s"] == pytest.approx(3.7)
    assert p["timing_s/reward"] == pytest.approx(0.5)  # from StepFinished.timings_s


def test_step_latency_runs_from_the_previous_step_or_the_arrival(info):
    """Step 0 from the pipeline's arrival, step k from step k-1's end: waiting for devices
    counts; the rollout's launch (StepFinished.start_s) does not start the clock."""
    steps = [StepFinished("A", 0, 5.0, 9.0), StepFinished("A", 1, 12.0, 14.0),
             StepFinished("B", 0, 1.0, 4.0)]
    assert step_latencies(steps, {"A": 2.0, "B": 0.0}) == {
        ("A", 0): 7.0, ("A", 1): 5.0, ("B", 0): 4.0}
    assert step_latencies(steps)[("A", 0)] == 9.0  # arrival unknown: the run's start (t0 = 0)
    assert step_latencies(steps, t0_s=1.0)[("A", 0)] == 8.0
    # a step whose previous step never finished counts from its own launch
    assert step_latencies([StepFinished("A", 3, 20.0, 26.0)]) == {("A", 3): 6.0}
    with_arrival = RunInfo(**{**info.to_dict(), "arrival_s": {"A": 2.0, "B": 0.0}})
    s = summarize(steps, with_arrival)
    a = _pipe(s, "A")
    assert a["mean_step_latency_s"] == pytest.approx(6.0)
    assert a["timing_s/step"] == pytest.approx(6.0)
    assert s["perf/time_per_step"] == pytest.approx((7.0 + 5.0 + 4.0) / 3)
    assert a["latency_vs_solo"] == pytest.approx(6.0 / 4.0)


def test_a_run_without_bound_says_why_and_a_beaten_bound_is_flagged(events, info):
    real = RunInfo(**{**info.to_dict(), "bound_s": None, "executor": "ray"})
    s = summarize(events, real)
    assert s["bound_s"] is None and s["efficiency"] is None
    assert s["efficiency_floor"] == pytest.approx(0.5)
    assert "true requests" in s["bound_note"]
    beaten = RunInfo(**{**info.to_dict(), "bound_s": 12.0, "bound_terms": {"floor": 5.0}})
    s = summarize(events, beaten)
    assert s["efficiency"] == pytest.approx(1.2)
    assert "below bound_s" in s["bound_note"] and s["bound_terms"] == {"floor": 5.0}
    json.dumps(s, allow_nan=False)


def test_only_finished_samples_count(info):
    # Decoding work without a SampleFinished earns no throughput.
    evs = [Span("A", 0, "decode_large", 0, (0,), 0.0, 5.0, 1.0, 1e12, 5000)]
    s = summarize(evs, info)
    assert s["tokens"] == 0 and s["throughput_tokens_per_s"] == 0.0
    assert s["cost_per_million_tokens_usd"] is None


def test_empty_run_has_null_rates(info):
    s = summarize([], info)
    assert s["makespan_s"] == 0.0
    assert s["throughput_tokens_per_s"] is None and s["busy_fraction"] is None
    assert s["efficiency"] is None and s["mean_latency_vs_solo"] is None
    assert [p["steps"] for p in s["pipelines"]] == [0, 0]
    json.dumps(s, allow_nan=False)


def test_unknown_solo_latency_is_null_not_nan(events, info):
    nan_info = RunInfo(**{**info.to_dict(), "solo_step_latency_s": {"A": float("nan")}})
    s = summarize(events, nan_info)
    assert _pipe(s, "A")["latency_vs_solo"] is None and s["mean_latency_vs_solo"] is None
    json.dumps(s, allow_nan=False)


def test_span_outside_pool_is_rejected(info):
    with pytest.raises(ValueError, match="device 5"):
        summarize([Span("A", 0, "prefill", 0, (5,), 0.0, 1.0)], info)


def test_unknown_pipeline_is_appended(info):
    s = summarize([StepFinished("C", 0, 0.0, 1.0)], info)
    assert [p["name"] for p in s["pipelines"]] == ["A", "B", "C"]


def test_run_info_round_trip_and_validation(info):
    assert RunInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info
    with pytest.raises(ValueError):
        RunInfo("x", "p", 0, 0, "toy", 1.0, 1.0, ())


def _brute_union(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            total += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0.0 if cur_e is None else cur_e - cur_s)


_interval = st.tuples(st.integers(0, 50), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_interval, max_size=25), st.lists(st.sampled_from([0.25, 0.5, 1.0]), min_size=25))
def test_union_and_capped_share_invariants(intervals, shares):
    s = np.array([a for a, _ in intervals], dtype=float)
    e = np.array([b for _, b in intervals], dtype=float)
    sh = np.array(shares[: len(intervals)], dtype=float)
    u = union_length(s, e)
    assert u == pytest.approx(_brute_union(intervals))
    used = capped_share_integral(s, e, sh)
    assert -1e-9 <= used <= u + 1e-9  # capped at one device, only while something runs
    assert used <= float(np.sum(sh * (e - s))) + 1e-9


def test_metrics_import_no_torch_or_ray():
    code = (
        "import sys, jigsawrl.metrics; "
        "bad = [m for m in ('torch', 'ray') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_latency_bound_is_reported_met_or_missed() -> None:
    """``max_latency_ratio`` (RunInfo.latency_bounds) against ``latency_vs_solo``: within,
    over (named in ``latency_bounds_missed``), or unknown without a bound or a solo latency."""
    from jigsawrl.events import StepFinished
    from jigsawrl.metrics.summary import RunInfo, summarize

    steps = [StepFinished(pipeline=p, step=k, start_s=10.0 * k, end_s=10.0 * (k + 1))
             for p in ("a", "b", "c") for k in range(2)]
    info = RunInfo(name="t", policy="x", seed=0, num_devices=1, accelerator="h100-80gb",
                   peak_flops_per_device=1e15, price_per_device_hour_usd=1.0,
                   pipelines=("a", "b", "c"), solo_step_latency_s={"a": 8.0, "b": 5.0},
                   latency_bounds={"a": 1.5, "b": 1.5, "c": 1.5})
    s = summarize(steps, info)
    by = {p["name"]: p for p in s["pipelines"]}
    assert by["a"]["latency_vs_solo"] == 1.25 and by["a"]["within_latency_bound"] is True
    assert by["b"]["latency_vs_solo"] == 2.0 and by["b"]["within_latency_bound"] is False
    assert by["c"]["within_latency_bound"] is None  # no solo latency: unknown
    assert s["latency_bounds_missed"] == ["b"]
    assert RunInfo.from_dict(info.to_dict()) == info
