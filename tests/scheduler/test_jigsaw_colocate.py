"""jigsaw's co-located rollouts (two engines per device): the co-run replay, the plan forecast
with two engine slots, and the first decision's choice (``colocate``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jigsawrl.config import validate_config
from jigsawrl.driver.state import DriverState
from jigsawrl.events import SampleFinished
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import make_cost, run_once
from jigsawrl.scheduler import StartRollout
from jigsawrl.scheduler.base import View
from jigsawrl.scheduler.jigsaw import JigsawPolicy
from jigsawrl.scheduler.jigsaw.corun import corun_rate
from jigsawrl.scheduler.jigsaw.params import JigsawParams
from jigsawrl.scheduler.jigsaw.plan_forecast import PlanPipe, Rates, forecast_plan
from jigsawrl.scheduler.jigsaw.residency import Residency
from jigsawrl.scheduler.rollout_tp import retp_view


def cfg(tasks: tuple[str, ...], steps: int = 2, mode: str = "sync", **extra):  # noqa: ANN003, ANN201
    pipes = [dict({"name": f"p{i}", "model": "qwen3-4b", "task": task, "batch_size": 64,
                   "group_size": 4, "max_response_tokens": 8192, "steps": steps, "mode": mode},
                  **extra) for i, task in enumerate(tasks)]
    if mode == "async":
        for p in pipes:
            p["max_staleness"] = 1
    return validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                        "accelerators_per_node": 8},
                            "pipelines": pipes, "seed": 0})


def first_view(c, tp: int | None = None) -> View:  # noqa: ANN001
    exp = resolve(c)
    state = DriverState(exp)
    state.can_regroup = True  # as the simulated executor says: TP groups of any width
    view = state.view(0.0, make_cost(exp))
    return view if tp is None else retp_view(view, {p.name: tp for p in view.pipelines})


def kv(view: View) -> float:
    res = Residency(JigsawParams(max_colocated=2))
    res.place(view)
    return res.kv_mem


# ---------------------------------------------------------------------------- co-run replay

def test_co_located_rollouts_pay_where_decodes_leave_the_device_idle() -> None:
    """Beside a twin at half the device each, a rollout slows (rate < 1), little where its
    decode is overhead- and tool-bound (multi-turn AIME on a whole node: two take about 1.5x
    one), much where it runs a large batch on one device (GSM8K at TP 1: nearly 2x)."""
    aime = first_view(cfg(("aime-tool", "aime-tool")), tp=8)
    gsm = first_view(cfg(("gsm8k", "gsm8k")), tp=1)
    at8 = corun_rate(aime, aime.pipelines[0], 1, kv(aime))
    at1 = corun_rate(gsm, gsm.pipelines[0], 8, kv(gsm))
    assert 0.6 < at8 < 1.0
    assert 0.0 < at1 < at8 - 0.05


def test_the_partner_sets_the_rate() -> None:
    """A rollout beside a light partner (few, short decodes between tool calls) runs faster
    than beside a twin of itself that decodes as much as it does."""
    view = first_view(cfg(("gsm8k", "search-r1")), tp=8)
    gsm, search = view.pipelines
    assert corun_rate(view, gsm, 1, kv(view), search) > corun_rate(view, gsm, 1, kv(view))


# ---------------------------------------------------------------------------- plan forecast

def test_two_engine_slots_run_two_rollouts_at_once_at_their_co_run_rate() -> None:
    """Whole-pool rollouts take turns with one engine per device; with two they overlap, each at
    its co-run rate while both run; the default (one slot) is the forecast as before."""
    a = PlanPipe("a", 1, gen_s=10.0, width=8)
    b = PlanPipe("b", 1, gen_s=10.0, width=8)
    rates = Rates(1.0, 1.0)
    assert forecast_plan([a, b], 8, rates).makespan_s == pytest.approx(20.0)
    free = forecast_plan([a, b], 8, rates, slots=2)
    assert free.makespan_s == pytest.approx(10.0)  # a co-run rate of 1: no slowdown
    slow = [replace(a, co_rate=0.8), replace(b, co_rate=0.8)]
    assert forecast_plan(slow, 8, rates, slots=2).makespan_s == pytest.approx(12.5)
    half = [replace(a, co_rate=0.4), replace(b, co_rate=0.4)]
    assert forecast_plan(half, 8, rates, slots=2).makespan_s == pytest.approx(25.0)


def test_a_pass_beside_two_engines_runs_at_its_own_rate() -> None:
    """Where devices hold two engines, a pass beside them runs at the two-engine shared rate
    (here 0.25), beside one engine at the one-engine rate (0.5), alone at full rate."""
    a = PlanPipe("a", 1, gen_s=10.0, width=8, train_s=40.0)  # the most work: rolls first
    b = PlanPipe("b", 1, gen_s=30.0, width=8)
    c = PlanPipe("c", 1, gen_s=30.0, width=8)
    one = Rates(0.5, 1.0)
    two = Rates(0.5, 1.0, compute_shared2=0.25, decode_shared2=1.0)
    # a and b roll 0-10; a trains from 10 beside b (to 30) and c (10-40): two engines to 30
    # (20 s at 0.25: 5 s of work), one to 40 (10 s at 0.5: 5 s), then alone (30 s)
    assert forecast_plan([a, b, c], 8, two, slots=2).finish_s["a"] == pytest.approx(70.0)
    # at the one-engine rate throughout the shared part: 30 s at 0.5, then 25 s alone
    assert forecast_plan([a, b, c], 8, one, slots=2).finish_s["a"] == pytest.approx(65.0)


# ---------------------------------------------------------------------------- the choice

def test_jigsaw_co_locates_the_aime_pair_and_not_when_told() -> None:
    """On the paper's AIME-tool pair (one node) the forecast with two engines per device is
    sooner by more than the margin: the first decision starts both rollouts on the same
    devices, and the report says so; ``colocate=False`` keeps one engine per device."""
    view = first_view(cfg(("aime-tool", "aime-tool"), steps=8))
    pol = JigsawPolicy()
    starts = [a for a in pol.decide(view).actions if isinstance(a, StartRollout)]
    rep = pol.report()["colocation"]
    assert rep["runs"] == 2 and rep["predicted_s"]["2"] < 0.95 * rep["predicted_s"]["1"]
    assert pol.params.max_colocated == 2 and len(starts) == 2
    assert set(starts[0].devices) & set(starts[1].devices)
    off = JigsawPolicy(colocate=False)
    off.decide(view)
    assert off.params.max_colocated == 1 and "colocation" not in off.report()


def test_no_co_location_search_on_async_groups_or_for_one_pipeline() -> None:
    for c in (cfg(("aime-tool", "aime-tool"), mode="async"), cfg(("aime-tool",))):
        pol = JigsawPolicy()
        pol.decide(first_view(c))
        assert pol.params.max_colocated == 1 and "colocation" not in pol.report()


def test_the_co_located_run_finishes_every_sample_and_beats_one_engine() -> None:
    """Simulated end to end (2 steps each): two engines per device run every sample of both
    pipelines, sooner than one engine per device (the gain the forecast chose it for)."""
    c = cfg(("aime-tool", "aime-tool"), steps=2)
    co = JigsawPolicy()
    on = run_once(resolve(c), co, seed=0)
    off = run_once(resolve(c), JigsawPolicy(colocate=False), seed=0)
    assert co.params.max_colocated == 2
    for run in (on, off):
        assert sum(isinstance(e, SampleFinished) for e in run.events) == 2 * 2 * 64 * 4
    assert on.makespan_s < off.makespan_s


def test_equal_makespan_and_shorter_steps_co_locate_the_hetero_pair() -> None:
    """The paper's 0.6B + 8B pair takes turns on the node with one engine per device (the small
    job's steps wait for the large one's rollouts): two engines are forecast no sooner (within
    1%) but with the pipelines' finishes summed far sooner, and jigsaw runs two — the latency
    tie-break, not the 5% throughput margin."""
    from jigsawrl.config import load_config

    view = first_view(load_config("configs/paper/hetero-0.6b-llama8b.yaml", ["seed=0"]))
    pol = JigsawPolicy()
    pol.decide(view)
    rep = pol.report()["colocation"]
    one, two = rep["predicted_s"]["1"], rep["predicted_s"]["2"]
    assert rep["runs"] == 2 and pol.params.max_colocated == 2
    assert one * 0.95 < two <= one * 1.01
    assert rep["finish_sum_s"]["2"] <= 0.9 * rep["finish_sum_s"]["1"]
