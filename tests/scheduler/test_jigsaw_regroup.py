"""jigsaw's tail regroup (issue 11 item 4): when it acts, what it conserves, what it is worth."""

from __future__ import annotations

import math

import pytest
from test_jigsaw import Recorder, cfg

from jigsawrl.driver.state import DriverState
from jigsawrl.events import SampleFinished, StepFinished
from jigsawrl.executors.simulated import SimulatedExecutor
from jigsawrl.experiments.core import drive
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import TRUTH_NOISE_SIGMA, make_cost, run_once
from jigsawrl.scheduler import Migrate, Regroup, get_policy
from jigsawrl.scheduler.batch_replay import plain_s
from jigsawrl.scheduler.jigsaw import JigsawPolicy
from jigsawrl.scheduler.jigsaw.fallback import best_verl, verl_plans
from jigsawrl.scheduler.jigsaw.policy import PlanChoice
from jigsawrl.scheduler.jigsaw.regroup import placed_replay, replay_s, widest_tp
from jigsawrl.sim.rollout import RolloutInstance
from jigsawrl.workload.requests import RequestTruth, TurnTruth


def solo():  # noqa: ANN201
    """One tail-bound pipeline of a 4B model on 8 devices (a 0.6B model's decode is bound by
    per-iteration overheads, not by reading its weights: a wider group gains it little)."""
    return resolve(cfg(n=1, devices=8, batch=32, task="math", steps=2, model="qwen3-4b"))


def test_widest_tp() -> None:
    assert [widest_tp(n, 16) for n in (1, 2, 3, 4, 7, 8, 16)] == [1, 2, 2, 4, 4, 8, 16]
    assert widest_tp(8, 14) == 2  # 14 heads: 2 divides them, 4 does not


def test_tail_regroups_conserves_samples_and_ends_sooner() -> None:
    exp = solo()
    rec = Recorder(get_policy("jigsaw", {"fallback": False, "tp_search": False}))  # (a solo pipeline falls back)
    res = run_once(exp, rec, 3)
    groups = [a for d in rec.decisions for a in d.actions if isinstance(a, Regroup)]
    assert groups and len({g.task_id for g in groups}) == len(groups)  # once per rollout
    assert all(len(g.src_ranks) + 1 in (2, 4, 8) for g in groups)  # TP 1 ranks: a power of 2
    ids = [e.sample_id for e in res.events if isinstance(e, SampleFinished)]
    assert len(ids) == len(set(ids)) == 2 * 32 * 4
    assert len([e for e in res.events if isinstance(e, StepFinished)]) == 2
    off = run_once(exp, get_policy("jigsaw", {"fallback": False, "tail_tp": False, "tp_search": False}), 3)
    assert res.makespan_s < off.makespan_s


def test_no_regroup_where_the_executor_cannot() -> None:
    exp = solo()
    ex = SimulatedExecutor(exp, truth_cost=make_cost(exp, noise_sigma=TRUTH_NOISE_SIGMA, seed=3),
                           seed=3)
    ex.can_regroup = False
    rec = Recorder(get_policy("jigsaw", {"fallback": False, "tp_search": False}))
    drive(exp, rec, ex, make_cost(exp))
    acts = [a for d in rec.decisions for a in d.actions]
    assert not any(isinstance(a, Regroup) for a in acts)
    assert any(isinstance(a, Migrate) for a in acts)  # drained ranks are released as before


def _ranks_setup():  # noqa: ANN202
    exp = solo()
    cost = make_cost(exp)
    pv = DriverState(exp).view(0.0, cost).pipelines[0]

    def reqs(long: int) -> list[RequestTruth]:
        return [RequestTruth(f"r{long}/{i}", 100, (TurnTruth(n),))
                for i, n in enumerate([long] + [50] * 40)]

    def inst(name: str = "x") -> RolloutInstance:
        return RolloutInstance(name, pv.model, 1, cost, kv_budget_tokens=200_000)
    return cost, pv, reqs, inst


