"""How long a policy takes to decide (``jigsawrl bench decide``).

Why: the scheduler runs on the critical path of a real cluster — every event waits for its
``decide(view)`` — so its latency must stay small as the pool and the number of pipelines grow
(the issue's targets: p99 ≤ 10 ms at 64 GPUs × 8 pipelines, then at 128 × 16). This builds a config of N Qwen3-4B
GRPO pipelines with mixed tasks (GSM8K, MATH, AIME with a tool, Search-R1, in turn) on D H100s
(8 per node), simulates it once, and reports the distribution of the wall time of every
``decide`` call (``SimRun.decision_times_s``, measured by the driver with ``perf_counter``) and,
beside it, of the work the policy left off its decision path (``background_times_s``: jigsaw's
replans and rollout replays, which the driver runs after a decision's actions; an event that
arrives meanwhile waits for it, so both are reported).

The times are wall times of *this* machine's CPU; they depend on it and on its load, so the
report names the machine. For ``verl`` (which runs two placements) the times are those of the
placement the runner kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from jigsawrl.config import ExperimentConfig, validate_config
from jigsawrl.errors import ConfigError
from jigsawrl.experiments.simulated import simulate

TASK_MIX = ("gsm8k", "math", "aime-tool", "search-r1")
DEVICES_PER_NODE = 8
PERCENTILES = (50, 90, 99)


def decide_config(devices: int, pipelines: int, *, steps: int = 3, batch_size: int = 64,
                  seed: int = 0, policy: str | None = None,
                  params: dict[str, Any] | None = None) -> ExperimentConfig:
    """N Qwen3-4B pipelines (tasks cycling through :data:`TASK_MIX`) on ``devices`` H100s
    (``policy`` with ``params``: the config's scheduler, default verl's).

    Raises:
        ConfigError: ``devices`` is not a multiple of 8 (when above 8), or sizes out of range.
    """
    nodes = max(1, -(-devices // DEVICES_PER_NODE))
    per_node = devices if devices < DEVICES_PER_NODE else DEVICES_PER_NODE
    if nodes * per_node != devices:
        raise ConfigError(f"{devices} devices is not a whole number of 8-GPU nodes",
                          where="--devices", fix="use 1..8 or a multiple of 8")
    pipes = [{"name": f"p{i}-{TASK_MIX[i % len(TASK_MIX)]}", "model": "qwen3-4b",
              "task": TASK_MIX[i % len(TASK_MIX)], "batch_size": batch_size, "group_size": 4,
              "max_response_tokens": 8192, "steps": steps} for i in range(pipelines)]
    raw = {"name": f"decide-{devices}x{pipelines}", "seed": seed,
           "cluster": {"accelerator": "h100-80gb", "num_nodes": nodes,
                       "accelerators_per_node": per_node},
           "pipelines": pipes}
    if policy is not None:
        raw["scheduler"] = {"name": policy, "params": dict(params or {})}
    return validate_config(raw, source="bench decide")


@dataclass(frozen=True)
class DecideStats:
    """Distribution of one run's decision times (ms); ``None`` fields when there were none."""

    policy: str
    devices: int
    pipelines: int
    count: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    mean_ms: float | None
    simulated_makespan_s: float | None
    wall_s: float
    # the work the policy left off its decision path (replans, replays; driver/loop.py), in
    # the same run: how many pieces, and their times as the decisions' above
    background_count: int = 0
    background_p50_ms: float | None = None
    background_p99_ms: float | None = None
    background_max_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def decision_stats(times_s: list[float]) -> dict[str, float | None]:
    """p50/p90/p99 (linear interpolation), max and mean of ``times_s``, in milliseconds."""
    if not times_s:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    ms = 1000.0 * np.asarray(times_s, dtype=float)
    pct = np.percentile(ms, PERCENTILES)
    return {"p50_ms": float(pct[0]), "p90_ms": float(pct[1]), "p99_ms": float(pct[2]),
            "max_ms": float(ms.max()), "mean_ms": float(ms.mean())}


def bench_decide(policy: str = "jigsaw", devices: int = 64, pipelines: int = 8, *,
                 steps: int = 3, seed: int = 0,
                 params: dict[str, Any] | None = None) -> DecideStats:
    """Simulate :func:`decide_config` under ``policy`` (with scheduler ``params``, e.g.
    ``{"fallback": False}``: jigsaw's own plan) once and measure its decisions.

    Raises:
        ConfigError: unknown policy, bad params, or a config that does not fit.
    """
    cfg = decide_config(devices, pipelines, steps=steps, seed=seed,
                        policy=policy if params else None, params=params)
    t0 = time.perf_counter()
    run = simulate(cfg, policy=policy, solo=False)
    wall = time.perf_counter() - t0
    work = decision_stats(run.background_times_s)
    return DecideStats(policy=policy, devices=devices, pipelines=pipelines,
                       count=len(run.decision_times_s), **decision_stats(run.decision_times_s),
                       simulated_makespan_s=run.summary.get("makespan_s"), wall_s=wall,
                       background_count=len(run.background_times_s),
                       background_p50_ms=work["p50_ms"], background_p99_ms=work["p99_ms"],
                       background_max_ms=work["max_ms"])
