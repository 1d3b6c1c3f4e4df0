"""jigsaw / greedy: decisions on hand-built views, and end-to-end behaviour in the simulator."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jigsawrl.config import validate_config
from jigsawrl.driver.state import DriverState
from jigsawrl.events import SampleFinished, Span, StepFinished
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import make_cost, run_once
from jigsawrl.scheduler import Decision, Migrate, SetResident, StartRollout, StartStage, get_policy
from jigsawrl.scheduler.base import NOT_REPORTED, PolicyBase, RunningTask, task_id
from jigsawrl.scheduler.jigsaw import JigsawParams, JigsawPolicy
from jigsawrl.scheduler.jigsaw.tail import pack
from jigsawrl.stages import MODEL_PASSES, Stage


def cfg(n: int = 2, devices: int = 4, steps: int = 2, batch: int = 16, task: str = "gsm8k",
        **extra):  # noqa: ANN003, ANN201
    pipes = [dict({"name": f"p{i}", "model": "qwen3-0.6b", "task": task, "batch_size": batch,
                   "group_size": 4, "max_response_tokens": 2048, "steps": steps}, **extra)
             for i in range(n)]
    return validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                        "accelerators_per_node": devices},
                            "pipelines": pipes, "seed": 3})


class Recorder(PolicyBase):
    """Wraps a policy and keeps every decision (to count migrations)."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner = inner
        self.name = inner.name
        self.wants_rank_progress = True
        self.decisions: list[Decision] = []

    def decide(self, view):  # noqa: ANN001, ANN201
        d = self.inner.decide(view)
        self.decisions.append(d)
        return d


def test_first_decision_starts_rollouts_on_fair_shares() -> None:
    exp = resolve(cfg())
    st = DriverState(exp)
    pol = JigsawPolicy(fallback=False)  # jigsaw's own plan (two like pipelines: the fair one)
    d = pol.decide(st.view(0.0, make_cost(exp)))
    starts = [a for a in d.actions if isinstance(a, StartRollout)]
    assert [a.pipeline for a in starts] == ["p0", "p1"]
    assert set(starts[0].devices).isdisjoint(starts[1].devices)  # one engine per device
    assert all(len(a.devices) == 2 and a.share == 1.0 for a in starts)
    assert not any(isinstance(a, SetResident) for a in d.actions)  # train states on the host


def _decide_on_a_four_rank_tail(counts: list[int]) -> Decision:
    """jigsaw's decision while p0's rollout runs on four ranks with ``counts`` unfinished
    requests (KV context 3,000 and 900 on ranks 1 and 3) and p1 waits for its old log-probs
    (so freed ranks have a taker)."""
    exp = resolve(cfg(devices=4))
    cost = make_cost(exp)
    st = DriverState(exp)
    pol = JigsawPolicy(depth=1, fallback=False)
    pol.decide(st.view(0.0, cost))  # placement
    ranks = tuple((d,) for d in range(4))
    ctx = [0, 3000, 0, 900]
    roll = RunningTask(task_id("p0", 0, Stage.ROLLOUT), "p0", 0, Stage.ROLLOUT, (0, 1, 2, 3),
                       1.0, 0.0, unfinished_per_rank=tuple(counts), rank_devices=ranks,
                       rank_shares=(1.0,) * 4, ctx_tokens_per_rank=tuple(ctx))
    st.pipes["p0"].running[roll.task_id] = roll
    st.pipes["p0"].unfinished[roll.task_id] = list(counts)
    st.pipes["p0"].ctx_tokens[roll.task_id] = ctx
    st.acquire(roll.task_id, (0, 1, 2, 3), 1.0, 1e9)
    st.pipes["p1"].done[0] = {Stage.ROLLOUT, Stage.REWARD}
    st.pipes["p0"].touch()
    st.pipes["p1"].touch()
    return pol.decide(st.view(100.0, cost))


