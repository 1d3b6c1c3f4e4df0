"""decode_span_time_s is the exact sum of decode_iter_time_s; decode_iters_within inverts it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jigsawrl.costmodel import CostModel, rollout_cost
from jigsawrl.workload.accelerators import ACCELERATORS
from jigsawrl.workload.models import MODELS

CM = {name: CostModel(accel) for name, accel in ACCELERATORS.items()}

spans = st.fixed_dictionaries({
    "accel": st.sampled_from(sorted(ACCELERATORS)),
    "model": st.sampled_from(sorted(MODELS)),
    "tp": st.sampled_from([1, 2, 4, 8]),
    "batch": st.integers(1, 2048),
    "ctx_per_seq": st.integers(0, 8192),
    "iters": st.integers(0, 400),
    "share": st.sampled_from([0.2, 0.3, 0.35, 0.5, 0.7, 1.0]),
})


@settings(max_examples=80, deadline=None)
@given(spans)
def test_span_equals_sum_of_iterations(s: dict) -> None:
    cm, model = CM[s["accel"]], MODELS[s["model"]]
    b, tp, share = s["batch"], s["tp"], s["share"]
    ctx = b * s["ctx_per_seq"]
    total = sum(cm.decode_iter_time_s(model, tp, b, ctx + i * b, share)
                for i in range(s["iters"]))
    span = cm.decode_span_time_s(model, tp, b, ctx, s["iters"], share)
    assert span == pytest.approx(total, rel=1e-9, abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(spans, st.floats(0.0, 1.0))
def test_iters_within_invertsspan_sum(s: dict, frac: float) -> None:
    cm, model = CM[s["accel"]], MODELS[s["model"]]
    b, tp, share = s["batch"], s["tp"], s["share"]
    ctx = b * s["ctx_per_seq"]
    time_s = frac * cm.decode_span_time_s(model, tp, b, ctx, s["iters"] + 1, share)
    n = cm.decode_iters_within(model, tp, b, ctx, time_s, share)
    assert cm.decode_span_time_s(model, tp, b, ctx, n, share) <= time_s
    assert cm.decode_span_time_s(model, tp, b, ctx, n + 1, share) > time_s
    # an exact span time is inverted exactly
    exact = cm.decode_span_time_s(model, tp, b, ctx, s["iters"], share)
    assert cm.decode_iters_within(model, tp, b, ctx, exact, share) == s["iters"]


def test_span_crosses_from_compute_to_memory_bound() -> None:
    # large batch, short context: compute-bound first, memory-bound once the KV cache grows
    cm, model = CM["h100-80gb"], MODELS["qwen3-0.6b"]
    total = sum(cm.decode_iter_time_s(model, 1, 1024, 1024 * i) for i in range(300))
    assert cm.decode_span_time_s(model, 1, 1024, 0, 300) == pytest.approx(total, rel=1e-12)
    # the sum of 300 iteration times and the closed form differ in the last bits: count within
    # one part in 1e12 of the sum (the exact span then fits, one more iteration does not)
    assert cm.decode_iters_within(model, 1, 1024, 0, total * (1 + 1e-12)) == 300


def test_iters_within_uses_the_given_noise_factor() -> None:
    cm, model = CM["h100-80gb"], MODELS["qwen3-4b"]
    t = cm.decode_span_time_s(model, 1, 16, 16_000, 100, noise=1.5)
    assert cm.decode_iters_within(model, 1, 16, 16_000, t, noise=1.5) == 100
    assert cm.decode_iters_within(model, 1, 16, 16_000, t) > 100
    assert cm.decode_iters_within(model, 1, 16, 16_000, 0.0) == 0


lines = st.floats(0.0, 1.0, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(lines, lines, lines, lines, st.floats(1e-4, 1.0), st.integers(0, 300),
       st.floats(0.0, 1.0))
def test_closed_form_on_arbitrary_lines(c0: float, c1: float, m0: float, m1: float, k: float,
                                        n: int, frac: float) -> None:
    # covers both crossing directions, including compute overtaking memory (unusual hardware)
    from jigsawrl.costmodel.rollout_cost import regimes, series_count, span_sum

    c1, m1 = c1 / 50, m1 / 50
    brute = sum(k + max(c0 + c1 * i, m0 + m1 * i) for i in range(n))
    assert span_sum(k, c0, c1, m0, m1, float(n)) == pytest.approx(brute, rel=1e-9, abs=1e-12)
    n_x, a0, a1, b0, b1 = regimes(c0, c1, m0, m1)
    budget = frac * brute
    est = series_count(k + a0, a1, budget)
    if est > n_x:
        rest = budget - span_sum(k, c0, c1, m0, m1, n_x)
        est = n_x + series_count(k + b0 + b1 * n_x, b1, rest)
    assert span_sum(k, c0, c1, m0, m1, float(int(est))) <= budget * (1 + 1e-9) + 1e-12
    assert span_sum(k, c0, c1, m0, m1, float(int(est) + 2)) > budget


def test_lines_that_cross_beyond_float_range_never_cross() -> None:
    # hypothesis found it: a subnormal slope makes the crossing index overflow to inf
    from jigsawrl.costmodel.rollout_cost import regimes, span_sum

    c1 = 1.1125369292536007e-308 / 50
    assert regimes(0.0, c1, 1.0, 0.0)[0] == float("inf")
    assert span_sum(1.0, 0.0, c1, 1.0, 0.0, 3.0) == pytest.approx(6.0)


@settings(max_examples=40, deadline=None)
@given(spans)
def test_cached_decode_lines_equal_a_fresh_models(s: dict) -> None:
    """The per-(model, TP, share) constants are cached: a model that has timed other spans
    gives exactly what a fresh one gives."""
    model, accel = MODELS[s["model"]], ACCELERATORS[s["accel"]]
    b, tp, share = s["batch"], s["tp"], s["share"]
    warm = CM[s["accel"]]
    for other in (0.2, 0.5, 1.0):
        warm.decode_span_time_s(model, tp, b, 100, 3, other)
    args = (model, tp, b, b * s["ctx_per_seq"], s["iters"], share)
    assert warm.decode_span_time_s(*args) == CostModel(accel).decode_span_time_s(*args)


def test_a_bad_share_raises_however_often_it_is_asked() -> None:
    cm, model = CostModel(ACCELERATORS["h100-80gb"]), MODELS["qwen3-0.6b"]
    for _ in range(2):
        with pytest.raises(ValueError, match="compute share"):
            cm.decode_span_time_s(model, 1, 4, 100, 3, 1.5)


def test_the_per_batch_cache_is_bounded_and_exact_after_clearing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Continuous shares make its keys unbounded: past its size it is cleared, and a span
    timed after the clearing is the one a fresh model times; prefills read the same cached
    per-(model, TP, share) constants and match a fresh model's too."""
    monkeypatch.setattr(rollout_cost, "BATCH_CACHE", 8)
    accel, model = ACCELERATORS["h100-80gb"], MODELS["qwen3-4b"]
    warm = CostModel(accel)
    for b in range(1, 30):
        warm.decode_span_time_s(model, 2, b, 1000, 5, 0.5)
        assert len(warm._batch_cache) <= 8
    fresh = CostModel(accel)
    for b in (1, 7, 29):
        assert warm.decode_span_time_s(model, 2, b, 900, 7, 0.5) == \
            fresh.decode_span_time_s(model, 2, b, 900, 7, 0.5)
    assert warm.prefill_time_s(model, 2, 512, 300, 0.5, num_seqs=3) == \
        fresh.prefill_time_s(model, 2, 512, 300, 0.5, num_seqs=3)
