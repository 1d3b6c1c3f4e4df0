"""A rollout's generation on R ranks as the executor dispatches it (scheduler/batch_replay.py):
what the predicted batches are made of, and that the slowest rank is what is timed."""

from __future__ import annotations

import pytest
from test_planner import cfg, first_view

from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import make_cost
from jigsawrl.graph.build import rank_segments
from jigsawrl.scheduler.batch_replay import (
    DRAWS,
    draws_for,
    plain_s,
    prior_batches,
    rollout_s,
)
from jigsawrl.scheduler.verl_placements import prior_requests
from jigsawrl.sim.rollout import RolloutInstance
from jigsawrl.workload.requests import RequestTruth, TurnTruth


def setup(task: str = "math"):  # noqa: ANN201
    """One pipeline's first view and a maker of fresh rollout instances for it."""
    c = cfg((task,), devices=8, batch=16)
    pv = first_view(c).pipelines[0]
    cost = make_cost(resolve(c))

    def make(name: str) -> RolloutInstance:
        return RolloutInstance(name, pv.model, pv.spec.rollout_tp, cost,
                               kv_budget_tokens=400_000)
    return pv, make


def test_prior_batches_are_draws_of_whole_groups_the_same_every_time() -> None:
    pv, _ = setup()
    a = prior_batches(pv, prior_requests(pv))
    b = prior_batches(pv, prior_requests(pv))
    assert [[r.turns for r in x] for x in a] == [[r.turns for r in x] for x in b]
    assert len(a) > 1 and all(len(x) == 16 * 4 for x in a)
    # a group's samples share their prompt, and the draws differ
    for batch in a:
        prompts = [r.prompt_tokens for r in batch]
        assert all(len(set(prompts[i:i + 4])) == 1 for i in range(0, len(prompts), 4))
    assert a[0] != a[1]
    assert len(a) == DRAWS  # 64 requests a batch: the most draws


def test_larger_batches_are_drawn_fewer_times() -> None:
    """A replay budget: every batch of up to 256 requests (all example configs but scale-512)
    gets the most draws; 512 requests two, 1,024 or more one."""
    assert [draws_for(n) for n in (1, 128, 256, 300, 512, 1024, 5000)] == [
        DRAWS, DRAWS, DRAWS, DRAWS, 2, 1, 1]


def test_the_rollout_is_its_slowest_rank() -> None:
    pv, make = setup()
    short = [RequestTruth(f"s{i}", 100, (TurnTruth(100),)) for i in range(8)]
    long = [RequestTruth(f"l{i}", 100, (TurnTruth(2000 if i == 0 else 100),)) for i in range(8)]
    batch = short + long  # contiguous: rank 0 the short ones, rank 1 the long request

    def alone(reqs: list[RequestTruth]) -> float:
        inst = make("x")
        inst.add(reqs)
        return rank_segments(inst)[-1][2]
    assert rollout_s(pv, [batch], 2, make, 60e9) == pytest.approx(alone(long))
    assert rollout_s(pv, [batch], 2, make, 60e9) > alone(short)
    assert rollout_s(pv, [batch], 1, make, 60e9) == pytest.approx(alone(batch))
    # averaged over batches
    two = rollout_s(pv, [batch, short + short], 2, make, 60e9)
    assert two == pytest.approx((alone(long) + alone(short)) / 2)
    assert plain_s([short, long], make) == pytest.approx(alone(long))


def test_a_cut_replay_runs_on_to_the_same_end() -> None:
    """``rank_segments(until=...)`` stops mid-decode as an executor interrupts it; run on from
    there, the instance ends when an uncut replay does."""
    pv, make = setup()
    reqs = [RequestTruth(f"r{i}", 100, (TurnTruth(300 + 200 * i),)) for i in range(6)]
    whole = make("a")
    whole.add(reqs)
    end = rank_segments(whole)[-1][2]
    cut = make("b")
    cut.add(reqs)
    segs = rank_segments(cut, until=end / 2)
    assert segs[-1][2] == pytest.approx(end / 2) and not cut.done
    rest = rank_segments(cut, t0=segs[-1][2])
    # (the cut rounds to whole decode iterations)
    assert rest[-1][2] == pytest.approx(end, rel=0.01)
