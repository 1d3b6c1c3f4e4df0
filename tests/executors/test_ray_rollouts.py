"""Rollout bookkeeping of the Ray executor (plain Python): dispatch keeps GRPO groups together,
ownership moves with migrations, and results come back in index order exactly once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("ray")  # the package imports ray (executors/raycluster/__init__)

from jigsawrl.executors.raycluster.rollouts import (  # noqa: E402
    RankRT,
    RolloutRT,
    dispatch,
    request_index,
    shard_bounds,
)
from jigsawrl.scheduler.base import task_id  # noqa: E402
from jigsawrl.stages import Stage  # noqa: E402


def test_contiguous_dispatch_keeps_groups_and_balances() -> None:
    parts = dispatch(12, 2, 4, "contiguous")
    assert parts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11]]
    assert dispatch(4, 2, 3, "contiguous") == [[0, 1], [2, 3], []]


def test_skew_aware_deals_longest_groups_first() -> None:
    lengths = [5, 5, 50, 50, 10, 10, 40, 40]
    parts = dispatch(8, 2, 2, "skew_aware", lengths)
    assert sorted(i for p in parts for i in p) == list(range(8))
    assert {2, 3} <= set(parts[0]) and {6, 7} <= set(parts[1])  # the two longest split up
    for p in parts:  # groups stay whole
        assert all((i ^ 1) in p for i in p)


def test_ownership_moves_and_results_are_ordered_once() -> None:
    ro = RolloutRT(task_id("p", 0, Stage.ROLLOUT), "p", 0, 4,
                   [RankRT(0, (0,), 1.0), RankRT(1, (1,), 1.0)])
    ro.assign(0, [0, 1])
    ro.assign(1, [2, 3])
    assert ro.finished(2, "t2", 0)
    assert not ro.finished(2, "again", 0)  # a duplicate is ignored
    assert ro.move(1, 0) == 1 and ro.owned_by(0) == [0, 1, 3]
    for i, t in ((3, "t3"), (0, "t0"), (1, "t1")):
        ro.finished(i, t, 0)
    assert not ro.complete  # ranks not done yet
    for r in ro.ranks:
        r.done = True
    assert ro.complete
    assert [t for t, _ in ro.ordered()] == ["t0", "t1", "t2", "t3"]


def ckpt(tokens: int) -> SimpleNamespace:
    """A stand-in ``ExportedRequest`` with ``tokens`` generated tokens."""
    return SimpleNamespace(state=SimpleNamespace(output_ids=[7] * tokens))


def test_dead_rank_resumes_checkpointed_requests_and_regenerates_the_rest() -> None:
    ro = RolloutRT(task_id("p", 0, Stage.ROLLOUT), "p", 0, 6,
                   [RankRT(0, (0,), 1.0), RankRT(1, (1,), 1.0)])
    ro.assign(0, [0, 1, 2])
    ro.assign(1, [3, 4, 5])
    ro.ranks[0].fresh = ro.ranks[1].fresh = []  # sent with the first slices
    for i in (0, 3, 4):
        ro.keep_checkpoint(i, ckpt(5), 2)
    newer, older = ckpt(9), ckpt(4)
    ro.keep_checkpoint(3, newer, 2)
    ro.keep_checkpoint(3, older, 2)  # a late, older snapshot does not replace a newer one
    assert ro.finished(4, "t4", 2) and 4 not in ro.checkpoints  # finished: checkpoint dropped
    ro.keep_checkpoint(4, ckpt(6), 2)  # a late snapshot of a finished request is ignored
    assert sorted(ro.checkpoints) == [0, 3]
    resume, fresh = ro.recover(1, 0)
    assert resume == [(newer, 2)] and fresh == [5]
    assert ro.owned_by(0) == [0, 1, 2, 3, 5] and ro.owned_by(1) == []
    assert ro.ranks[0].fresh == [5]
    assert 3 in ro.checkpoints  # kept: still the latest state if rank 0 dies in turn


@pytest.mark.parametrize(("rid", "want"), [("calc/3/2/1", (2, 1)), ("a/b/0/5/0", (5, 0))])
def test_request_index(rid: str, want: tuple[int, int]) -> None:
    assert request_index(rid) == want


def test_shard_bounds_cover_rows_once() -> None:
    assert shard_bounds(5, 2) == [(0, 3), (3, 5)]
    assert shard_bounds(8, 3) == [(0, 3), (3, 6), (6, 8)]


def test_unreachable_cluster_is_a_clear_error() -> None:
    """--address where nobody listens: a ConfigError at once (Ray alone would retry for a
    minute, then abort the process)."""
    from jigsawrl.errors import ConfigError
    from jigsawrl.executors.raycluster.placement import check_reachable

    with pytest.raises(ConfigError, match="no Ray cluster answers"):
        check_reachable("127.0.0.1:1")
    check_reachable("auto")  # left to Ray


def test_busy_on_sees_a_pipelines_calls_and_helpers_on_a_device() -> None:
    """An offload runs beside other pipelines' calls only when none of its own pipeline's calls
    is queued or running on that worker (Residency.busy_on)."""
    from jigsawrl.executors.raycluster.records import Call, CallKind, RunState, Settings
    from jigsawrl.executors.raycluster.residency import Residency

    state = RunState(Settings())
    state.calls = {
        "a": Call(CallKind.STAGE, "p", 0, Stage.ACTOR_UPDATE, (0,), 1.0, helpers=(1,)),  # helper
        "b": Call(CallKind.CHUNK, "q", 0, Stage.ROLLOUT, (2,), 1.0),
        "c": Call(CallKind.STAGE, "r", 0, Stage.WEIGHT_SYNC, (), 0.0, weights=object()),
    }
    res = Residency(state)
    assert res.busy_on("p", 0) and res.busy_on("p", 1) and not res.busy_on("p", 2)
    assert res.busy_on("q", 2) and not res.busy_on("q", 0)
    assert not res.busy_on("r", 0)
