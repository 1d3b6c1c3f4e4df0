"""The planner of issue 11: widths by critical path, the plan forecast, the train-state slot by
urgency, and no losses (the verl placement jigsaw falls back to)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jigsawrl.config import validate_config
from jigsawrl.driver.state import DriverState
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import make_cost, run_once
from jigsawrl.graph.predict import HistoryPredictor, StepObservation
from jigsawrl.graph.substage import SubStageGraph
from jigsawrl.scheduler import StartRollout, StartStage, get_policy
from jigsawrl.scheduler.base import View
from jigsawrl.scheduler.jigsaw import JigsawPolicy
from jigsawrl.scheduler.jigsaw.fallback import verl_plans
from jigsawrl.scheduler.jigsaw.plan_forecast import PlanPipe, Rates, forecast_plan
from jigsawrl.scheduler.jigsaw.planner import GEN_TIMING, WidthPlanner, fair_width
from jigsawrl.scheduler.jigsaw.widths import WidthTimer, as_turns, width_ladder
from jigsawrl.stages import Stage
from jigsawrl.workload.requests import RequestTruth


def cfg(tasks: tuple[str, ...], devices: int = 8, steps: int = 3, batch: int = 32,
        model: str = "qwen3-0.6b", **extra):  # noqa: ANN003, ANN201
    pipes = [dict({"name": f"p{i}", "model": model, "task": task, "batch_size": batch,
                   "group_size": 4, "max_response_tokens": 4096, "steps": steps}, **extra)
             for i, task in enumerate(tasks)]
    return validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                        "accelerators_per_node": devices},
                            "pipelines": pipes, "seed": 3})


def first_view(c) -> View:  # noqa: ANN001
    exp = resolve(c)
    return DriverState(exp).view(0.0, make_cost(exp))


def planner_for(view: View) -> WidthPlanner:
    pol = JigsawPolicy(fallback=False)
    pol.residency.place(view)
    return pol.planner


# ---------------------------------------------------------------------------- plan forecast

def test_one_pipeline_forecast_is_its_steps_end_to_end() -> None:
    """Alone, a step is rollout, reward, onload, passes, then weight sync (the offload runs
    beside the sync): the forecast adds them up exactly."""
    p = PlanPipe("a", 3, gen_s=10.0, width=8, reward_s=0.5, train_s=4.0, move_s=1.0, sync_s=2.0)
    res = forecast_plan([p], 8, Rates(0.6, 0.9))
    assert res.makespan_s == pytest.approx(3 * (10.0 + 0.5 + 0.5 + 4.0 + 2.0))
    assert res.finish_s == {"a": res.makespan_s}


def test_forecast_serialises_training_and_shares_the_pool() -> None:
    """Two pipelines: one train state at a time (the passes never overlap), so the makespan is
    at least every pass back to back; a pass beside a rollout on every device runs at the shared
    rate and slows that rollout."""
    a = PlanPipe("a", 2, gen_s=10.0, width=4, train_s=6.0)
    b = PlanPipe("b", 2, gen_s=10.0, width=4, train_s=6.0)
    res = forecast_plan([a, b], 8, Rates(0.5, 0.8))
    assert res.makespan_s >= 4 * 6.0
    alone = forecast_plan([a], 8, Rates(0.5, 0.8)).makespan_s
    assert res.makespan_s > alone  # they contend for the train-state slot and the devices
    # narrower rollouts leave devices free: a pass runs there at full share when that is faster
    narrow = [replace(a, width=1, gen_s=12.0), replace(b, width=1, gen_s=12.0)]
    assert forecast_plan(narrow, 8, Rates(0.5, 0.8)).makespan_s < res.makespan_s + 2 * 2 * 2.0


def test_a_rollout_takes_the_devices_of_a_finished_pipeline() -> None:
    """Once a pipeline has finished, the other's next rollouts run wider (as the replan does)."""
    short = PlanPipe("s", 1, gen_s=5.0, width=4)
    long_ = PlanPipe("l", 4, gen_s=20.0, width=4, wider=(8,), gen_at=lambda w: 12.0)
    res = forecast_plan([short, long_], 8, Rates(0.5, 1.0))
    assert res.finish_s["l"] == pytest.approx(20.0 + 3 * 12.0)