def test_forecast_replay_regroups_only_when_it_ends_sooner() -> None:
    cost, pv, reqs, inst = _ranks_setup()
    # one rank with a long request, three whose longest is shorter: once they drain, the one
    # long request left fits a TP-4 group
    ranks = [reqs(1900), reqs(400), reqs(400), reqs(400)]
    plain = plain_s(ranks, inst)
    assert plain == pytest.approx(plain_s(ranks[:1], inst))  # the slowest rank is the rollout
    assert replay_s(cost, pv, ranks, inst, 1, 60e9, 128) == pytest.approx(plain)
    wide = replay_s(cost, pv, ranks, inst, 4, 60e9, 128)
    assert wide < plain  # the long request on four devices: a quarter of the weights each
    # a group that would take the short requests too (a limit above 164 at the first drain)
    # is not taken when it ends later: never predicted worse than the plain replay
    assert replay_s(cost, pv, ranks, inst, 4, 60e9, 1000) <= plain


def test_forecast_replay_weighs_a_regroup_only_when_a_rank_drains() -> None:
    """The ranks are replayed together, not one rank standing for all: like the policy, which
    holds drained ranks for a group, the replay forms one only once a rank has drained — alike
    ranks draining together leave nothing to regroup."""
    cost, pv, reqs, inst = _ranks_setup()
    alike = [reqs(1900)] * 4
    assert replay_s(cost, pv, alike, inst, 4, 60e9, 128) == pytest.approx(plain_s(alike, inst))
    # one rank draining early is enough for the tails of the other three (three requests)
    early = [reqs(1900), reqs(1900), reqs(1900), reqs(400)]
    assert replay_s(cost, pv, early, inst, 4, 60e9, 128) < plain_s(early, inst)


class FallsBack(JigsawPolicy):
    """jigsaw made to run the best verl placement (as where it is predicted no worse)."""

    def _choose_plan(self, view):  # noqa: ANN001, ANN202
        verl = best_verl(view)
        self._delegate = verl.build()
        return PlanChoice(verl.name, math.inf, verl.name, verl.makespan_s)


def test_a_verl_placement_jigsaw_falls_back_to_regroups_its_tails() -> None:
    exp = solo()
    pol = FallsBack(tp_search=False)
    rec = Recorder(pol)
    res = run_once(exp, rec, 3)
    assert pol.choice is not None and pol.choice.runs.startswith("verl")
    groups = [a for d in rec.decisions for a in d.actions if isinstance(a, Regroup)]
    assert groups and len({g.task_id for g in groups}) == len(groups)
    ids = [e.sample_id for e in res.events if isinstance(e, SampleFinished)]
    assert len(ids) == len(set(ids)) == 2 * 32 * 4
    plain = run_once(exp, FallsBack(tail_tp=False, tp_search=False), 3)
    assert res.makespan_s < plain.makespan_s


def test_verl_placements_jigsaw_would_run_are_timed_with_its_regroups() -> None:
    """The fallback compares like for like: a verl placement jigsaw runs regroups its tails, so
    its predicted makespan replays them (never later than without); the placements themselves
    (names, slices) are verl's own. (MATH up to 4,096 tokens: at 2,048 the ranks drain within a
    second of each other, too close for a regroup to repay its wake-up.)"""
    exp = resolve(cfg(n=2, devices=8, batch=32, task="math", steps=2, model="qwen3-4b",
                      max_response_tokens=4096))
    state = DriverState(exp)
    state.can_regroup = True
    view = state.view(0.0, make_cost(exp))
    plain = {p.name: p.makespan_s for p in verl_plans(view)}
    tails = {p.name: p.makespan_s for p in verl_plans(view, gen_replay=placed_replay(view, 128))}
    assert plain.keys() == tails.keys() and len(plain) >= 2
    assert all(tails[k] <= plain[k] + 1e-9 for k in plain)
    assert any(tails[k] < plain[k] for k in plain)
    pol = JigsawPolicy(tp_search=False)
    pol.decide(view)
    assert pol.choice is not None and pol.choice.verl_s == pytest.approx(min(tails.values()))
