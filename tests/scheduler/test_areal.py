"""The ``areal`` baseline: staleness-bounded admission, several steps in flight, interrupts."""

from __future__ import annotations

import pytest
from test_streamrl import check_run, make_cfg, overlaps, run, tiny_view

from jigsawrl.errors import ConfigError
from jigsawrl.events import Span
from jigsawrl.experiments.simulated import simulate
from jigsawrl.scheduler.areal import ArealPolicy
from jigsawrl.scheduler.base import Interrupt, RunningTask, SetShare, StartRollout, task_id
from jigsawrl.stages import ROLLOUT_BANDS as ROLLOUT_STAGES
from jigsawrl.stages import Stage


def reprefills(spans: list[Span]) -> list[Span]:
    """Prefill spans that start exactly when a weight sync of their pipeline ends, on a rollout
    that was already running then: the resume-in-place after an interrupt."""
    first: dict[tuple[str, int], float] = {}
    for s in spans:
        if s.stage in ROLLOUT_STAGES:
            key = (s.pipeline, s.step)
            first[key] = min(first.get(key, s.start_s), s.start_s)
    syncs = {(s.pipeline, s.end_s) for s in spans if s.stage == Stage.WEIGHT_SYNC}
    return [s for s in spans if s.stage == Stage.PREFILL and (s.pipeline, s.end_s) not in syncs
            and any(p == s.pipeline and abs(t - s.start_s) < 1e-9 for p, t in syncs)
            and first[(s.pipeline, s.step)] < s.start_s - 1e-9]


def in_flight_together(spans: list[Span]) -> bool:
    """Rollouts of two different steps of one pipeline generate at the same time."""
    roll = [s for s in spans if s.stage in ROLLOUT_STAGES and s.stage != Stage.TOOL_WAIT]
    return any(a.pipeline == b.pipeline and a.step < b.step and a.start_s < b.end_s
               and b.start_s < a.end_s for a in roll for b in roll)


@pytest.mark.parametrize("placement", ["split", "shared"])
def test_areal_async_interrupts_and_overlaps(placement: str) -> None:
    cfg = make_cfg("async")
    spans = check_run(cfg, run(cfg, ArealPolicy(placement, 0)))
    assert in_flight_together(spans)
    if placement == "split":  # (shared: here p0's syncs land while p1 holds the rollout pool)
        assert reprefills(spans), "no rollout was interrupted by new weights"
        assert overlaps(spans)


def test_areal_sync_is_synchronous_disaggregated() -> None:
    cfg = make_cfg("sync")  # η = 0: no overlap, nothing in flight at a weight sync
    spans = check_run(cfg, run(cfg, ArealPolicy("split", 0)))
    assert not reprefills(spans)
    assert not in_flight_together(spans)
    assert not overlaps(spans)


def test_areal_small_model_four_devices() -> None:
    cfg = make_cfg("async", devices=4, model="qwen3-0.6b", tasks=("gsm8k", "aime-tool"), batch=8)
    spans = check_run(cfg, run(cfg, ArealPolicy("split", 0)))
    assert reprefills(spans)


def test_areal_searches_splits_and_refuses_infeasible() -> None:
    cfg = make_cfg("async", devices=4, model="qwen3-0.6b", tasks=("gsm8k", "math"), batch=4)
    assert simulate(cfg, policy="areal", solo=False).summary["variant"].startswith("areal-")
    with pytest.raises(ConfigError, match="fix:"):
        run(make_cfg("async", devices=2), ArealPolicy("shared", 0))


def test_areal_decision_on_hand_built_view() -> None:
    cfg = make_cfg("async", devices=8)
    pol = ArealPolicy("split", 0)
    first = [a for a in pol.decide(tiny_view(cfg)).actions if isinstance(a, StartRollout)]
    # η = 1: steps 0 and 1 are both admissible at once and share p0's rollout pool.
    assert [(a.pipeline, a.step, a.devices, a.share, a.dispatch) for a in first[:2]] == [
        ("p0", 0, (0, 1), 0.5, "contiguous"), ("p0", 1, (0, 1), 0.5, "contiguous")]
    # Step 0's weights are synced while step 1 still generates alone at full share: interrupt it
    # (resume on the new weights), admit step 2, and halve step 1's share first (so that it
    # re-prefills at its new share) before step 2 starts.
    gen1 = task_id("p0", 1, Stage.ROLLOUT)
    running = {"p0": (RunningTask(gen1, "p0", 1, Stage.ROLLOUT, (0, 1), 1.0, 0.0),)}
    acts = [a for a in pol.decide(tiny_view(cfg, steps_completed=1, running=running)).actions
            if getattr(a, "pipeline", None) == "p0" or getattr(a, "task_id", "").startswith("p0")]
    kinds = [(type(a).__name__, getattr(a, "step", None)) for a in acts]
    assert kinds == [("SetShare", None), ("Interrupt", None), ("StartRollout", 2)]
    assert acts[0] == SetShare(gen1, 0.5) and acts[1] == Interrupt(gen1)
