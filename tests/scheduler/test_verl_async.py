"""verl's async recipes (one-step-off, fully-async) and their place among verl's variants."""

from __future__ import annotations

from collections import defaultdict

import pytest
from test_streamrl import check_run, make_cfg, overlaps, run

from jigsawrl.errors import ConfigError
from jigsawrl.events import Span
from jigsawrl.experiments.simulated import simulate
from jigsawrl.scheduler import get_policy
from jigsawrl.scheduler.rollout_tp import TP_FACTORS
from jigsawrl.scheduler.verl_async import VerlFullyAsyncPolicy, VerlOneStepOffPolicy
from jigsawrl.stages import ROLLOUT_BANDS, Stage


def rollouts_in_flight(spans: list[Span]) -> int:
    """Most rollout steps of one pipeline generating at once."""
    by: dict[tuple[str, int], list[float]] = defaultdict(lambda: [float("inf"), 0.0])
    for s in spans:
        if s.stage in ROLLOUT_BANDS:
            w = by[(s.pipeline, s.step)]
            w[0], w[1] = min(w[0], s.start_s), max(w[1], s.end_s)
    most = 1
    for (p, k), (a, b) in by.items():
        most = max(most, 1 + sum(q == p and j != k and x < b and a < y
                                 for (q, j), (x, y) in by.items()))
    return most


@pytest.mark.parametrize("cls", [VerlOneStepOffPolicy, VerlFullyAsyncPolicy])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_recipes_run_disaggregated_within_invariants(cls: type, mode: str) -> None:
    cfg = make_cfg(mode)
    spans = check_run(cfg, run(cfg, cls("split", 0)))
    assert overlaps(spans) == (mode == "async")  # step k+1 generates while step k trains
    assert {s.stage for s in spans} >= {Stage.ACTOR_UPDATE, Stage.WEIGHT_SYNC}


def test_fully_async_runs_several_versions_one_step_off_one() -> None:
    cfg = make_cfg("async")
    cfg = cfg.model_copy(update={"pipelines": [p.model_copy(update={"max_staleness": 2})
                                               for p in cfg.pipelines]})
    one = check_run(cfg, run(cfg, VerlOneStepOffPolicy("split", 0)))
    full = check_run(cfg, run(cfg, VerlFullyAsyncPolicy("split", 0)))
    assert rollouts_in_flight(one) == 1
    assert rollouts_in_flight(full) > 1


def test_recipes_dispatch_contiguous_and_split_only() -> None:
    assert VerlOneStepOffPolicy.dispatch == VerlFullyAsyncPolicy.dispatch == "contiguous"
    with pytest.raises(ConfigError, match="split"):
        VerlOneStepOffPolicy("shared", 0)
    plain = [f"verl-one-step-off-split#{k}" for k in range(6)]
    assert [v.name for v in get_policy("verl-one-step-off").variants()] == plain + [
        f"{n}@tp x{f:g}" for f in TP_FACTORS[1:] for n in plain]


def test_verl_on_async_pipelines_may_pick_a_recipe_and_skips_them_on_sync() -> None:
    run_async = simulate(make_cfg("async"), policy="verl", solo=False)
    assert run_async.variant  # some placement won; the recipes competed
    run_sync = simulate(make_cfg("sync"), policy="verl", solo=False)
    assert not run_sync.variant.startswith("verl-one-step-off")
    assert not run_sync.variant.startswith("verl-fully-async")
