"""The ``streamrl`` baseline: disaggregated pools, one-step async overlap, skew-aware dispatch.

The run checks here (:func:`check_run`) are shared with ``test_areal.py``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
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
from jigsawrl.scheduler.rollout_tp import TP_FACTORS
from jigsawrl.scheduler.streamrl import StreamRLPolicy, shared_plans, split_plans
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.stages import POST_ROLLOUT as TRAIN_STAGES
from jigsawrl.stages import ROLLOUT_BANDS as ROLLOUT_STAGES

STEPS = 3


def make_cfg(mode: str = "async", devices: int = 8, model: str = "qwen3-4b",
             tasks: Sequence[str] = ("gsm8k", "aime-tool"), batch: int = 6) -> ExperimentConfig:
    pipes = []
    for i, task in enumerate(tasks):
        p = {"name": f"p{i}", "model": model, "task": task, "batch_size": batch, "group_size": 4,
             "max_response_tokens": 2048, "steps": STEPS, "mode": mode}
        if mode == "async":
            p["max_staleness"] = 1
        pipes.append(p)
    return validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                        "accelerators_per_node": devices},
                            "pipelines": pipes, "seed": 3})


def run(cfg: ExperimentConfig, policy: object) -> list[Event]:
    return run_once(resolve(cfg), policy, cfg.seed).events


def spans_of(events: list[Event]) -> list[Span]:
    return [e for e in events if isinstance(e, Span)]


def check_shares(spans: list[Span]) -> None:
    """No device ever holds more than its whole compute (sweep over span starts and ends)."""
    per_dev: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for s in spans:
        for d in s.devices:
            per_dev[d] += [(s.start_s, s.compute_share), (s.end_s, -s.compute_share)]
    for d, evs in per_dev.items():
        level = 0.0
        for _, delta in sorted(evs):  # at equal times the end (negative) comes first
            level += delta
            assert level <= 1.0 + 1e-6, f"device {d} over its compute"


def check_staleness(spans: list[Span], eta: dict[str, int]) -> None:
    """A rollout of step k never starts before the weight sync of step k-1-η has ended."""
    sync_end: dict[tuple[str, int], float] = {}
    first: dict[tuple[str, int], float] = {}
    for s in spans:
        key = (s.pipeline, s.step)
        if s.stage == Stage.WEIGHT_SYNC:
            sync_end[key] = max(sync_end.get(key, 0.0), s.end_s)
        elif s.stage in ROLLOUT_STAGES:
            first[key] = min(first.get(key, s.start_s), s.start_s)
    for (pipe, k), start in first.items():
        dep = k - 1 - eta[pipe]
        if dep >= 0:
            assert start >= sync_end[(pipe, dep)] - 1e-9, f"{pipe}/{k} ran too stale"


def check_pools_disjoint(spans: list[Span]) -> tuple[set[int], set[int]]:
    roll = {d for s in spans if s.stage in ROLLOUT_STAGES for d in s.devices}
    train = {d for s in spans if s.stage in TRAIN_STAGES for d in s.devices}
    assert roll and train and not roll & train, (roll, train)
    return roll, train


def overlaps(spans: list[Span], same_pipeline: bool = True) -> bool:
    """Some rollout span of step k+1 overlaps a training span of step k of the same pipeline
    (or, with ``same_pipeline=False``, any rollout span overlaps any training span)."""
    roll = [s for s in spans if s.stage in ROLLOUT_STAGES and s.stage != Stage.TOOL_WAIT]
    train = [s for s in spans if s.stage in MODEL_PASSES]
    return any((not same_pipeline or (r.pipeline == t.pipeline and r.step == t.step + 1))
               and r.start_s < t.end_s and t.start_s < r.end_s for r in roll for t in train)


def check_run(cfg: ExperimentConfig, events: list[Event]) -> list[Span]:
    """All steps finish, every sample exactly once, shares and staleness within bounds."""
    steps = Counter(e.pipeline for e in events if isinstance(e, StepFinished))
    assert steps == {p.name: p.steps for p in cfg.pipelines}
    ids = Counter(e.sample_id for e in events if isinstance(e, SampleFinished))
    assert set(ids.values()) == {1}
    assert len(ids) == sum(p.steps * p.batch_size * p.group_size for p in cfg.pipelines)
    spans = spans_of(events)
    check_shares(spans)
    check_staleness(spans, {p.name: p.max_staleness for p in cfg.pipelines})
    check_pools_disjoint(spans)
    return spans


@pytest.mark.parametrize("placement", ["split", "shared"])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_streamrl_runs_within_invariants(placement: str, mode: str) -> None:
    cfg = make_cfg(mode)
    spans = check_run(cfg, run(cfg, StreamRLPolicy(placement, 0)))
    if placement == "split":  # per-pipeline pools: step k+1 generates while step k trains
        assert overlaps(spans) == (mode == "async")  # sync: disaggregated, no overlap
    else:  # pipelines take turns on the shared pools; one trains while another generates
        assert overlaps(spans, same_pipeline=False)


def test_streamrl_small_model_four_devices() -> None:
    cfg = make_cfg("async", devices=4, model="qwen3-0.6b", tasks=("gsm8k", "gsm8k"), batch=4)
    spans = check_run(cfg, run(cfg, StreamRLPolicy("split", 0)))
    roll, train = check_pools_disjoint(spans)
    assert roll == {0, 2} and train == {1, 3}  # per-pipeline sub-pools of two devices each
    assert overlaps(spans)


def test_streamrl_searches_splits_and_reports_best() -> None:
    names = [v.name for v in StreamRLPolicy().variants()]
    plain = [f"streamrl-split#{k}" for k in range(6)] + [f"streamrl-shared#{k}" for k in range(3)]
    assert names == plain + [f"{n}@tp x{f:g}" for f in TP_FACTORS[1:] for n in plain]
    cfg = make_cfg("async", devices=8)  # 4B trainers need 2 devices: the rollout devices move
    plans = split_plans(tiny_view(cfg))
    assert [{n: (len(p.rollout), len(p.train)) for n, p in plan.items()} for plan in plans] == [
        {"p0": (2, 2), "p1": (2, 2)}, {"p0": (1, 2), "p1": (3, 2)}, {"p0": (3, 2), "p1": (1, 2)}]
    assert [len(p["p0"].train) for p in shared_plans(tiny_view(cfg))] == [3, 4, 5, 6, 7]
    small = make_cfg("async", devices=4, model="qwen3-0.6b", tasks=("gsm8k", "math"), batch=4)
    summary = simulate(small, policy="streamrl", solo=False).summary
    assert summary["variant"].startswith("streamrl-") and "r+" in summary["variant"]


def test_streamrl_infeasible_config_names_a_fix() -> None:
    cfg = make_cfg("async", devices=2)  # a 4B trainer does not fit on one H100
    with pytest.raises(ConfigError, match="fix:"):
        run(cfg, StreamRLPolicy("shared", 0))
    with pytest.raises(ConfigError, match="rollout TP group and a trainer"):
        run(cfg, StreamRLPolicy("split", 0))
    with pytest.raises(ConfigError, match="no placement"):
        simulate(cfg, policy="streamrl", solo=False)


# ---------------------------------------------------------------------------- policy unit test

def tiny_view(cfg: ExperimentConfig, done: dict[int, frozenset[str]] | None = None,
              steps_completed: int = 0, running: dict[str, tuple] | None = None) -> View:
    """A hand-built view of ``cfg`` at t=10 s: pipeline p0 with ``done``/``running`` given."""
    exp = resolve(cfg)
    pvs = []
    for p in exp.pipelines:
        mine = p.spec.name == "p0"
        pvs.append(PipelineView(
            p.spec.name, p.index, p.spec, p.model,
            MappingProxyType(dict(done or {}) if mine else {}),
            steps_completed if mine else 0, (running or {}).get(p.spec.name, ()), ()))
    devs = tuple(DeviceView(i, 0, exp.accelerator.hbm_bytes, 0.0, 0.0, ())
                 for i in range(exp.num_devices))
    return View(10.0, tuple(pvs), devs, exp.accelerator, exp.num_devices, make_cost(exp))


def test_streamrl_decision_on_hand_built_view() -> None:
    cfg = make_cfg("async", devices=8)
    pol = StreamRLPolicy("split", 0)
    first = pol.decide(tiny_view(cfg)).actions
    res = [a for a in first if isinstance(a, SetResident)]
    assert [(a.pipeline, a.devices) for a in res] == [("p0", (2, 3)), ("p1", (6, 7))]
    starts = [a for a in first if isinstance(a, StartRollout)]
    assert [(a.pipeline, a.step, a.devices, a.share, a.dispatch) for a in starts] == [
        ("p0", 0, (0, 1), 1.0, "skew_aware"), ("p1", 0, (4, 5), 1.0, "skew_aware")]
    # p0's rollout of step 0 is done: its reward runs on the CPU and the rollout of step 1 (one
    # step stale) starts on the rollout pool; then the log-probs take the training pool while
    # step 1 generates — the async overlap.
    nxt = pol.decide(tiny_view(cfg, done={0: frozenset({Stage.ROLLOUT})})).actions
    p0 = [a for a in nxt if getattr(a, "pipeline", None) == "p0"]
    assert StartStage("p0", 0, Stage.REWARD, (), share=0.0) in p0
    assert any(isinstance(a, StartRollout) and a.step == 1 and a.devices == (0, 1) for a in p0)
    gen1 = {"p0": (RunningTask(task_id("p0", 1, Stage.ROLLOUT), "p0", 1, Stage.ROLLOUT, (0, 1),
                               1.0, 5.0),)}
    later = pol.decide(tiny_view(cfg, done={0: frozenset({Stage.ROLLOUT, Stage.REWARD})},
                                 running=gen1))
    p0 = [a for a in later.actions if getattr(a, "pipeline", None) == "p0"]
    assert len(p0) == 1 and p0[0].stage == Stage.OLD_LOGPROB and p0[0].devices == (2, 3)
    assert p0[0].mem_bytes > 0  # activations of a micro-batch
