"""The scheduler sees predictions only (DESIGN.md §6): no policy input carries a sampled length.

Two checks:

- **Policies.** Every registered policy, every variant, runs on two workloads whose step 0 is the
  same and whose later steps' sampled response lengths differ (prompts the same). A policy is a
  function of what it observes, so as long as the two runs' views are equal (everything up to the
  end of step 0, including the start of step 1's rollout), its decisions must be equal; a policy
  that read the current step's truth through any path would decide differently.
- **Dispatch.** The skew-aware dispatch of a step assigns the same requests to the same ranks when
  only the sampled response lengths change (the ranker reads history and prompt lengths only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from jigsawrl.config import validate_config
from jigsawrl.driver.loop import Driver
from jigsawrl.errors import ConfigError
from jigsawrl.executors.simulated import SimulatedExecutor
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import make_cost
from jigsawrl.scheduler.base import (
    Decision,
    Policy,
    PolicyBase,
    StartRollout,
    View,
    get_policy,
    list_policies,
)
from jigsawrl.scheduler.ranker import LengthRanker
from jigsawrl.sim.dispatch import TruthSampler
from jigsawrl.stages import Stage
from jigsawrl.workload.experiment import ResolvedPipeline
from jigsawrl.workload.requests import RequestTruth


def tiny_cfg(mode: str):  # noqa: ANN201
    pipes = [{"name": f"p{i}", "model": "qwen3-0.6b", "task": task, "batch_size": 4,
              "group_size": 2, "max_response_tokens": 1024, "steps": 3, "mode": mode,
              **({"max_staleness": 1} if mode == "async" else {})}
             for i, task in enumerate(("gsm8k", "math", "gsm8k"))]
    return validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                        "accelerators_per_node": 8},
                            "pipelines": pipes, "seed": 5})


def stretched(reqs: list[RequestTruth], factor: float, cap: int) -> list[RequestTruth]:
    """The same prompts with other sampled response lengths."""
    return [dataclasses.replace(r, turns=tuple(
        dataclasses.replace(t, response_tokens=max(1, min(cap, int(t.response_tokens * factor))))
        for t in r.turns)) for r in reqs]


class Recorder(PolicyBase):
    """Wraps a policy; records each view (less the belief cost model) and decision."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.wants_rank_progress = inner.wants_rank_progress
        self.calls: list[tuple[tuple, Decision]] = []

    def decide(self, view: View) -> Decision:
        d = self.inner.decide(view)
        self.calls.append(((view.now_s, view.pipelines, view.devices), d))
        return d


def drive(cfg, policy: Policy, factor: float) -> Recorder:  # noqa: ANN001
    exp = resolve(cfg)
    base = TruthSampler(cfg.seed)

    def truth(pipe: ResolvedPipeline, step: int) -> list[RequestTruth]:
        reqs = base.step_requests(pipe, step)
        return reqs if step == 0 else stretched(reqs, factor, pipe.spec.max_response_tokens)

    ex = SimulatedExecutor(exp, truth_cost=make_cost(exp), seed=cfg.seed)
    ex.step_requests = truth  # type: ignore[method-assign]
    rec = Recorder(policy)
    Driver(exp, rec, ex, make_cost(exp)).run()
    return rec


def variants(name: str) -> Sequence[Policy]:
    return list(get_policy(name).variants())


def same_inputs_same_decisions(a: Recorder, b: Recorder) -> int:
    """Decisions agree while the views agree; returns how many were compared."""
    n = 0
    for (va, da), (vb, db) in zip(a.calls, b.calls, strict=False):
        if va != vb:
            break
        assert da == db, f"{a.name}: same view at t={va[0]:.3f}, different decision"
        n += 1
    return n


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", list_policies())
def test_no_policy_reads_the_sampled_lengths(name: str, mode: str) -> None:
    cfg = tiny_cfg(mode)
    ran = 0
    for i, _ in enumerate(variants(name)):
        try:
            a = drive(cfg, variants(name)[i], 1.0)
        except ConfigError:
            continue  # a placement that cannot place this workload
        b = drive(cfg, variants(name)[i], 1.9)
        n = same_inputs_same_decisions(a, b)
        assert [c[0] for c in a.calls] != [c[0] for c in b.calls], "the truths did not differ"
        compared = [x for _, d in a.calls[:n] for x in d.actions]
        assert any(isinstance(x, StartRollout) and x.step == 1 for x in compared), (
            f"{a.name}: step 1's rollout start was not compared")
        ran += 1
    assert ran, f"{name}: no variant ran"


def test_skew_aware_dispatch_ignores_the_sampled_lengths() -> None:
    cfg = tiny_cfg("async")
    exp = resolve(cfg)
    pipe = exp.pipelines[0]
    base = TruthSampler(cfg.seed).step_requests(pipe, 0)
    prompts = [RequestTruth(r.sample_id, 50 + 37 * i % 300, r.turns) for i, r in enumerate(base)]
    ranker = LengthRanker(100.0, 2.0)
    got = []
    for factor in (1.0, 0.3, 3.0):
        ex = SimulatedExecutor(exp, truth_cost=make_cost(exp), seed=cfg.seed)
        reqs = stretched(prompts, factor, pipe.spec.max_response_tokens)
        ex.step_requests = lambda p, s, reqs=reqs: reqs  # type: ignore[method-assign]
        seen: list[list[list[str]]] = []
        ex.sim.start_rollout = (  # type: ignore[method-assign]
            lambda *args, seen=seen, **_: seen.append([[r.sample_id for r in c] for c in args[-1]]))
        ex.launch(StartRollout(pipe.spec.name, 0, (0, 1, 2, 3), 1, dispatch="skew_aware",
                               ranker=ranker))
        got.append(seen[0])
    assert got[0] == got[1] == got[2]
    assert sorted(x for c in got[0] for x in c) == sorted(r.sample_id for r in base)


def test_ranker_fits_history_not_truth() -> None:
    from jigsawrl.graph.predict import StepObservation

    assert LengthRanker.fit(()) == LengthRanker()
    obs = StepObservation(0, (100, 200, 300), (150, 250, 350), {})
    rk = LengthRanker.fit((obs,))
    assert rk.predict(400) == pytest.approx(450.0)
    assert Stage.ROLLOUT  # the stage vocabulary is the one source of names
