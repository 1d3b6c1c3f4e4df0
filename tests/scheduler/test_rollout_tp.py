"""Rollout TP as a choice: verl's baseline tries scaled TPs, jigsaw searches them by prediction."""

from __future__ import annotations

import math

import pytest
from test_jigsaw import Recorder, cfg

from jigsawrl.driver.state import DriverState
from jigsawrl.errors import ConfigError
from jigsawrl.events import SampleFinished, Span
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import make_cost, run_once, simulate
from jigsawrl.scheduler import StartRollout, get_policy
from jigsawrl.scheduler.base import View
from jigsawrl.scheduler.jigsaw import JigsawPolicy
from jigsawrl.scheduler.jigsaw.tp_search import search_tp
from jigsawrl.scheduler.rollout_tp import RolloutTP, retp_view, scaled_tp, scaled_tps
from jigsawrl.scheduler.verl import VerlPolicy
from jigsawrl.sim.works import stage_cost
from jigsawrl.stages import Stage


def view_of(c, can_regroup: bool = True) -> View:  # noqa: ANN001
    exp = resolve(c)
    st = DriverState(exp)
    st.can_regroup = can_regroup
    return st.view(0.0, make_cost(exp))


def test_scaled_tp_is_a_power_of_two_in_a_node_dividing_the_heads() -> None:
    pv = view_of(cfg(n=1, devices=8, model="qwen3-4b")).pipelines[0]  # 32 heads, TP 1
    assert [scaled_tp(pv, f, 8) for f in (0.5, 1, 2, 4, 16)] == [1, 1, 2, 4, 8]
    assert scaled_tp(pv, 16, 4) == 4  # no wider than a node
    pv = view_of(cfg(n=1, devices=8, model="qwen3-4b", rollout_tp=2)).pipelines[0]
    assert [scaled_tp(pv, f, 8) for f in (0.5, 1, 2, 4)] == [1, 2, 4, 8]


def test_retp_view_changes_only_the_rollout_tp() -> None:
    view = view_of(cfg(n=2, devices=8))
    new = retp_view(view, {"p0": 2, "p1": 1})
    assert [p.spec.rollout_tp for p in new.pipelines] == [2, 1]
    assert new.pipelines[1] is view.pipelines[1]  # unchanged pipelines are the same objects
    a, b = view.pipelines[0].spec, new.pipelines[0].spec
    assert a.model_dump() | {"rollout_tp": 2} == b.model_dump()


def test_a_scale_that_changes_nothing_or_a_fixed_tp_executor_fails_fast() -> None:
    view = view_of(cfg(n=2, devices=8))
    with pytest.raises(ConfigError, match="config's own"):
        RolloutTP(VerlPolicy("split"), 0.5).decide(view)  # TP 1 halved is TP 1
    with pytest.raises(ConfigError, match="configured rollout TP only"):
        RolloutTP(VerlPolicy("split"), 2.0).decide(view_of(cfg(n=2, devices=8), False))
    # TP 2 x8 caps at the node's 8 devices, what x4 already runs: a duplicate, skipped
    tp2 = view_of(cfg(n=2, devices=8, model="qwen3-4b", rollout_tp=2))
    with pytest.raises(ConfigError, match="earlier scale"):
        RolloutTP(VerlPolicy("split"), 8.0).decide(tp2)
    RolloutTP(VerlPolicy("serial"), 8.0).decide(view_of(cfg(n=2, devices=8, model="qwen3-4b")))


def test_verl_at_a_scaled_tp_starts_wider_engines_and_syncs_onto_them() -> None:
    exp = resolve(cfg(n=2, devices=8, model="qwen3-4b", steps=1))
    rec = Recorder(RolloutTP(VerlPolicy("split"), 2.0))
    res = run_once(exp, rec, 3)
    starts = [a for d in rec.decisions for a in d.actions if isinstance(a, StartRollout)]
    assert starts and all(a.tp == 2 and len(a.devices) % 2 == 0 for a in starts)
    assert rec.inner.name == "verl-split@tp2"
    ids = [e.sample_id for e in res.events if isinstance(e, SampleFinished)]
    assert len(ids) == len(set(ids)) == 2 * 16 * 4
    sync = [e for e in res.events if isinstance(e, Span) and e.stage == Stage.WEIGHT_SYNC]
    assert sync
    pipe, cost = exp.pipelines[0], make_cost(exp)
    at2, at1 = (stage_cost(cost, pipe, Stage.WEIGHT_SYNC, 4, (), rollout_tp=t)[0] for t in (2, 1))
    assert at2 != at1  # the sync is priced onto the TP the engine runs at


