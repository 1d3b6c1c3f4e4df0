"""The one wiring of a run: a resolved experiment, a policy, an executor and a belief cost model
into the driver, and the driver's events into a summary.

Simulated runs (:mod:`~jigsawrl.experiments.simulated`), real runs on Ray
(:mod:`~jigsawrl.experiments.real`) and the simulator's prediction of a real run
(:mod:`~jigsawrl.experiments.calibrate`) differ only in the executor and the cost models they pass
here; the policy is built, driven and summarised the same way for all of them (DESIGN.md §3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jigsawrl.config import ExperimentConfig
from jigsawrl.costmodel import CostModel
from jigsawrl.driver.loop import Driver, DriverResult
from jigsawrl.driver.protocol import Executor
from jigsawrl.events import SampleFinished
from jigsawrl.metrics.summary import RunInfo, summarize
from jigsawrl.scheduler import get_policy
from jigsawrl.scheduler.base import Policy, params_for
from jigsawrl.workload.experiment import Experiment

Progress = Callable[[int, int], None]


def make_policy(cfg: ExperimentConfig, name: str | None = None,
                params: Mapping[str, Any] | None = None) -> Policy:
    """The policy ``name`` (default ``cfg.scheduler.name``) with its params: ``params`` when
    given, else those of ``cfg.scheduler`` that belong to it (``scheduler.base.params_for``).

    Raises:
        ConfigError: an unknown policy or params it does not take.
    """
    name = name or cfg.scheduler.name
    if params is None:
        params = params_for(cfg.scheduler.name, cfg.scheduler.params, name)
    return get_policy(name, dict(params))


def drive(exp: Experiment, policy: Policy, executor: Executor, belief: CostModel, *,
          progress: Progress | None = None) -> DriverResult:
    """Run ``policy`` on ``executor`` to the end of every pipeline's steps."""
    return Driver(exp, policy, executor, belief, on_progress=progress).run()


def run_info(exp: Experiment, policy: str, *, executor: str = "simulated",
             name: str | None = None, seed: int | None = None,
             solo: dict[str, float] | None = None, bound: float | None = None,
             accelerator: str | None = None, peak_flops: float | None = None) -> RunInfo:
    """What a summary says about the run that produced it (``accelerator`` and ``peak_flops``
    default to the experiment's; a prediction names its truth model's). Each pipeline's arrival
    (``start_s``) is where its first step's latency starts, for every kind of run."""
    cfg = exp.config
    return RunInfo(name=name or cfg.name or "run", policy=policy,
                   seed=cfg.seed if seed is None else seed, num_devices=exp.num_devices,
                   accelerator=accelerator or exp.accelerator.name,
                   peak_flops_per_device=peak_flops or exp.accelerator.peak_flops,
                   price_per_device_hour_usd=exp.price_per_hour,
                   pipelines=tuple(p.spec.name for p in exp.pipelines),
                   solo_step_latency_s=solo, lower_bound_s=bound, executor=executor,
                   arrival_s={p.spec.name: p.spec.start_s for p in exp.pipelines},
                   latency_bounds={p.spec.name: p.spec.max_latency_ratio for p in exp.pipelines
                                   if p.spec.max_latency_ratio is not None} or None)


def summarize_run(result: DriverResult, info: RunInfo) -> dict[str, Any]:
    """The run's summary (``metrics.summary.summarize``) with the policy's decision-time p99."""
    summary = summarize(result.events, info)
    summary["scheduler_decision_ms_p99"] = p99_ms(result.decision_times_s)
    return summary


def throughput(result: DriverResult) -> float:
    """Prompt + response tokens of finished samples per second of makespan."""
    tokens = sum(e.prompt_tokens + e.response_tokens for e in result.events
                 if isinstance(e, SampleFinished))
    return tokens / result.makespan_s if result.makespan_s > 0 else 0.0


def p99_ms(times_s: Sequence[float]) -> float | None:
    """The 99th percentile of decision times, in milliseconds (None without decisions)."""
    if not times_s:
        return None
    s = sorted(times_s)
    return 1000.0 * s[min(len(s) - 1, int(0.99 * len(s)))]
