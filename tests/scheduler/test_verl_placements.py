"""verl's placements as a careful user picks them: a split sized to each job's predicted work
(``verl-sized``) and a job queue of k at a time (``verl-queue``), beside split and serial."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from typer.testing import CliRunner

from jigsawrl.cli.main import app
from jigsawrl.config import ExperimentConfig, validate_config
from jigsawrl.driver.state import DriverState
from jigsawrl.errors import ConfigError
from jigsawrl.events import Event, SampleFinished, Span, StepFinished
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import make_cost, run_once, simulate
from jigsawrl.graph.predict import StepObservation
from jigsawrl.scheduler import get_policy, list_policies
from jigsawrl.scheduler.base import SetResident, StartRollout, View
from jigsawrl.scheduler.rollout_tp import TP_FACTORS
from jigsawrl.scheduler.verl import VerlPolicy
from jigsawrl.scheduler.verl_placements import (
    MAX_QUEUE_K,
    JobTimer,
    fits,
    longest_first,
    queue_slices,
    queue_widths,
    sized_split,
    slice_sizes,
    tp_group,
)
from jigsawrl.stages import Stage
from jigsawrl.workload.experiment import DEFAULT_GPU_MEMORY_UTILIZATION as GMU


def make_cfg(pipes: Sequence[dict], devices: int = 8, nodes: int = 1,
             seed: int = 0) -> ExperimentConfig:
    base = {"batch_size": 8, "group_size": 2, "max_response_tokens": 2048, "steps": 2}
    return validate_config({
        "cluster": {"accelerator": "h100-80gb", "num_nodes": nodes,
                    "accelerators_per_node": devices},
        "pipelines": [{"name": f"p{i}", **base, **p} for i, p in enumerate(pipes)],
        "seed": seed})


def first_view(cfg: ExperimentConfig) -> View:
    exp = resolve(cfg)
    return DriverState(exp).view(0.0, make_cost(exp))


def device_spans(events: Sequence[Event]) -> list[Span]:
    return [e for e in events if isinstance(e, Span) and e.devices]


def devices_by_pipeline(events: Sequence[Event]) -> dict[str, frozenset[int]]:
    out: dict[str, set[int]] = {}
    for s in device_spans(events):
        out.setdefault(s.pipeline, set()).update(s.devices)
    return {k: frozenset(v) for k, v in out.items()}


def check_complete(cfg: ExperimentConfig, events: Sequence[Event]) -> None:
    """Every pipeline finishes all its steps; every sample exactly once."""
    steps = [e for e in events if isinstance(e, StepFinished)]
    assert len(steps) == sum(p.steps for p in cfg.pipelines)
    ids = [e.sample_id for e in events if isinstance(e, SampleFinished)]
    assert len(ids) == len(set(ids)) == sum(p.steps * p.batch_size * p.group_size
                                            for p in cfg.pipelines)


GSM8K_MATH = [{"model": "qwen3-4b", "task": "gsm8k", "batch_size": 64, "group_size": 4,
               "max_response_tokens": 8192, "steps": 10},
              {"model": "qwen3-4b", "task": "math", "batch_size": 64, "group_size": 4,
               "max_response_tokens": 8192, "steps": 10}]


# ---------------------------------------------------------------------------- sized split

def test_sized_split_gives_the_longer_job_more_whole_feasible_groups() -> None:
    view = first_view(make_cfg(GSM8K_MATH))
    devs = sized_split(view, JobTimer(view, GMU))
    sizes = {k: len(v) for k, v in devs.items()}
    assert sizes["p1"] > sizes["p0"]  # MATH's responses are longer: more predicted work
    assert sum(sizes.values()) <= 8
    assert len(set().union(*devs.values())) == sum(sizes.values())  # disjoint
    for pv in view.pipelines:
        assert sizes[pv.name] % tp_group(pv) == 0 and fits(view, pv, sizes[pv.name])


def test_sized_split_minimises_the_predicted_makespan_over_every_split() -> None:
    view = first_view(make_cfg(GSM8K_MATH))
    timer = JobTimer(view, GMU)
    a, b = view.pipelines
    devs = sized_split(view, timer)
    got = max(timer.job_s(a, len(devs["p0"])), timer.job_s(b, len(devs["p1"])))
    best = min(max(timer.job_s(a, x), timer.job_s(b, y))
               for x in range(1, 8) for y in range(1, 9 - x)
               if fits(view, a, x) and fits(view, b, y))
    assert got == pytest.approx(best)


def test_sized_split_follows_the_work_and_whole_tp_groups() -> None:
    light = dict(GSM8K_MATH[0], steps=2)
    heavy = dict(GSM8K_MATH[0], steps=20, rollout_tp=2)
    view = first_view(make_cfg([light, heavy]))
    sizes = {k: len(v) for k, v in sized_split(view, JobTimer(view, GMU)).items()}
    assert sizes["p1"] > sizes["p0"] and sizes["p1"] % 2 == 0
    more = first_view(make_cfg([dict(light, steps=40), heavy]))
    grown = {k: len(v) for k, v in sized_split(more, JobTimer(more, GMU)).items()}
    assert grown["p0"] >= sizes["p0"]  # more work never a smaller slice


def test_sized_slices_stay_inside_a_node_or_take_whole_nodes() -> None:
    pipes = [dict(GSM8K_MATH[0], steps=1), dict(GSM8K_MATH[1], steps=6),
             dict(GSM8K_MATH[0], task="aime-tool", steps=3)]
    view = first_view(make_cfg(pipes, devices=4, nodes=4))
    devs = sized_split(view, JobTimer(view, GMU))
    for d in devs.values():
        nodes = {i // 4 for i in d}
        assert len(d) == 4 * len(nodes) if len(nodes) > 1 else len(d) <= 4
        assert len(d) in slice_sizes(view, view.pipelines[0])


def test_sized_split_infeasible_is_a_config_error() -> None:
    view = first_view(make_cfg([{"model": "qwen3-4b", "task": "gsm8k"}] * 5))
    with pytest.raises(ConfigError, match="verl-sized needs at least 10 devices"):
        sized_split(view, JobTimer(view, GMU))


def with_history(view: View, response_tokens: int) -> View:
    """The view with a made-up observed step of very long (or short) responses."""
    obs = StepObservation(0, (100,) * 16, (response_tokens,) * 16, {Stage.ROLLOUT: 500.0})
    pipes = tuple(dataclasses.replace(p, history=(obs,)) for p in view.pipelines)
    return dataclasses.replace(view, pipelines=pipes)


@pytest.mark.parametrize("placement", ["sized", "queue"])
def test_placement_never_reads_sampled_lengths(placement: str) -> None:
    """Changing the sampled lengths (the seed) or the observed history leaves the placement
    as it was: it is fixed from the presets' priors before the first step."""
    pipes = [dict(GSM8K_MATH[0], steps=2, batch_size=16), dict(GSM8K_MATH[1], steps=2,
                                                               batch_size=16),
             {"model": "qwen3-0.6b", "task": "search-r1", "batch_size": 16}]
    k = 2 if placement == "queue" else None
    placements, first = [], []
    for seed in (0, 5):
        cfg = make_cfg(pipes, seed=seed)
        events = run_once(resolve(cfg), VerlPolicy(placement, k=k), seed).events
        placements.append(devices_by_pipeline(events))
        lengths = sorted(e.response_tokens for e in events if isinstance(e, SampleFinished))
        first.append(lengths)
        view = first_view(cfg)
        decisions = {VerlPolicy(placement, k=k).decide(v).actions
                     for v in (view, with_history(view, 8000), with_history(view, 10))}
        assert len(decisions) == 1
    assert first[0] != first[1]  # the truth did change
    assert placements[0] == placements[1]