def test_tail_is_packed_and_compute_waits_for_onload() -> None:
    d = _decide_on_a_four_rank_tail([0, 3, 0, 1])
    migrations = [a for a in d.actions if isinstance(a, Migrate)]
    assert migrations, d.actions
    moved = {r for m in migrations for r in m.src_ranks}
    assert 1 not in moved and {0, 2} <= moved  # the fullest rank keeps its KV; idle ones freed
    onload = [a for a in d.actions if isinstance(a, StartStage) and a.stage == Stage.ONLOAD]
    assert [a.pipeline for a in onload] == ["p1"]
    assert not any(isinstance(a, StartStage) and a.stage == Stage.OLD_LOGPROB for a in d.actions)


def test_a_rank_that_has_not_reported_is_not_released() -> None:
    """A rank whose first progress report has not come yet is not a drained rank: on Ray one
    rank's first slice returns before the other's, and counting the other as 0 moved all its
    requests onto the first (every two-rank rollout of the demo's search, before the fix)."""
    d = _decide_on_a_four_rank_tail([NOT_REPORTED, 3, NOT_REPORTED, 1])
    assert not [a for a in d.actions if isinstance(a, Migrate)], d.actions


def test_pack_respects_capacity() -> None:
    moves = pack([3, 1, 2], {0: 0, 1: 5, 2: 4, 3: 6}, 2, 8, "t", [0, 1, 2, 3])
    dst = {m.dst_rank: m.src_ranks for m in moves}
    assert set(dst) <= {3, 1} and sorted(r for s in dst.values() for r in s) == [0, 2]


@pytest.mark.parametrize("task", ["gsm8k", "aime-tool"])
def test_single_pipeline_matches_verl(task: str) -> None:
    exp = resolve(cfg(n=1, task=task, steps=3))
    ours = run_once(exp, get_policy("jigsaw"), 3)
    verl = run_once(exp, get_policy("verl-split"), 3)
    # alone, jigsaw is never slower than verl (issue 11: >= 0.98x its throughput); it has
    # nothing to share the pool with, so its plan is predicted no better and it runs verl's
    assert verl.makespan_s / ours.makespan_s >= 0.98, (ours.makespan_s, verl.makespan_s)


def _second_pass(policy: JigsawPolicy, exp, cost):  # noqa: ANN001, ANN202
    """Both pipelines' step 0 rolled out and rewarded; the decision after their train states'
    onloads (returns the model passes it starts, and its view)."""
    st = DriverState(exp)
    policy.decide(st.view(0.0, cost))  # placement (the rollout starts are not applied)
    for p in st.pipes.values():
        p.done[0] = {Stage.ROLLOUT, Stage.REWARD}
        p.touch()
    first = policy.decide(st.view(10.0, cost))
    onloads = sorted(a.pipeline for a in first.actions
                     if isinstance(a, StartStage) and a.stage == Stage.ONLOAD)
    assert onloads == ["p0", "p1"]  # two train states fit at once
    view = st.view(12.0, cost)  # the onloads are done
    passes = [(a.pipeline, a.stage) for a in policy.decide(view).actions
              if isinstance(a, StartStage) and a.stage in MODEL_PASSES]
    return passes, view


def test_lookahead_starts_the_short_pass_where_greedy_starts_the_urgent_long_one() -> None:
    """An 8B and a 0.6B pipeline both have their old log-probs ready, their train states on the
    devices: ``greedy`` (no look-ahead) starts the most urgent pipeline's pass — the 8B model's,
    long (under the anchored GPU costs a 4B pass is too short for the order to matter); the
    look-ahead starts the short one first (a look-ahead that did nothing would fail this).
    The 0.6B pipeline weighs 2: with equal weights the 8B's urgency (its share of the work
    left) outweighs its longer passes, and both policies rightly start it first."""
    base = cfg(n=2, devices=4)
    c = base.model_copy(update={"pipelines": [replace_spec(base.pipelines[0], model="qwen3-8b"),
                                              replace_spec(base.pipelines[1],
                                                           latency_weight=2.0)]})
    exp = resolve(c)
    cost = make_cost(exp)
    greedy = get_policy("greedy", {"max_train_states": 2, "fallback": False})
    ahead = get_policy("jigsaw", {"max_train_states": 2, "fallback": False})
    assert isinstance(greedy, JigsawPolicy) and isinstance(ahead, JigsawPolicy)
    greedy_passes, _ = _second_pass(greedy, exp, cost)
    ahead_passes, view = _second_pass(ahead, exp, cost)
    assert greedy_passes == [("p0", Stage.OLD_LOGPROB)]
    assert ahead_passes == [("p1", Stage.OLD_LOGPROB)]
    w = {p.name: ahead.predictions.urgency(view, p) for p in view.pipelines}
    t = {}
    for p in view.pipelines:
        pred = ahead.predictions.get(p.name, 0)
        assert pred is not None
        t[p.name] = sum(pred.stages_s.get(s, 0.0) for s in MODEL_PASSES)
    assert w["p0"] > w["p1"]  # greedy took the most urgent pipeline's pass
    assert t["p1"] < t["p0"]  # and the look-ahead the shorter one,
    assert w["p0"] * t["p1"] < w["p1"] * t["p0"]  # as Smith's rule orders them