def test_async_rollouts_run_ahead_of_training_up_to_the_staleness() -> None:
    sync = PlanPipe("a", 3, gen_s=10.0, width=8, train_s=5.0)
    lag = replace(sync, staleness=1)
    assert forecast_plan([lag], 8, Rates(0.5, 1.0)).makespan_s < \
        forecast_plan([sync], 8, Rates(0.5, 1.0)).makespan_s


def test_an_async_pipelines_next_rollout_starts_beside_its_running_one() -> None:
    """Staleness 1 on half the pool: the second rollout needs no trained step, so it runs
    beside the first (two in flight), and the third waits for step 0's training: 3 rollouts of
    10 s and passes of 5 s end by 10 + 10 + 5 + 5 = 30 s, not 3 × 10 + 5 as one at a time; a
    pool too small for two keeps them one at a time."""
    lag = PlanPipe("a", 3, gen_s=10.0, width=4, train_s=5.0, staleness=1)
    res = forecast_plan([lag], 8, Rates(1.0, 1.0))
    assert res.makespan_s == pytest.approx(30.0)
    narrow = forecast_plan([lag], 4, Rates(1.0, 1.0)).makespan_s
    assert narrow > res.makespan_s


def test_a_running_next_rollout_is_counted_where_it_is() -> None:
    """At a replan an async pipeline may have its next step's rollout running already: the
    forecast takes its time left (8 s) instead of starting it afresh (20 s)."""
    now = PlanPipe("a", 2, gen_s=20.0, width=4, train_s=5.0, staleness=1, rolling_s=5.0)
    seen = replace(now, ahead_s=8.0)
    assert forecast_plan([seen], 8, Rates(1.0, 1.0)).makespan_s == pytest.approx(15.0)
    assert forecast_plan([now], 8, Rates(1.0, 1.0)).makespan_s == pytest.approx(25.0)
    done = replace(seen, rolling_s=None, trained_first=True)  # its current rollout finished
    assert forecast_plan([done], 8, Rates(1.0, 1.0)).makespan_s == pytest.approx(13.0)


# ---------------------------------------------------------------------------- widths

def test_width_ladder_is_whole_tp_groups_and_ends_at_the_pool() -> None:
    assert width_ladder(8, 1) == [1, 2, 3, 4, 6, 8]
    assert width_ladder(16, 4) == [4, 8, 12, 16]
    lad = width_ladder(512, 2)
    assert lad[-1] == 512 and all(w % 2 == 0 for w in lad) and len(lad) < 20


def test_more_width_shortens_a_rollout_and_multi_turn_keeps_its_turns() -> None:
    view = first_view(cfg(("math", "aime-tool")))
    timer = WidthTimer(3, 20e9)
    math_pv, aime = view.pipelines
    times = [timer.gen_s(view, math_pv, w) for w in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True) and times[0] > 2 * times[-1]
    assert len(as_turns(aime, 3000)) > 1 and len(as_turns(math_pv, 3000)) == 1


def test_a_width_off_the_ladder_is_interpolated_between_its_neighbours() -> None:
    """gen_s_near: exact on a ladder width (the same number gen_s gives); between two, between
    their times (linear in 1 / width) without a replay of its own."""
    view = first_view(cfg(("math",), devices=64))
    pv = view.pipelines[0]
    timer = WidthTimer(3, 20e9)
    ladder = width_ladder(64, 1)
    assert 5 not in ladder and 4 in ladder and 6 in ladder
    assert timer.gen_s_near(view, pv, 4) == timer.gen_s(view, pv, 4)
    lo, hi = timer.gen_s(view, pv, 4), timer.gen_s(view, pv, 6)
    cached = len(timer._gen)
    mid = timer.gen_s_near(view, pv, 5)
    assert len(timer._gen) == cached  # no new replay
    assert min(lo, hi) <= mid <= max(lo, hi)
    assert mid == pytest.approx(lo + (1 / 4 - 1 / 5) / (1 / 4 - 1 / 6) * (hi - lo))


