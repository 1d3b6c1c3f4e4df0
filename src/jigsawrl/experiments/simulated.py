"""Wires a config into a simulation: resolve presets, build policy + executor, run, summarise.

This is the library entry point behind ``jigsawrl simulate`` / ``compare``. It also computes the
reference each pipeline is compared with — its mean step latency when it runs *alone* on the whole
pool under ``verl-split`` (same seed, and the very requests it saw in the run) — the makespan
floor and bound of the run's true workload (:mod:`jigsawrl.graph.bound`,
:mod:`jigsawrl.graph.makespan_bound`), and, for ``verl`` itself, runs every placement a verl user
would choose between and keeps the best (DESIGN.md §6: never report a weakened baseline).

The true requests are sampled once per :func:`simulate` (a :class:`TruthSampler` shared by the
policy's variants and the bounds): every run of one call sees the same workload by construction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from jigsawrl.config import ExperimentConfig
from jigsawrl.costmodel import CostModel, CostParams
from jigsawrl.costmodel.deploy import pool_deployment
from jigsawrl.driver.loop import DriverResult
from jigsawrl.errors import ConfigError
from jigsawrl.events import Event, StepFinished
from jigsawrl.executors.simulated import SimulatedExecutor
from jigsawrl.experiments.core import (
    Progress,
    drive,
    make_policy,
    run_info,
    summarize_run,
    throughput,
)
from jigsawrl.experiments.resolve import check_policy, resolve
from jigsawrl.graph.bound import floor_from_facts, pipeline_facts
from jigsawrl.graph.makespan_bound import BoundReport, makespan_bound
from jigsawrl.metrics.summary import RunInfo, step_latencies
from jigsawrl.scheduler.base import Policy
from jigsawrl.scheduler.rollout_tp import TP_FACTORS, RolloutTP
from jigsawrl.sim.dispatch import TruthSampler
from jigsawrl.workload.experiment import Experiment

log = logging.getLogger(__name__)

# Multiplicative lognormal noise of the truth model's durations (run-to-run jitter of real
# kernels and collectives); the belief model used by policies is noise-free.
TRUTH_NOISE_SIGMA = 0.05

@dataclass(slots=True)
class SimRun:
    """One simulated run: its events, summary and what produced it."""

    policy: str
    seed: int
    events: list[Event]
    summary: dict[str, Any]
    info: RunInfo
    decision_times_s: list[float] = field(default_factory=list)
    variant: str | None = None
    # wall seconds of the work the policy left off its decision path (driver/loop.py)
    background_times_s: list[float] = field(default_factory=list)


def run_once(exp: Experiment, policy: Policy, seed: int, *,
             progress: Progress | None = None,
             sampler: TruthSampler | None = None) -> DriverResult:
    """Run ``policy`` on ``exp`` once on the simulated executor.

    ``sampler``: the true requests to run on (default: sampled afresh from ``seed``, which gives
    the same requests: a sampler only saves sampling them twice).
    """
    truth = make_cost(exp, noise_sigma=TRUTH_NOISE_SIGMA, seed=seed)
    executor = SimulatedExecutor(exp, truth_cost=truth, seed=seed)
    if sampler is not None:
        executor.step_requests = sampler.step_requests  # the executor's one source of truth
    return drive(exp, policy, executor, make_cost(exp), progress=progress)


# Cost-model constants to assume instead of the defaults (``cost_assumptions``); empty: none.
_ASSUMED: ContextVar[dict[str, Any] | None] = ContextVar("cost_assumptions", default=None)


@contextmanager
def cost_assumptions(**params: Any) -> Iterator[None]:
    """Simulate with these :class:`~jigsawrl.costmodel.CostParams` instead of the defaults
    (belief and truth alike), e.g. ``s_sat=0.8`` for costly co-location: what ``bench paper``'s
    sensitivity runs use to show how much a ratio rests on a constant no GPU here can measure.

    Raises:
        ConfigError: a name that is not a cost-model constant.
    """
    known = set(CostParams.__dataclass_fields__)
    bad = sorted(set(params) - known)
    if bad:
        raise ConfigError(f"unknown cost-model constant(s) {', '.join(bad)}",
                          where="cost assumptions", fix="use fields of CostParams")
    token = _ASSUMED.set({**(_ASSUMED.get() or {}), **params})
    try:
        yield
    finally:
        _ASSUMED.reset(token)


def make_cost(exp: Experiment, *, noise_sigma: float = 0.0, seed: int = 0) -> CostModel:
    """The cost model for ``exp``'s cluster (noise 0 = belief; > 0 = truth), charging the
    pipelines' deployment (offloads, eager decode, critic: :func:`pool_deployment`) and any
    :func:`cost_assumptions` in force.

    Raises:
        ConfigError: pipelines whose deployments differ.
    """
    params = CostParams(devices_per_node=exp.config.cluster.accelerators_per_node,
                        **(_ASSUMED.get() or {}))
    return CostModel(exp.accelerator, noise_sigma=noise_sigma, seed=seed, params=params,
                     deployment=pool_deployment([p.spec for p in exp.pipelines]))


def simulate(cfg: ExperimentConfig, *, policy: str | None = None, seed: int | None = None,
             solo: bool | dict[str, float] = True, progress: Progress | None = None) -> SimRun:
    """Simulate ``cfg`` under ``policy`` (default: ``cfg.scheduler``).

    ``solo``: compute each pipeline's alone-latency reference (True), skip it (False), or reuse
    one computed before (a dict, as :func:`solo_latencies` returns).

    Raises:
        ConfigError: unknown presets/policy (with a "did you mean"), infeasible config, a
            workload over the request budget (all before anything is sampled).
    """
    exp = resolve(cfg)
    seed = cfg.seed if seed is None else seed
    name = check_policy(policy or cfg.scheduler.name,
                        "scheduler.name" if policy is None else "--policy")
    pol = make_policy(cfg, name)
    variants = list(pol.variants())
    sampler = TruthSampler(seed)
    best: tuple[float, str, DriverResult, Policy] | None = None
    infeasible: list[str] = []
    # the placements themselves, not each again at scaled rollout TPs (rollout_tp.py): when
    # the one placement of a policy fails, its own error says why
    own = [v for v in variants if not isinstance(v, RolloutTP)]
    own_error: ConfigError | None = None
    for v in variants:
        try:
            res = run_once(exp, v, seed, progress=progress, sampler=sampler)
        except ConfigError as exc:
            if len(variants) == 1:
                raise
            if len(own) == 1 and v is own[0]:
                own_error = exc
            # one placement of several that cannot place this workload (a queue wider than the
            # jobs, a split too thin to hold a train state): the others compete, as a user's would
            log.info("%s is infeasible here: %s", v.name, exc)
            infeasible.append(f"{v.name}: {exc}")
            continue
        tput = throughput(res)
        log.info("%s: %.1f tokens/s", v.name, tput)
        if best is None or tput > best[0]:
            best = (tput, v.name, res, v)
    if best is None and own_error is not None:
        raise own_error
    if best is None:
        raise ConfigError("no placement of this policy is feasible:\n  " + "\n  ".join(infeasible))
    _, vname, res, ran = best
    ref = solo if isinstance(solo, dict) else (solo_latencies(cfg, seed) if solo else None)
    info = with_bound(run_info(exp, name, seed=seed, solo=ref), bounds(exp, seed, sampler), exp)
    summary = summarize_run(res, info)
    if len(variants) > 1:
        summary["variant"] = vname
    if report := ran.report():
        summary["policy_report"] = report
    return SimRun(name, seed, res.events, summary, info, res.decision_times_s,
                  vname if len(variants) > 1 else None, res.background_times_s)


def bounds(exp: Experiment, seed: int, sampler: TruthSampler | None = None) -> BoundReport:
    """The floor and the realistic makespan bound of this experiment's true workload
    (:mod:`jigsawrl.graph.makespan_bound`), with the noise-free cost model."""
    sampler = sampler or TruthSampler(seed)
    cost = make_cost(exp)
    return makespan_bound(exp.pipelines, sampler.step_requests, cost, exp.num_devices)


def lower_bound(exp: Experiment, seed: int) -> float:
    """The makespan floor of this experiment's true workload (``floor_s``, graph/bound.py)."""
    cost = make_cost(exp)
    sampler = TruthSampler(seed)
    facts = pipeline_facts(exp.pipelines, sampler.step_requests, cost, exp.num_devices)
    return floor_from_facts(exp.pipelines, facts, cost, exp.num_devices)


