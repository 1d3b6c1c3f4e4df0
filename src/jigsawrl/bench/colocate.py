"""``jigsawrl bench colocate``: do two co-located calls gain from running at once on one core?

What: the Ray executor's device worker runs one call at a time, so two sub-stages placed on one
logical device (one core) only time-slice. torch's thread pool is per process, so running them
*at once* means two processes sharing the core — the CPU counterpart of an SM partition. This
bench measures both on the same work, on one core (``os.sched_setaffinity``):

- ``serial``: one process runs call A, then call B (what the device worker does today);
- ``concurrent``: two processes pinned to the same core run A and B at the same time.

Call A is a rollout of pipeline A; call B a whole GRPO step of pipeline B (rollout, reward,
update). Two workloads: A a *tool* rollout (``calculator``, with ``tool_latency_s`` per call:
while every request waits for its tool, the engine has nothing to compute) and A a *compute*
rollout (``countdown``: no waits). Each mode runs ``repeats`` times, interleaved; the report is
the median makespan (both calls done) and the range.

Why: issue 14 asks whether co-located calls can run at once with their thread shares and to
measure it against time-slicing before building it into the executor. The expected answer on
one core: a gain only where a call waits (tools), none where both compute.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jigsawrl.bench.real import Spread
from jigsawrl.config import PipelineSpec, RolloutSpec, TrainSpec
from jigsawrl.stages import Stage


@dataclass(frozen=True)
class ColocateSpec:
    """The two calls' pipelines and the measurement's settings."""

    model: str = "qwen2-1m"
    batch_size: int = 16
    group_size: int = 8
    tool_latency_s: float = 0.2
    repeats: int = 3
    core: int = 0
    seed: int = 0


def _pipeline(b: ColocateSpec, name: str, task: str, latency: float) -> PipelineSpec:
    params: dict[str, Any] = {"difficulty": "easy", "format_score": 0.0}
    if task == "countdown":
        params["num_numbers"] = 2
    if task == "calculator":
        params.update(num_ops=1, max_operand=9)
    return PipelineSpec(
        name=name, model=b.model, task=task, batch_size=b.batch_size, group_size=b.group_size,
        steps=1, use_ref=False, max_response_tokens=64,
        rollout=RolloutSpec(tool_latency_s=latency, max_num_seqs=128, task_params=params),
        train=TrainSpec(lr=3e-4, micro_batch_size=b.batch_size * b.group_size, warmup_steps=20,
                        warmup_batch_size=16, eval_size=0, threads=1))


def _pin(core: int) -> bool:
    if not hasattr(os, "sched_setaffinity"):
        return False
    os.sched_setaffinity(0, {core})
    return True


def _ready(spec: PipelineSpec, seed: int, cache_dir: str | None) -> Any:
    import torch

    from jigsawrl.engine.pipeline import RealPipeline

    torch.set_num_threads(1)
    pipe = RealPipeline(spec, seed, cache_dir=Path(cache_dir) if cache_dir else None)
    pipe.start()
    return pipe


def _call(pipe: Any, kind: str, step: int) -> None:
    if kind == Stage.ROLLOUT:
        pipe.rollout(step)
    else:
        pipe.run_step(step)


Calls = list[tuple[PipelineSpec, str, int]]  # (pipeline, Stage.ROLLOUT | "step", seed)


def _worker(calls: Calls, core: int, cache_dir: str | None, step: int, ready: Any, go: Any,
            done: Any) -> None:
    """One process: pin to the core, build its pipelines, warm each call once (a process's
    first call pays one-off costs), say ready, wait for the start, run its calls in order."""
    _pin(core)
    pipes = [(_ready(spec, seed, cache_dir), kind) for spec, kind, seed in calls]
    for pipe, kind in pipes:
        _call(pipe, kind, 0)
    ready.put(os.getpid())
    go.wait()
    for pipe, kind in pipes:
        _call(pipe, kind, step)
    done.put(time.time())


def _makespan(groups: list[Calls], c: ColocateSpec, cache_dir: str | None, step: int) -> float:
    """Start one process per group of calls; seconds from the common start until all ended."""
    ctx = mp.get_context("spawn")
    ready, go, done = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(g, c.core, cache_dir, step, ready, go, done))
             for g in groups]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=600)
        t0 = time.time()
        go.set()
        ends = [done.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return max(ends) - t0


def run_colocate(c: ColocateSpec, cache_dir: Path | None = None) -> dict[str, Any]:
    """Both modes on both workloads, interleaved; medians and ranges of the makespan of the
    two calls. Every measured call runs in a fresh process from the same (warm-started) state,
    so both modes do the same work."""
    cache = str(cache_dir) if cache_dir else None
    b = (_pipeline(c, "B-countdown", "countdown", 0.0), "step", c.seed + 1)
    workloads = {"tool": (_pipeline(c, "A-calculator", "calculator", c.tool_latency_s),
                          Stage.ROLLOUT, c.seed),
                 "compute": (_pipeline(c, "A-countdown", "countdown", 0.0), Stage.ROLLOUT, c.seed)}
    out: dict[str, Any] = {"spec": c.__dict__, "pinned": hasattr(os, "sched_setaffinity"),
                           "workloads": {}}
    for name, a in workloads.items():
        serial, concurrent = [], []
        for r in range(c.repeats):
            serial.append(_makespan([[a, b]], c, cache, 1 + r))
            concurrent.append(_makespan([[a], [b]], c, cache, 1 + r))
        out["workloads"][name] = {
            "serial_s": Spread.json_of(serial), "concurrent_s": Spread.json_of(concurrent),
            "speedup": statistics.median(serial) / statistics.median(concurrent),
            "runs": {"serial_s": serial, "concurrent_s": concurrent}}
    return out


__all__ = ["ColocateSpec", "run_colocate"]