def test_greedy_is_jigsaw_with_its_params_but_no_lookahead() -> None:
    """``greedy`` takes jigsaw's parameters (the ablation differs only in the look-ahead), at
    depth 0 whatever depth it is given, under its own name."""
    g = get_policy("greedy", {"max_colocated": 2, "tail_batch": 32, "depth": 3})
    assert isinstance(g, JigsawPolicy) and g.name == "greedy"
    assert g.params == JigsawParams(depth=0, max_colocated=2, tail_batch=32)
    assert get_policy("jigsaw", {"max_colocated": 2}).params.depth == JigsawParams().depth > 0


def test_migration_happens_and_conserves_samples() -> None:
    exp = resolve(cfg(n=2, devices=8, batch=32, task="math", steps=2))
    rec = Recorder(get_policy("jigsaw", {"fallback": False}))  # jigsaw's own plan migrates
    res = run_once(exp, rec, 3)
    migs = [a for d in rec.decisions for a in d.actions if isinstance(a, Migrate)]
    assert migs
    ids = [e.sample_id for e in res.events if isinstance(e, SampleFinished)]
    assert len(ids) == len(set(ids)) == 2 * 2 * 32 * 4
    assert len([e for e in res.events if isinstance(e, StepFinished)]) == 4


def test_ablations_run() -> None:
    exp = resolve(cfg(n=2, devices=4, steps=1))
    for params in ({"migration": False}, {"dynamic_shares": False}, {"depth": 3},
                   {"max_colocated": 2}, {"plan_widths": False}):
        res = run_once(exp, get_policy("jigsaw", {**params, "fallback": False}), 3)
        assert len([e for e in res.events if isinstance(e, StepFinished)]) == 2


def test_latency_weight_favours_a_pipeline() -> None:
    base = cfg(n=2, devices=4, steps=3, batch=16, task="math")
    heavy = base.model_copy(update={"pipelines": [
        replace_spec(base.pipelines[0], latency_weight=8.0), base.pipelines[1]]})
    res = run_once(resolve(heavy), get_policy("jigsaw", {"fallback": False}), 3)
    lat = {}
    for e in res.events:
        if isinstance(e, StepFinished):
            lat.setdefault(e.pipeline, []).append(e.end_s - e.start_s)
    assert sum(lat["p0"]) <= sum(lat["p1"]) * 1.05


def replace_spec(spec, **kw):  # noqa: ANN001, ANN003, ANN201
    return spec.model_copy(update=kw)


def test_bad_params_are_config_errors() -> None:
    from jigsawrl.errors import ConfigError

    with pytest.raises(ConfigError):
        get_policy("jigsaw", {"depth": -1})
    with pytest.raises(ConfigError):
        get_policy("jigsaw", {"bogus": 1})
    # a parameter of the wrong type is named (a string was truthy: "maybe" turned a switch on)
    for bad in ({"spread": "maybe"}, {"tail_tp": 1}, {"tail_requests": 1.5},
                {"depth": True}, {"min_rollout_fraction": float("nan")}):
        with pytest.raises(ConfigError, match=f"'{next(iter(bad))}' must be"):
            get_policy("jigsaw", bad)
    assert get_policy("greedy", {"min_rollout_fraction": 1}).params.min_rollout_fraction == 1
    assert replace  # keep the import used for readers extending this file
    assert Span