def with_bound(info: RunInfo, report: BoundReport, exp: Experiment) -> RunInfo:
    """``info`` with the floor, the bound and its terms, and the pipelines' arrival times."""
    return replace(info, lower_bound_s=report.floor_s, bound_s=report.bound_s,
                   bound_terms=dict(report.terms),
                   arrival_s={p.spec.name: p.spec.start_s for p in exp.pipelines})


def solo_experiment(cfg: ExperimentConfig, index: int) -> Experiment:
    """Pipeline ``index`` of ``cfg`` alone on the whole pool from time 0, resolved so that it
    samples the very requests it saw in ``cfg``: the truth sampler seeds by the pipeline's
    index (:mod:`jigsawrl.sim.dispatch`), so the alone pipeline keeps its index in ``cfg``."""
    p = cfg.pipelines[index]
    alone = cfg.model_copy(update={"pipelines": [p.model_copy(update={"num_devices": None,
                                                                      "start_s": 0.0})]})
    exp = resolve(alone)
    return replace(exp, pipelines=(replace(exp.pipelines[0], index=index),))


def solo_latencies(cfg: ExperimentConfig, seed: int) -> dict[str, float]:
    """Each pipeline's mean step latency (as the summary defines it) when it runs alone on the
    whole pool under verl-split, on the same requests as in the run, at the fastest of the
    rollout TPs the baselines try (:data:`~jigsawrl.scheduler.rollout_tp.TP_FACTORS`).

    Why every TP: the runs it is the reference of choose their rollout TP (jigsaw's search,
    the baselines' variants); a solo run held at the config's TP credited a shared run's wider
    TP to sharing — steps "faster than alone" (docs/BENCHMARKS.md, "Solo at its best TP")."""
    out: dict[str, float] = {}
    for i, p in enumerate(cfg.pipelines):
        exp = solo_experiment(cfg, i)
        best = float("nan")
        for factor in TP_FACTORS:
            policy = make_policy(exp.config, "verl-split", {})
            try:
                res = run_once(exp, policy if factor == 1.0 else RolloutTP(policy, factor), seed)
            except ConfigError:
                continue  # a TP the config already runs, or one that does not fit: skipped
            steps = [e for e in res.events if isinstance(e, StepFinished)]
            lat = list(step_latencies(steps, {p.name: 0.0}).values())
            if lat and not best <= sum(lat) / len(lat):  # nan-safe min (best starts nan)
                best = sum(lat) / len(lat)
        out[p.name] = best
    return out