# ---------------------------------------------------------------------------- queue

QUEUE = [{"model": "qwen3-0.6b", "task": "gsm8k", "steps": 1},
         {"model": "qwen3-0.6b", "task": "math", "steps": 3},
         {"model": "qwen3-0.6b", "task": "gsm8k", "steps": 2},
         {"model": "qwen3-0.6b", "task": "search-r1", "steps": 1},
         {"model": "qwen3-0.6b", "task": "math", "steps": 1}]


def test_queue_runs_k_jobs_and_the_next_takes_the_freed_slice() -> None:
    cfg = make_cfg(QUEUE, devices=4)
    view = first_view(cfg)
    slices = [frozenset(s) for s in queue_slices(view, 2)]
    assert slices == [frozenset({0, 1}), frozenset({2, 3})]
    order = longest_first(view, JobTimer(view, GMU), 2)
    first = VerlPolicy("queue", k=2).decide(view).actions
    started = [a.pipeline for a in first if isinstance(a, StartRollout)]
    assert started == order[:2]  # k jobs, longest predicted first
    assert {frozenset(a.devices) for a in first if isinstance(a, SetResident)} == set(slices)

    events = run_once(resolve(cfg), VerlPolicy("queue", k=2), cfg.seed).events
    check_complete(cfg, events)
    spans = device_spans(events)
    begin = {p: min(s.start_s for s in spans if s.pipeline == p) for p in order}
    end = {p: max(s.end_s for s in spans if s.pipeline == p) for p in order}
    where = devices_by_pipeline(events)
    assert all(where[p] in slices for p in order)  # each job on one whole slice
    for nxt in order[2:]:  # starts when the job before it on its slice ends, not before
        before = [p for p in order if where[p] == where[nxt] and begin[p] < begin[nxt]]
        assert before
        last = max(before, key=lambda p: end[p])
        assert begin[nxt] == pytest.approx(end[last], abs=1e-6)
        running = [p for p in order if begin[p] < begin[nxt] < end[p] - 1e-9]
        assert len(running) == 1  # the other slice's job; never more than k at a time


