"""experiments.simulated: the solo reference runs on the run's own requests, every summary carries
the floor and the bound, and step latencies count the wait for devices."""

from __future__ import annotations

import pytest

from jigsawrl.config import validate_config
from jigsawrl.events import SampleFinished
from jigsawrl.experiments.core import make_policy
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import run_once, simulate, solo_experiment, solo_latencies


def cfg(n: int = 3, devices: int = 4, steps: int = 2):  # noqa: ANN201
    tasks = ["gsm8k", "math", "aime-tool"]
    return validate_config({
        "cluster": {"accelerator": "h100-80gb", "num_nodes": 1, "accelerators_per_node": devices},
        "pipelines": [{"name": f"p{i}", "model": "qwen3-0.6b", "task": tasks[i % 3],
                       "batch_size": 4, "group_size": 2, "max_response_tokens": 1024,
                       "steps": steps} for i in range(n)],
        "seed": 5})


def tokens_by_sample(events: list, pipeline: str) -> dict[str, tuple[int, int, int]]:
    return {(e.sample_id): (e.step, e.prompt_tokens, e.response_tokens) for e in events
            if isinstance(e, SampleFinished) and e.pipeline == pipeline}


@pytest.mark.parametrize("index", [0, 1, 2])
def test_solo_run_samples_the_requests_of_the_run(index: int) -> None:
    """The truth sampler seeds by the pipeline's index; the alone config keeps it, so the solo
    run's samples are the multi-pipeline run's, token for token, step by step."""
    c = cfg()
    name = c.pipelines[index].name
    multi = run_once(resolve(c), make_policy(c, "verl-split"), c.seed)
    alone = solo_experiment(c, index)
    assert [p.spec.name for p in alone.pipelines] == [name]
    assert alone.pipelines[0].spec.num_devices is None and alone.pipelines[0].spec.start_s == 0
    solo = run_once(alone, make_policy(alone.config, "verl-split"), c.seed)
    ours, theirs = tokens_by_sample(multi.events, name), tokens_by_sample(solo.events, name)
    assert ours and ours == theirs


def test_single_pipeline_is_its_own_solo_reference() -> None:
    """Alone under verl-split, a run *is* its solo reference: the ratio is exactly 1 (same
    requests, same definition of a step's latency)."""
    c = cfg(n=1)
    run = simulate(c, policy="verl-split")
    p = run.summary["pipelines"][0]
    assert p["latency_vs_solo"] == pytest.approx(1.0)
    assert solo_latencies(c, c.seed)["p0"] == pytest.approx(p["mean_step_latency_s"])


def test_summary_carries_floor_bound_and_arrivals() -> None:
    s = simulate(cfg(), policy="jigsaw", solo=False).summary
    assert s["schema_version"] == 2
    assert 0 < s["floor_s"] <= s["bound_s"] <= s["makespan_s"] * 1.1  # truth noise: a little
    assert s["efficiency"] == pytest.approx(s["bound_s"] / s["makespan_s"])
    assert s["efficiency_floor"] == pytest.approx(s["floor_s"] / s["makespan_s"])
    assert s["bound_terms"]["floor"] == s["floor_s"]
    assert max(s["bound_terms"].values()) == s["bound_s"]
    assert s["run_info"]["arrival_s"] == {"p0": 0.0, "p1": 0.0, "p2": 0.0}
    assert s["run_info"]["lower_bound_s"] == s["floor_s"]


def test_waiting_for_devices_counts_in_step_latency() -> None:
    """verl-serial runs the jobs one after another: the second job's first step waits for the
    whole first job, and that wait is part of its latency (from its arrival at 0)."""
    run = simulate(cfg(n=2, steps=1), policy="verl-serial", solo=False)
    steps = {e.pipeline: e for e in run.events if type(e).__name__ == "StepFinished"}
    first, second = sorted(steps.values(), key=lambda e: e.end_s)
    lat = {p["name"]: p["mean_step_latency_s"] for p in run.summary["pipelines"]}
    assert second.start_s >= first.end_s - 1e-9  # launched after the first job
    assert lat[second.pipeline] == pytest.approx(second.end_s)  # from its arrival at t = 0
    assert lat[second.pipeline] > second.end_s - second.start_s


def test_jigsaw_reports_its_plan_and_look_ahead_in_the_summary() -> None:
    """The summary says what jigsaw ran (its plan or the verl placement it fell back to), the
    two predictions it chose between, and how often the look-ahead had a choice and used it."""
    from jigsawrl.config import load_config

    cfg = load_config(data={
        "cluster": {"accelerator": "h100-80gb", "num_nodes": 1, "accelerators_per_node": 4},
        "pipelines": [{"name": f"p{i}", "model": "qwen3-0.6b", "task": t, "batch_size": 8,
                       "group_size": 2, "max_response_tokens": 1024, "steps": 3}
                      for i, t in enumerate(("gsm8k", "math", "aime-tool"))],
        "scheduler": {"name": "jigsaw"}})
    rep = simulate(cfg, solo=False).summary["policy_report"]
    plan, la = rep["plan"], rep["lookahead"]
    assert plan["runs"] in ("jigsaw", plan["verl"])
    assert plan["verl"].startswith("verl-") and plan["verl_s"] > 0
    if plan["runs"] == "jigsaw":
        assert la["decisions"] > 0
    assert la["deferred"] <= la["differed"] <= la["with_choice"] <= la["decisions"]
    verl = simulate(cfg, policy="verl-split", solo=False).summary
    assert "policy_report" not in verl  # a policy with nothing to report adds nothing


def test_solo_latency_is_the_pipelines_fastest_rollout_tp_alone() -> None:
    """The solo reference runs each pipeline alone at the fastest of the baselines' rollout TPs:
    never slower than alone at the config's TP, and faster where a wider TP shortens the long
    tail (here: the config's TP 1 on 8 devices). Before, jigsaw's searched TP 8 made shared
    steps look faster than alone (docs/BENCHMARKS.md, "Solo at its best TP")."""
    from jigsawrl.config import load_config
    from jigsawrl.events import StepFinished
    from jigsawrl.metrics.summary import step_latencies

    cfg = load_config("configs/two-gsm8k.yaml", ["pipelines.0.steps=2", "pipelines.1.steps=2"])
    best = solo_latencies(cfg, 0)
    for i, p in enumerate(cfg.pipelines):
        exp = solo_experiment(cfg, i)
        res = run_once(exp, make_policy(exp.config, "verl-split", {}), 0)
        lat = list(step_latencies([e for e in res.events if isinstance(e, StepFinished)],
                                  {p.name: 0.0}).values())
        at_config = sum(lat) / len(lat)
        assert best[p.name] < at_config * 0.95, (p.name, p.rollout_tp, best[p.name], at_config)