def test_cached_near_reads_only_times_worked_out_already() -> None:
    """What a decision may read without a replay (the rest is background work): None until
    both neighbours of an off-ladder width (or the width itself) were timed, then gen_s_near."""
    view = first_view(cfg(("math",), devices=64))
    pv = view.pipelines[0]
    timer = WidthTimer(3, 20e9)
    assert timer.cached_near(view, pv, 5) is None and timer.cached_near(view, pv, 4) is None
    timer.gen_s(view, pv, 4)
    assert timer.cached_near(view, pv, 4) == timer.gen_s(view, pv, 4)
    assert timer.cached_near(view, pv, 5) is None  # 6 not timed yet
    timer.gen_s(view, pv, 6)
    assert timer.cached_near(view, pv, 5) == timer.gen_s_near(view, pv, 5)
    grown = replace(pv, history=(StepObservation(0, (150,) * 128, (300,) * 128, {}),))
    assert timer.cached_near(view, grown, 4) is None  # a new source: its times are not known


def test_predicted_requests_are_the_history_predictors_longest_first() -> None:
    """The timer builds its requests from the predictor's lengths (turns cached per total):
    the same requests as the predictor's, split into turns and sorted longest first."""
    view = first_view(cfg(("math", "aime-tool")))
    n = 32 * 4
    hist = (StepObservation(0, (140,) * n, tuple(range(200, 200 + 29 * n, 29)), {}),)
    for pv in view.pipelines:
        pv = replace(pv, history=hist)
        got = WidthTimer(3, 20e9).requests(pv)
        flat = HistoryPredictor(3).predict(pv.name, 1, n, hist, 128, 4096 // 4, 4096, 1)
        want = sorted((RequestTruth(r.sample_id, r.prompt_tokens,
                                    as_turns(pv, r.generated_tokens)) for r in flat),
                      key=lambda r: -r.generated_tokens)
        assert got == want and len({r.generated_tokens for r in got}) > n // 2


def test_the_critical_pipeline_gets_the_width() -> None:
    """A short GSM8K job beside a long MATH job: the planner gives MATH more devices than the
    fair half (it is on the critical path), GSM8K fills around it, and the plan is predicted no
    worse than the fair cap."""
    view = first_view(cfg(("gsm8k", "math"), model="qwen3-4b", batch=64, steps=4))
    planner = planner_for(view)
    plan = planner.make_plan(view)
    assert plan.widths["p1"] > fair_width(view, 1, 1) > plan.widths["p0"]
    assert sum(plan.widths.values()) <= len(view.devices)
    no_plan = JigsawPolicy(fallback=False, plan_widths=False)  # the fair cap (the ablation)
    no_plan.residency.place(view)
    assert plan.result.key() <= no_plan.planner.make_plan(view).result.key()


def long_gsm8k_short_math(view: View) -> View:
    """``view`` after a first step in which GSM8K (``p0``) answered long and MATH short."""
    n = 64 * 4
    long_hist = (StepObservation(0, (150,) * n, tuple([3900] * (n // 2) + [2500] * (n // 2)),
                                 {}),)
    short_hist = (StepObservation(0, (150,) * n, (300,) * n, {}),)
    g, m = view.pipelines
    return replace(view, pipelines=(replace(g, history=long_hist),
                                    replace(m, history=short_hist)))


def test_a_changed_prediction_changes_the_plan() -> None:
    """The plan follows the predicted lengths: when GSM8K's history shows long responses, it is
    no longer the one to run narrow (the truth is never read: only the view's history moved)."""
    view = first_view(cfg(("gsm8k", "math"), model="qwen3-4b", batch=64, steps=4))
    before = planner_for(view).make_plan(view).widths
    moved = long_gsm8k_short_math(view)
    after = planner_for(moved).make_plan(moved).widths
    assert before["p0"] < before["p1"]
    assert after["p0"] > after["p1"]


def test_a_replan_also_searches_from_the_plan_in_force() -> None:
    """A third start (the plan in force) is one more candidate: a replan is never forecast
    worse than a fresh search on the same view, and at 128 GPUs it found better plans
    (docs/BENCHMARKS.md)."""
    view = first_view(cfg(("gsm8k", "math", "aime-tool", "search-r1"), devices=16,
                          model="qwen3-4b", batch=64, steps=4))
    planner = planner_for(view)
    planner.plan = planner.make_plan(view)
    g, m, a, r = view.pipelines
    moved = replace(view, pipelines=(g, m, a, replace(r, history=(StepObservation(
        0, (150,) * 256, (6000,) * 256, {}),))))
    warm = planner.make_plan(moved).result.key()
    assert warm <= planner_for(moved).make_plan(moved).result.key()


def test_policy_starts_rollouts_at_planned_widths() -> None:
    view = first_view(cfg(("gsm8k", "math"), model="qwen3-4b", batch=64, steps=4))
    pol = JigsawPolicy(fallback=False)
    starts = {a.pipeline: a for a in pol.decide(view).actions if isinstance(a, StartRollout)}
    plan = pol.planner.plan
    assert plan is not None
    assert {p: len(a.devices) for p, a in starts.items()} == plan.widths
    assert set(starts["p0"].devices).isdisjoint(starts["p1"].devices)


def test_a_due_replan_runs_in_the_background_and_the_rollouts_wait_for_it() -> None:
    """Off the decision path (issue 11's decision p99): a decision that finds a replan due
    starts no rollout and leaves the replan as background work; once it has run, the next
    decision starts the rollouts at the new plan's widths."""
    view = first_view(cfg(("gsm8k", "math"), model="qwen3-4b", batch=64, steps=4))
    pol = JigsawPolicy(fallback=False)
    pol.decide(view)  # the first plan is made in the decision
    assert pol.background() is None  # nothing left (and the driver's asking turns it on)
    before = dict(pol.planner.plan.widths)
    moved = long_gsm8k_short_math(view)
    assert not [a for a in pol.decide(moved).actions if isinstance(a, StartRollout)]
    assert pol.planner.plan.widths == before  # not replanned in the decision
    work = pol.background()
    assert work is not None and pol.background() is None
    work()
    after = pol.planner.plan.widths
    assert after != before and pol.planner.replans == 2
    starts = {a.pipeline: len(a.devices) for a in pol.decide(moved).actions
              if isinstance(a, StartRollout)}
    assert starts == after and pol.background() is None


def test_the_predicted_graph_is_the_state_one_changed_node_changes_the_order() -> None:
    """Issue 11 item 1: a step's prediction is its Sub-Stage Graph and every time the policy
    reads comes off it. Twins tie on urgency (config order); lengthening one decode node of
    the second one's predicted graph lengthens its predicted rollout and step by exactly that,
    and makes it the more urgent: it gets the train-state slot first."""
    view = first_view(cfg(("gsm8k", "gsm8k"), model="qwen3-4b", batch=64, steps=4))
    pol = JigsawPolicy(fallback=False)
    pol.decide(view)
    preds = pol.predictions
    assert [p.name for p in preds.by_urgency(view)] == ["p0", "p1"]
    before = preds.get("p1", 0)
    assert before is not None and before.gen_s > 0
    graph = SubStageGraph()
    graph.merge(before.graph)
    node = next(n for n in graph.nodes.values() if n.stage.startswith("decode"))
    graph.nodes[node.node_id] = replace(node, duration_s=node.duration_s + 100.0)
    after = preds.replace("p1", 0, graph)
    assert after.gen_s == pytest.approx(before.gen_s + 100.0)
    assert after.step_s == pytest.approx(before.step_s + 100.0)
    assert after.stages_s == before.stages_s
    assert [p.name for p in preds.by_urgency(view)] == ["p1", "p0"]


def test_prediction_error_is_tracked_per_pipeline() -> None:
    """Issue 11 item 1: each measured rollout is compared with what was predicted at the width
    it started on, once, and the policy reports the error per pipeline."""
    view = first_view(cfg(("gsm8k", "math"), model="qwen3-4b", batch=64, steps=4))
    pol = JigsawPolicy(fallback=False)
    starts = {a.pipeline: a for a in pol.decide(view).actions if isinstance(a, StartRollout)}
    planner = pol.planner
    g, m = view.pipelines
    expected = planner.timer.cached_near(view, g, len(starts["p0"].devices))
    assert expected is not None and expected > 0
    n = 64 * 4
    seen = StepObservation(0, (150,) * n, (300,) * n, {GEN_TIMING: expected / 1.4})
    later = replace(view, pipelines=(replace(g, history=(seen,)), m))
    planner.observe(later)
    planner.observe(later)  # each rollout counted once
    assert planner.errors == {"p0": [pytest.approx(0.4)]}
    err = pol.report()["prediction_error"]
    assert set(err) == {"p0"} and err["p0"]["rollouts"] == 1
    assert err["p0"]["mean"] == err["p0"]["mean_abs"] == pytest.approx(0.4)


# ---------------------------------------------------------------------------- train-state slot

def test_the_train_state_slot_goes_to_the_most_urgent_pipeline() -> None:
    """Both pipelines' rollouts are done and one train state fits at a time: the slot goes to
    the pipeline with the most work left (p1, six steps), not to the first in config order."""
    base = cfg(("gsm8k", "gsm8k"), devices=4, batch=16)
    c = base.model_copy(update={"pipelines": [base.pipelines[0].model_copy(update={"steps": 1}),
                                              base.pipelines[1].model_copy(update={"steps": 6})]})
    exp = resolve(c)
    cost = make_cost(exp)
    st = DriverState(exp)
    pol = JigsawPolicy(fallback=False)
    pol.decide(st.view(0.0, cost))
    for p in st.pipes.values():
        p.done[0] = {Stage.ROLLOUT, Stage.REWARD}
        p.touch()
    d = pol.decide(st.view(10.0, cost))
    onloads = [a.pipeline for a in d.actions
               if isinstance(a, StartStage) and a.stage == Stage.ONLOAD]
    assert onloads == ["p1"]


# ---------------------------------------------------------------------------- no losses

def test_memory_tight_pair_falls_back_to_the_best_predicted_verl_placement() -> None:
    """Two Qwen3-32B pipelines on 16 GPUs: nothing can share a device, the serial plan is
    predicted at least as good, and jigsaw runs it — the same decisions as verl-serial."""
    c = cfg(("gsm8k", "math"), devices=8, model="qwen3-32b", batch=16, rollout_tp=4,
            train_tp=4)
    c = c.model_copy(update={"cluster": c.cluster.model_copy(update={"num_nodes": 2})})
    view = first_view(c)
    pol = JigsawPolicy()
    ours = pol.decide(view)
    assert pol.choice is not None and pol.choice.runs == "verl-serial"
    assert pol.residency.tight
    assert ours == get_policy("verl-serial").decide(view)


def test_never_predicted_worse_than_the_best_verl_placement() -> None:
    """Whatever jigsaw runs, its predicted makespan is no worse than the best verl placement's
    (the prediction reads the view and the belief costs only)."""
    for tasks in (("gsm8k", "math"), ("gsm8k", "math", "aime-tool", "search-r1")):
        view = first_view(cfg(tasks, model="qwen3-4b", batch=64, steps=3))
        pol = JigsawPolicy()
        pol.decide(view)
        ch = pol.choice
        assert ch is not None and ch.verl_s is not None
        best = min(p.makespan_s for p in verl_plans(view))
        assert ch.verl_s == pytest.approx(best)
        ran = ch.jigsaw_s if ch.runs == "jigsaw" else ch.verl_s
        assert ran <= best + 1e-9


def test_fallback_off_always_runs_jigsaw() -> None:
    exp = resolve(cfg(("gsm8k",), devices=4, batch=16, steps=2))
    pol = get_policy("jigsaw", {"fallback": False})
    assert isinstance(pol, JigsawPolicy)
    run_once(exp, pol, 3)
    assert pol.choice is not None and pol.choice.runs == "jigsaw"