def test_queue_widths_skip_serial_split_and_slices_too_small() -> None:
    mixed = [{"model": "qwen3-4b", "task": "gsm8k"}] * 3 + [
        {"model": "qwen3-0.6b", "task": "math"}] * 5
    view = first_view(make_cfg(mixed))
    assert queue_widths(view) == [2, 3, 4]  # 5..7 leave one GPU: too small for a 4B job
    for k in (1, 8, 9):
        with pytest.raises(ConfigError, match="verl-serial|verl-split"):
            queue_slices(view, k)
    with pytest.raises(ConfigError, match="cannot hold"):
        queue_slices(view, 5)
    names = [v.name for v in get_policy("verl").variants_for(view)]  # type: ignore[attr-defined]
    assert names == ["verl-split", "verl-serial", "verl-sized", "verl-queue-2", "verl-queue-3",
                     "verl-queue-4"]


def test_verl_on_eight_small_jobs_picks_a_queue() -> None:
    mixed = [{"model": "qwen3-4b", "task": "math"}] * 3 + [
        {"model": "qwen3-0.6b", "task": t} for t in ("gsm8k", "math", "search-r1", "aime-tool",
                                                     "gsm8k")]
    run = simulate(make_cfg(mixed), policy="verl", solo=False)
    assert run.summary["variant"].startswith("verl-queue-")
    assert run.variant == run.summary["variant"]


# ---------------------------------------------------------------------------- registry

