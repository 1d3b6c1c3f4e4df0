"""Slowdown under a compute share: >= 1, non-increasing in share, and the right shape per stage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jigsawrl.costmodel import SHARE_LEVELS, CostModel
from jigsawrl.stages import COSTED_STAGES, Stage
from jigsawrl.workload.accelerators import ACCELERATORS
from jigsawrl.workload.models import MODELS

CM = CostModel(ACCELERATORS["h100-80gb"])
Q4 = MODELS["qwen3-4b"]


def test_share_levels() -> None:
    assert SHARE_LEVELS == (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def test_decode_batch_one_barely_slows_prefill_halves() -> None:
    assert CM.slowdown(Stage.DECODE_SMALL, 0.5, model=Q4, batch=1, ctx_tokens=1000) == \
        pytest.approx(1.0, abs=0.02)
    assert CM.slowdown(Stage.PREFILL, 0.5, model=Q4) == pytest.approx(2.0, rel=0.05)
    assert CM.slowdown(Stage.ACTOR_UPDATE, 0.5, model=Q4, tp=4) == pytest.approx(2.0, rel=0.05)
    assert CM.slowdown(Stage.OLD_LOGPROB, 0.25) == pytest.approx(4.0, rel=0.05)


def test_memory_bound_decode_slows_below_saturation() -> None:
    s_sat = CM.params.s_sat
    assert CM.slowdown(Stage.DECODE_SMALL, s_sat) == pytest.approx(1.0, abs=0.02)
    assert CM.slowdown(Stage.DECODE_SMALL, s_sat / 2) > 1.3


def test_share_insensitive_stages() -> None:
    for stage in (Stage.WEIGHT_SYNC, Stage.REWARD, Stage.OFFLOAD, Stage.ONLOAD):
        assert CM.slowdown(stage, 0.2) == 1.0


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(COSTED_STAGES), st.sampled_from(sorted(MODELS)),
       st.sampled_from([1, 2, 4]),
       st.one_of(st.none(), st.integers(1, 4096)), st.one_of(st.none(), st.integers(0, 10**6)))
def test_slowdown_at_least_one_and_non_increasing(stage: str, model: str, tp: int,
                                                  batch: int | None, ctx: int | None) -> None:
    spec = MODELS[model]
    factors = [CM.slowdown(stage, s, model=spec, tp=tp, batch=batch, ctx_tokens=ctx)
               for s in SHARE_LEVELS]
    assert all(f >= 1.0 for f in factors)
    assert all(a >= b - 1e-12 for a, b in zip(factors, factors[1:], strict=False))
    assert factors[-1] == 1.0


def test_table_shape_and_ordering() -> None:
    table = CM.slowdown_table(Q4, tp=1)
    assert set(table) == set(COSTED_STAGES)
    for row in table.values():
        assert tuple(row) == SHARE_LEVELS
    # compute-bound stages suffer more than the memory-bound tail at every level
    for s in SHARE_LEVELS[:-1]:
        assert table[Stage.PREFILL][s] > table[Stage.DECODE_SMALL][s]
        assert table[Stage.ACTOR_UPDATE][s] > table[Stage.DECODE_LARGE][s]


def test_unknown_stage() -> None:
    with pytest.raises(ValueError, match="unknown stage"):
        CM.slowdown("decode", 0.5)