def test_verl_variants_include_each_placement_at_scaled_tps_as_fresh_policies() -> None:
    vs = get_policy("verl").variants()
    wrapped = [v for v in vs if isinstance(v, RolloutTP)]
    plain = [v for v in vs if not isinstance(v, RolloutTP)]
    assert wrapped and len(wrapped) % len(plain) == 0
    inner = [id(v.inner) for v in wrapped]
    assert len(set(inner)) == len(inner) and not set(inner) & {id(v) for v in plain}


def test_verl_baseline_reports_a_scaled_tp_when_it_wins() -> None:
    c = cfg(n=2, devices=8, model="qwen3-4b", task="math", batch=32, steps=2)
    run = simulate(c, policy="verl", seed=3, solo=False)
    plain = simulate(c, policy="verl-split", seed=3, solo=False)
    assert run.summary["throughput_tokens_per_s"] >= plain.summary["throughput_tokens_per_s"]
    assert run.variant is not None


def test_search_runs_the_tp_predicted_soonest_the_config_tp_on_a_tie() -> None:
    view = view_of(cfg(n=2, devices=8, model="qwen3-4b"))
    by_tp = {1: 100.0, 2: 98.0, 4: 99.0, 8: 99.5}
    excess = {1: 0.0, 2: 0.0, 4: 0.0, 8: 0.0}

    def plan(v: View) -> tuple[float, float]:
        tp = v.pipelines[0].spec.rollout_tp
        return excess[tp], by_tp[tp]
    choice = search_tp(view, plan)
    assert choice.tps == {"p0": 2, "p1": 2}
    assert choice.predicted_s == {"tp1": 100.0, "tp2": 98.0, "tp4": 99.0, "tp8": 99.5}
    assert choice.excess == {}
    excess.update({2: 0.3, 4: 0.1})  # over a latency bound: the soonest within them wins
    choice = search_tp(view, plan)
    assert choice.tps == {"p0": 8, "p1": 8} and choice.excess == {"tp2": 0.3, "tp4": 0.1}
    excess.update({2: 0.0, 4: 0.0})
    by_tp.update({2: 100.0, 4: 100.0, 8: 100.0})  # a tie: the config's TP stays
    assert search_tp(view, plan).tps == {}
    by_tp.update({1: math.inf, 2: math.inf, 4: math.inf, 8: math.inf})
    assert search_tp(view, plan).tps == {}


def test_jigsaw_runs_the_tp_it_predicts_soonest_and_reports_it() -> None:
    exp = resolve(cfg(n=2, devices=8, model="qwen3-4b", task="math", batch=32, steps=2))
    pol = JigsawPolicy()
    rec = Recorder(pol)
    run_once(exp, rec, 3)
    rep = pol.report()["rollout_tp"]
    assert pol.tp is not None and set(rep["predicted_s"]) >= {"tp1", "tp2"}
    best = min(pol.tp.predicted_s.values())
    chosen = pol.tp.predicted_s["tp" + str(pol.tp.tps["p0"]) if pol.tp.tps else "tp1"]
    assert chosen == best
    tps = {a.tp for d in rec.decisions for a in d.actions if isinstance(a, StartRollout)}
    assert tps == {pol.tp.tps["p0"] if pol.tp.tps else 1}


def test_no_search_where_the_executor_runs_fixed_tps() -> None:
    view = view_of(cfg(n=2, devices=8, model="qwen3-4b"), can_regroup=False)
    pol = JigsawPolicy()
    pol.decide(view)
    assert pol.tp is None and "rollout_tp" not in pol.report()
    assert scaled_tps(view, 1.0) == {"p0": 1, "p1": 1}


def test_the_driver_rejects_a_rollout_tp_that_cannot_form_groups() -> None:
    from jigsawrl.driver.state import InvariantError

    class Odd(VerlPolicy):
        def _start(self, view, pv, step, stage, devs):  # noqa: ANN001, ANN202
            a = super()._start(view, pv, step, stage, devs)
            return StartRollout(a.pipeline, a.step, a.devices, 3, kv_mem_bytes=a.kv_mem_bytes) \
                if isinstance(a, StartRollout) else a

    with pytest.raises(InvariantError, match="TP groups of 3"):
        run_once(resolve(cfg(n=2, devices=8, model="qwen3-4b", steps=1)), Odd("split"), 3)


def test_get_policy_jigsaw_takes_tp_search() -> None:
    assert get_policy("jigsaw", {"tp_search": False}).params.tp_search is False