def test_verl_variants_are_every_placement_under_its_registered_name() -> None:
    names = [v.name for v in get_policy("verl").variants()]
    sync = ["verl-split", "verl-serial", "verl-sized",
            *(f"verl-queue-{k}" for k in range(2, MAX_QUEUE_K + 1))]
    def scaled(plain: list[str]) -> list[str]:  # then each again at every scaled rollout TP
        return plain + [f"{n}@tp x{f:g}" for f in TP_FACTORS[1:] for n in plain]
    assert names[:len(TP_FACTORS) * len(sync)] == scaled(sync)
    # then verl's async recipes, each over its rollout/train splits (verl_async.py)
    assert names[len(TP_FACTORS) * len(sync):] == [
        n for r in ("verl-one-step-off", "verl-fully-async")
        for n in scaled([f"{r}-split#{k}" for k in range(6)])]
    assert [v.name for v in get_policy("verl-queue").variants()] == sync[3:]
    assert get_policy("verl-queue", {"k": 3}).name == "verl-queue-3"
    assert get_policy("verl-sized").name == "verl-sized"
    with pytest.raises(ConfigError):
        get_policy("verl-sized", {"k": 2})


def test_list_schedulers_shows_the_new_placements() -> None:
    assert {"verl-sized", "verl-queue"} <= set(list_policies())
    res = CliRunner().invoke(app, ["list", "schedulers"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "verl-sized" in res.output and "verl-queue" in res.output


def test_a_task_without_a_preset_is_assumed_its_measured_prompt_length() -> None:
    """A real task has no preset: its prior's prompt is the config's ``prompt_tokens`` (what a
    real run measures from the task's prompts), else the default; the response stays a quarter
    of the cap."""
    from types import SimpleNamespace

    from jigsawrl.config import PipelineSpec
    from jigsawrl.scheduler.verl_placements import DEFAULT_PROMPT_TOKENS, prior_requests

    def prior(**extra: object) -> list:
        spec = PipelineSpec(name="count", model="qwen2-1m", task="countdown", batch_size=2,
                            group_size=2, max_response_tokens=32, **extra)
        return prior_requests(SimpleNamespace(name="count", spec=spec))  # type: ignore[arg-type]

    assert {r.prompt_tokens for r in prior()} == {DEFAULT_PROMPT_TOKENS}
    measured = prior(prompt_tokens=13)
    assert len(measured) == 4 and {r.prompt_tokens for r in measured} == {13}
    assert {r.generated_tokens for r in measured} == {8}
    with pytest.raises(ValueError):
        PipelineSpec(name="count", model="qwen2-1m", prompt_tokens=0)


def test_a_task_without_a_preset_waits_for_its_tool_calls() -> None:
    """A real task's prior has ``prior_tool_calls`` tool calls (rounded), each waiting the
    rollout's ``tool_latency_s`` and returning ``prior_tool_result_tokens``, the quarter of the
    cap split over the turns; without calls it stays single-turn. jigsaw's history turns read
    the same (an observed total less its tool results)."""
    from types import SimpleNamespace

    from jigsawrl.config import PipelineSpec
    from jigsawrl.scheduler.jigsaw.widths import as_turns
    from jigsawrl.scheduler.verl_placements import prior_requests
    from jigsawrl.workload.requests import TurnTruth

    def spec(**extra: object) -> PipelineSpec:
        return PipelineSpec(name="calc", model="qwen2-1m", task="calculator", batch_size=1,
                            group_size=2, max_response_tokens=64,
                            rollout={"tool_latency_s": 0.2}, **extra)

    def turns(**extra: object) -> tuple[TurnTruth, ...]:
        (first, *rest) = prior_requests(SimpleNamespace(name="calc", spec=spec(**extra)))
        assert all(r.turns == first.turns for r in rest)
        return first.turns

    assert turns() == (TurnTruth(16),)
    assert turns(prior_tool_calls=1.0, prior_tool_result_tokens=10) == (
        TurnTruth(8, 0.2, 10), TurnTruth(8))
    assert turns(prior_tool_calls=1.6) == (TurnTruth(5, 0.2, 0),) * 2 + (TurnTruth(5),)
    pv = SimpleNamespace(spec=spec(prior_tool_calls=1.0, prior_tool_result_tokens=10))
    assert as_turns(pv, 40) == (TurnTruth(15, 0.2, 10), TurnTruth(15))  # type: ignore[arg-type]
    assert as_turns(SimpleNamespace(spec=spec()), 40) == (TurnTruth(40),)  # type: ignore[arg-type]