def test_eight_heterogeneous_pipelines_mixed_sync_async() -> None:
    tasks = ["gsm8k", "math", "aime-tool", "search-r1"]
    pipes = [{"name": f"p{i}", "model": "qwen3-0.6b" if i % 2 else "qwen3-4b",
              "task": tasks[i % 4], "batch_size": 4, "group_size": 2,
              "max_response_tokens": 1024, "steps": 2,
              **({"mode": "async", "max_staleness": 1} if i % 3 == 0 else {})}
             for i in range(8)]
    c = validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                     "accelerators_per_node": 8}, "pipelines": pipes, "seed": 5})
    res = run_once(resolve(c), get_policy("jigsaw"), 5)
    done = {e.pipeline for e in res.events if isinstance(e, StepFinished) and e.step == 1}
    assert done == {f"p{i}" for i in range(8)}


def test_several_train_states_run_compute_stages_side_by_side() -> None:
    """``max_train_states > 1``: compute stages of different pipelines run at once on disjoint
    devices (the driver checks memory and shares on every action); 1 keeps them one at a time."""
    from jigsawrl.config import load_config
    from jigsawrl.events import Span
    from jigsawrl.experiments.simulated import simulate

    def overlapping(k: int) -> bool:
        cfg = load_config("configs/two-gsm8k.yaml", [
            "scheduler.name=jigsaw", f"scheduler.params.max_train_states={k}",
            "scheduler.params.fallback=false",
            "pipelines.0.steps=3", "pipelines.1.steps=3"])
        run = simulate(cfg, solo=False)
        spans = [e for e in run.events if isinstance(e, Span)
                 and e.stage in MODEL_PASSES]
        return any(a.pipeline != b.pipeline and a.start_s < b.end_s and b.start_s < a.end_s
                   and not set(a.devices) & set(b.devices) for a in spans for b in spans)

    assert not overlapping(1)
    assert overlapping(2)


def test_params_of_another_scheduler_are_a_clear_config_error() -> None:
    from jigsawrl.errors import ConfigError

    with pytest.raises(ConfigError, match="max_train_states") as exc:
        get_policy("verl-serial", {"max_train_states": 3})
    assert exc.value.where == "scheduler.params" and "scheduler.name" in (exc.value.fix or "")


def _rollout_beside_passes(serial_slice_s: float) -> list[tuple[str, tuple[int, ...]]]:
    """Three pipelines on two devices: p0's update on device 0 and p1's (shorter) old log-probs
    on device 1 both just started; where p2's rollout starts, under a belief whose devices run
    one call at a time (``serial_slice_s`` > 0, the Ray CPU workers) or at shares (0)."""
    from jigsawrl.costmodel.model import CostModel

    exp = resolve(cfg(n=3, devices=2))
    cost = CostModel(exp.accelerator,
                     params=replace(make_cost(exp).params, serial_slice_s=serial_slice_s))
    st = DriverState(exp)
    pol = JigsawPolicy(fallback=False, max_train_states=3)
    pol.decide(st.view(0.0, cost))  # placement
    for name, stage, dev in (("p0", Stage.ACTOR_UPDATE, 0), ("p1", Stage.OLD_LOGPROB, 1)):
        p = st.pipes[name]
        p.done[0] = {Stage.ROLLOUT, Stage.REWARD}
        if stage == Stage.ACTOR_UPDATE:
            p.done[0] |= {Stage.OLD_LOGPROB, Stage.REF_LOGPROB}
        t = RunningTask(task_id(name, 0, stage), name, 0, stage, (dev,), 1.0, 10.0)
        p.running[t.task_id] = t
        st.acquire(t.task_id, (dev,), 1.0, 1e9)
        p.touch()
    d = pol.decide(st.view(10.0, cost))
    return [(a.pipeline, a.devices) for a in d.actions if isinstance(a, StartRollout)]


def test_rollout_on_serial_devices_goes_where_the_pass_ends_first() -> None:
    # at shares the two devices are alike (the first is taken); one call at a time, the rank
    # would decode only after the pass beside it, so it goes beside the shorter one
    assert _rollout_beside_passes(0.0) == [("p2", (0,))]
    assert _rollout_beside_passes(0.2) == [("p2", (1,))]


