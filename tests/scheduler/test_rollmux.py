"""The ``rollmux`` baseline: whole phases round-robin on a rollout pool and a training pool.

The run checks here (:func:`check_run`, :func:`tiny_view`) are shared with ``test_muxserve.py``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import pytest

from jigsawrl.config import ExperimentConfig, validate_config
from jigsawrl.errors import ConfigError
from jigsawrl.events import Event, SampleFinished, Span, StepFinished
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import make_cost, run_once, simulate
from jigsawrl.scheduler.base import (
    DeviceView,
    PipelineView,
    RunningTask,
    SetResident,
    StartRollout,
    StartStage,
    View,
    task_id,
)
from jigsawrl.scheduler.rollmux import ROLLOUT_FRACTIONS, RollMuxPolicy, split_pools
from jigsawrl.scheduler.rollout_tp import TP_FACTORS
from jigsawrl.stages import HOST_STAGES, MODEL_PASSES, Stage
from jigsawrl.stages import ROLLOUT_BANDS as ROLLOUT_STAGES

STEPS = 2
GPU_STAGES = MODEL_PASSES | (HOST_STAGES - {Stage.REWARD})  # the reward runs on the CPU


def make_cfg(models: Sequence[str], devices: int, task: str = "gsm8k", batch: int = 6,
             **extra: object) -> ExperimentConfig:
    pipes = [{"name": f"p{i}", "model": m, "task": task, "batch_size": batch, "group_size": 2,
              "max_response_tokens": 1024, "steps": STEPS, **extra}
             for i, m in enumerate(models)]
    return validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                        "accelerators_per_node": devices},
                            "pipelines": pipes, "seed": 1})


def run(cfg: ExperimentConfig, policy: object) -> list[Event]:
    return run_once(resolve(cfg), policy, cfg.seed).events


def spans_of(events: list[Event]) -> list[Span]:
    return [e for e in events if isinstance(e, Span)]


def overlaps(a: Span, b: Span) -> bool:
    return a.start_s < b.end_s - 1e-9 and b.start_s < a.end_s - 1e-9


def check_run(cfg: ExperimentConfig, events: list[Event]) -> None:
    """Every step finishes, every sample exactly once, no device over its compute."""
    steps = Counter(e.pipeline for e in events if isinstance(e, StepFinished))
    assert steps == {p.name: p.steps for p in cfg.pipelines}
    ids = [e.sample_id for e in events if isinstance(e, SampleFinished)]
    assert len(ids) == len(set(ids))
    assert len(ids) == sum(p.batch_size * p.group_size * p.steps for p in cfg.pipelines)
    per_dev: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for s in spans_of(events):
        for d in s.devices:
            per_dev[d] += [(s.start_s, s.compute_share), (s.end_s, -s.compute_share)]
    for d, evs in per_dev.items():
        level = 0.0
        for _, delta in sorted(evs):  # at equal times the end (negative) comes first
            level += delta
            assert level <= 1.0 + 1e-6, f"device {d} over its compute"


def tiny_view(cfg: ExperimentConfig, done: Mapping[str, Mapping[int, set[str]]],
              running: Mapping[str, Sequence[RunningTask]] = MappingProxyType({})) -> View:
    """A hand-built view (no executor): ``done`` and ``running`` per pipeline, empty devices."""
    exp = resolve(cfg)
    pipes = tuple(
        PipelineView(p.spec.name, p.index, p.spec, p.model,
                     MappingProxyType({k: frozenset(v)
                                       for k, v in done.get(p.spec.name, {}).items()}),
                     0, tuple(running.get(p.spec.name, ())), ())
        for p in exp.pipelines)
    hbm = exp.accelerator.hbm_bytes
    devices = tuple(DeviceView(i, 0, hbm, 0.0, 0.0, ()) for i in range(exp.num_devices))
    return View(0.0, pipes, devices, exp.accelerator, exp.num_devices, make_cost(exp))


def phase_of(s: Span) -> str:
    return Stage.ROLLOUT if s.stage in ROLLOUT_STAGES else s.stage


@pytest.mark.parametrize("models,devices,task,fraction", [
    (("qwen3-0.6b", "qwen3-4b"), 8, "gsm8k", 0.625),
    (("qwen3-4b", "qwen3-4b", "qwen3-4b"), 4, "search-r1", 0.5),
])
def test_rollmux_runs_whole_phases_on_their_pools(models: tuple[str, ...], devices: int,
                                                  task: str, fraction: float) -> None:
    cfg = make_cfg(models, devices, task)
    policy = RollMuxPolicy(fraction)
    events = run(cfg, policy)
    check_run(cfg, events)
    assert policy.pools is not None
    roll, train = set(policy.pools.rollout), set(policy.pools.train)
    spans = spans_of(events)
    rollouts = [s for s in spans if s.stage in ROLLOUT_STAGES]
    assert all(set(s.devices) <= roll and s.compute_share == 1.0 for s in rollouts)
    assert all(set(s.devices) <= train for s in spans if s.stage in GPU_STAGES)
    # One pipeline's rollout at a time on the rollout pool, one training phase on the other.
    for pool in (rollouts, [s for s in spans if s.stage in GPU_STAGES]):
        for a in pool:
            for b in pool:
                if (a.pipeline, a.step) != (b.pipeline, b.step):
                    assert not overlaps(a, b), (a, b)


def test_states_move_through_host_memory_only_when_they_do_not_all_fit() -> None:
    # Three 4B train states (36 GB each on a 2-device pool) cannot all stay resident.
    crowded = make_cfg(("qwen3-4b",) * 3, 4)
    policy = RollMuxPolicy(0.5)
    spans = spans_of(run(crowded, policy))
    assert policy.pools is not None and not policy.pools.all_resident
    for stage in (Stage.ONLOAD, Stage.OFFLOAD):
        moved = Counter(s.pipeline for s in spans if s.stage == stage)
        # onload before each training phase but the first (start-up), offload after all but
        # the last
        want = STEPS - 1
        assert moved == {f"p{i}": want for i in range(3)}, stage
    by_key = {(s.pipeline, s.step, phase_of(s)): s for s in spans}
    for (pipe, step, phase), s in by_key.items():
        if phase == Stage.ONLOAD:
            assert s.end_s <= by_key[(pipe, step, Stage.OLD_LOGPROB)].start_s + 1e-9
        if phase == Stage.OFFLOAD:
            assert s.start_s >= by_key[(pipe, step, Stage.WEIGHT_SYNC)].end_s - 1e-9
    # Two small models fit together: no transfers at all.
    roomy = RollMuxPolicy(0.5)
    spans = spans_of(run(make_cfg(("qwen3-0.6b",) * 2, 4), roomy))
    assert roomy.pools is not None and roomy.pools.all_resident
    assert not [s for s in spans if s.stage in (Stage.ONLOAD, Stage.OFFLOAD)]


def test_split_search_is_reported() -> None:
    cfg = make_cfg(("qwen3-0.6b", "qwen3-4b"), 8)
    names = {v.name for v in RollMuxPolicy().variants()}
    assert len(names) == len(ROLLOUT_FRACTIONS) * len(TP_FACTORS)  # each at scaled TPs too
    res = simulate(cfg, policy="rollmux", solo=False)
    assert res.summary["variant"].split("@")[0] in {n.split("@")[0] for n in names}
    assert res.summary["samples"] == sum(p.batch_size * p.group_size * STEPS
                                         for p in cfg.pipelines)


def test_split_keeps_whole_tp_groups_and_a_training_pool() -> None:
    view = tiny_view(make_cfg(("qwen3-0.6b",), 8), {})
    assert split_pools(view, 0.625) == (tuple(range(5)), (5, 6, 7))
    assert split_pools(view, 0.75) == (tuple(range(6)), (6, 7))
    roll, train = split_pools(tiny_view(make_cfg(("qwen3-0.6b",), 8, rollout_tp=4), {}), 0.625)
    assert (len(roll), len(train)) == (4, 4)


def test_infeasible_split_is_a_config_error() -> None:
    # A 4B model cannot train on one H100 (train state + activations > 80 GB).
    view = tiny_view(make_cfg(("qwen3-4b",), 4), {})
    with pytest.raises(ConfigError, match="training pool"):
        RollMuxPolicy(0.75).decide(view)
    with pytest.raises(ConfigError, match="runner"):
        RollMuxPolicy().decide(view)


def test_decide_on_a_hand_built_view() -> None:
    """First decision: states placed, the first ready rollout takes the whole rollout pool; the
    second waits. Later: p0's training phase takes the training pool while p1 rolls out."""
    cfg = make_cfg(("qwen3-0.6b", "qwen3-0.6b"), 4)
    policy = RollMuxPolicy(0.5)
    acts = policy.decide(tiny_view(cfg, {}))
    assert [a for a in acts.actions if isinstance(a, SetResident)] != []
    starts = [a for a in acts.actions if isinstance(a, StartRollout | StartStage)]
    assert starts == [StartRollout("p0", 0, (0, 1), 1, kv_mem_bytes=starts[0].kv_mem_bytes)]
    assert starts[0].kv_mem_bytes > 0
    # p0's rollout ended (reward on the CPU next), p1 now rolls out on the rollout pool.
    p1_roll = RunningTask(task_id("p1", 0, Stage.ROLLOUT), "p1", 0, Stage.ROLLOUT, (0, 1), 1.0, 1.0)
    acts = policy.decide(tiny_view(cfg, {"p0": {0: {Stage.ROLLOUT}}}, {"p1": [p1_roll]}))
    assert acts.actions == (StartStage("p0", 0, Stage.REWARD, (), share=0.0),)
    acts = policy.decide(tiny_view(cfg, {"p0": {0: {Stage.ROLLOUT, Stage.REWARD}}},
                                   {"p1": [p1_roll]}))
    (start,) = acts.actions
    assert isinstance(start, StartStage)
    assert (start.pipeline, start.stage, start.devices) == ("p0", Stage.OLD_LOGPROB, (2, 3))
