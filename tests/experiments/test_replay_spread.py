"""replay_spread.py and its use in calibrate: the run's call-time scatter, replays under it."""

from __future__ import annotations

import math

import pytest

from jigsawrl.costmodel import CostModel
from jigsawrl.events import Span
from jigsawrl.experiments.calibrate import (
    Compared,
    calibrate,
    compare_replays,
    replay_experiment,
    simulate_replay,
    truth_cost,
)
from jigsawrl.experiments.replay_spread import (
    MIN_PASSES,
    call_noise_sigma,
    noisy,
    pass_windows,
)
from jigsawrl.workload.realpresets import CPU_ACCELERATOR
from tests.experiments.test_calibrate import TOOL_TOKENS, config, experiment, truth_workload


def passes(seconds: dict[tuple[str, int, str], float]) -> list[Span]:
    return [Span(p, s, stage, 0, (0,), 10.0 * s, 10.0 * s + t)
            for (p, s, stage), t in seconds.items()]


def test_a_pass_window_runs_from_its_first_span_to_its_last() -> None:
    spans = [Span("a", 0, "actor_update", 0, (0,), 1.0, 2.0),
             Span("a", 0, "actor_update", 1, (1,), 1.5, 2.5),  # a data-parallel helper
             Span("a", 0, "decode_small", 0, (0,), 0.0, 1.0)]  # not a model pass
    assert pass_windows(spans) == {("a", 0, "actor_update"): pytest.approx(1.5)}


def test_a_stage_priced_off_by_a_constant_has_no_scatter() -> None:
    """A (pipeline, stage) priced 20% high and another 10% low: their level is the profile's
    business, not noise — the scatter is zero, so no replays are asked for."""
    keys = [(p, s, st) for p in ("a", "b") for s in range(4) for st in ("old_logprob",
                                                                         "actor_update")]
    pred = {k: 1.0 + 0.1 * k[1] for k in keys}
    bias = {"a": 1.2, "b": 0.9}
    meas = {k: v * bias[k[0]] for k, v in pred.items()}
    assert call_noise_sigma(passes(meas), passes(pred)) == pytest.approx(0.0, abs=1e-12)


def test_the_scatter_is_the_robust_sd_of_the_centred_log_ratios() -> None:
    keys = [("a", s, "actor_update") for s in range(16)]
    pred = dict.fromkeys(keys, 1.0)
    # log ratios alternating +-0.1 around a 5% bias: every |deviation| is 0.1
    meas = {k: 1.05 * math.exp(0.1 if k[1] % 2 else -0.1) for k in keys}
    sigma = call_noise_sigma(passes(meas), passes(pred))
    assert sigma == pytest.approx(1.4826 * 0.1, rel=1e-6)
    # one wild pass does not move a robust estimate
    meas[keys[0]] = 10.0
    assert call_noise_sigma(passes(meas), passes(pred)) == pytest.approx(sigma, rel=1e-6)


def test_too_few_matched_passes_measure_no_scatter() -> None:
    keys = [("a", s, "actor_update") for s in range(MIN_PASSES - 1)]
    pred = dict.fromkeys(keys, 1.0)
    meas = {k: 1.0 + 0.05 * (k[1] % 3) for k in keys}
    assert call_noise_sigma(passes(meas), passes(pred)) is None
    # a pass the prediction lacks is not matched
    extra = {("b", 0, "actor_update"): 2.0}
    assert call_noise_sigma(passes({**meas, **extra}), passes(pred)) is None


def test_a_noisy_copy_keeps_the_model_and_draws_from_its_seed() -> None:
    base = CostModel(CPU_ACCELERATOR)
    one, again, other = noisy(base, 0.1, 3), noisy(base, 0.1, 3), noisy(base, 0.1, 4)
    assert one.params is base.params and one.deployment is base.deployment
    assert one.noise_sigma == 0.1 and base.noise_sigma == 0.0
    draws = [one.draw_noise() for _ in range(2000)]
    assert draws[:5] == [again.draw_noise() for _ in range(5)]
    assert draws[:5] != [other.draw_noise() for _ in range(5)]
    logs = [math.log(d) for d in draws]
    assert abs(sum(logs) / len(logs)) < 0.01
    assert math.sqrt(sum(x * x for x in logs) / len(logs)) == pytest.approx(0.1, rel=0.1)


def test_compare_replays_keeps_the_prediction_and_gives_it_the_range() -> None:
    measured = {"makespan_s": 10.0, "pipelines": [{"name": "a", "mean_step_latency_s": 1.0,
                                                   "tokens_per_s": 5.0, "samples": 4}]}

    def summary(m: float) -> dict:
        return {"makespan_s": m, "pipelines": [{"name": "a", "mean_step_latency_s": m / 10,
                                                "tokens_per_s": 5.0, "samples": 4}]}

    pool, pipes = compare_replays(measured, summary(11.0), [summary(9.0), summary(12.0)])
    span = pool["makespan_s"]
    assert (span.measured, span.predicted, span.low, span.high) == (10.0, 11.0, 9.0, 12.0)
    assert span.in_range is True and span.rel_error == pytest.approx(0.1)
    lat = pipes["a"]["step_latency_s"]
    assert lat.predicted == pytest.approx(1.1) and lat.low == pytest.approx(0.9)
    # the noise-free prediction is inside its range even where every replay is on one side
    pool, _ = compare_replays(measured, summary(8.0), [summary(9.0), summary(12.0)])
    assert (pool["makespan_s"].low, pool["makespan_s"].high) == (8.0, 12.0)
    assert Compared(2.0, 1.1, 0.9, 1.2).in_range is False
    assert Compared(1.0, 1.0).in_range is None
    assert "low" in span.to_json() and "low" not in Compared(1.0, 1.0).to_json()


def test_a_run_with_scattered_calls_gets_the_range_of_replays_under_that_scatter() -> None:
    """A 'real' run simulated with 10% noise on every duration: the calibration measures a
    scatter of that order from its passes and replays the run under it; the prediction stays
    the noise-free replay's, each quantity with the range of it and the replays."""
    cfg = config("greedy", steps=6)
    exp = experiment(cfg)
    noisy_truth = CostModel(CPU_ACCELERATOR, noise_sigma=0.1, seed=11,
                            params=truth_cost(exp, None).params)
    _, events = simulate_replay(replay_experiment(exp, truth_workload(6)), "greedy", noisy_truth)
    cal = calibrate(cfg, events, "greedy", exp=exp, tool_tokens=TOOL_TOKENS, replays=4)
    assert cal.noise_sigma is not None and 0.03 < cal.noise_sigma < 0.3
    assert cal.replays == 4
    ranged = [c for c in [*cal.pool.values(), *(c for d in cal.pipelines.values()
                                                for c in d.values())] if c.predicted is not None]
    for c in ranged:
        assert c.low is not None and c.high is not None and c.low <= c.predicted <= c.high
    assert any(c.high > c.low for c in ranged)  # the replays differ
    doc = cal.to_json()
    assert doc["replays"] == 4 and doc["noise_sigma"] == cal.noise_sigma
    assert doc["pool"]["makespan_s"]["high"] == cal.pool["makespan_s"].high
    plain = calibrate(cfg, events, "greedy", exp=exp, tool_tokens=TOOL_TOKENS, replays=0)
    assert plain.noise_sigma is None and plain.replays == 0
    assert plain.pool["makespan_s"].low is None
    assert plain.pool["makespan_s"].predicted == cal.pool["makespan_s"].predicted