def test_lookahead_offers_no_wait_where_a_device_runs_one_call_at_a_time() -> None:
    """Beside a running decode, waiting is an option of the look-ahead at shares (the GPU
    presets), not where a device takes turns (``serial_slice_s`` > 0: the fluid forecast shares
    a device the real one time-slices; measured: its deferrals cost 6% on the real pool)."""
    from types import SimpleNamespace

    from jigsawrl.scheduler.jigsaw.lookahead import LookAhead

    board = SimpleNamespace(any_memory=lambda: True)
    cand = (SimpleNamespace(name="p0"), 0, Stage.OLD_LOGPROB, (0,))
    for slice_s, options in ((0.0, 1), (0.2, 0)):
        la = LookAhead(0, predictions=None)  # type: ignore[arg-type]
        view = SimpleNamespace(cost=SimpleNamespace(params=SimpleNamespace(
            serial_slice_s=slice_s)))
        assert la.choose(view, board, [cand]) is cand  # type: ignore[arg-type]
        assert la.stats.with_choice == options


def test_a_rollout_on_current_weights_goes_before_another_pipelines_stale_one() -> None:
    """Async: a pipeline's next-step rollout (its weights a version behind) takes devices only
    after the other pipelines' current rollouts have theirs; urgency first had filled the pool
    with the urgent pipeline's steps 0 and 1 while the other waited for a whole rollout
    (docs/BENCHMARKS.md, "Async: current rollouts before stale ones")."""
    exp = resolve(cfg(mode="async", max_staleness=1))
    st = DriverState(exp)
    pol = JigsawPolicy(fallback=False, tp_search=False)
    d = pol.decide(st.view(0.0, make_cost(exp)))
    starts = [(a.pipeline, a.step) for a in d.actions if isinstance(a, StartRollout)]
    assert starts[:2] in ([("p0", 0), ("p1", 0)], [("p1", 0), ("p0", 0)])


def test_a_short_pass_runs_before_a_long_one_on_its_device_when_asked() -> None:
    """``short_first``: a ready pass predicted at most that fraction of the chosen pass's time,
    wanting one of its devices, runs first (the demo's 0.06 s old log-prob had waited 1.2 s
    behind another pipeline's update); a pass on other devices or not short enough does not;
    0 (the default) leaves the look-ahead's choice alone."""
    from types import SimpleNamespace

    from jigsawrl.errors import ConfigError
    from jigsawrl.scheduler.jigsaw.lookahead import LookAhead
    from jigsawrl.scheduler.jigsaw.params import JigsawParams

    seconds = {"long": 1.2, "short": 0.06, "other": 0.05, "mid": 0.3}
    preds = SimpleNamespace(ensure=lambda view, pv, step: SimpleNamespace(
        stages_s={Stage.OLD_LOGPROB: seconds[pv.name]}))

    def cand(name: str, devices: tuple[int, ...]) -> tuple:
        return (SimpleNamespace(name=name), 0, Stage.OLD_LOGPROB, devices)

    long, short, other, mid = (cand("long", (0,)), cand("short", (0, 1)), cand("other", (1,)),
                               cand("mid", (0,)))
    board = SimpleNamespace(any_memory=lambda: False)
    view = SimpleNamespace(cost=SimpleNamespace(params=SimpleNamespace(serial_slice_s=0.2)))
    for fraction, cands, want in ((0.1, [long, mid, short, other], short),
                                  (0.1, [long, mid, other], long),  # mid 25%, other elsewhere
                                  (0.3, [long, mid, other], mid),
                                  (0.0, [long, mid, short], long)):
        la = LookAhead(0, preds, fraction)  # type: ignore[arg-type]
        assert la.choose(view, board, cands) is want, (fraction, want[0].name)  # type: ignore[arg-type]
    assert JigsawParams().short_first == 0.0
    for bad in (-0.1, 1.0):
        with pytest.raises(ConfigError, match="short_first"):
            JigsawParams(short_first=bad)
    assert JigsawPolicy(short_first=0.1).lookahead.short_first == 0.1
