"""What a worker pool waits between one stage's end and the next stage's start (the profile's
stage-gap probe; ``CostParams.stage_gap_s``).

Why: on the Ray executor a stage's call returns its result to the driver, the driver books it,
decides, and sends the next call, which its worker unpacks before the stage's first span starts.
On this 2-core CPU that took 6-17 ms per stage transition in `jigsawrl bench real` (against a
1-3 ms empty actor call, which the profile's Ray probe measures), a few percent of every real
step, and the simulator charged none of it.

How: a short real run through the Ray executor itself — two arithmetic pipelines of the profiled
model, one per device of a 2-device CPU pool (``verl-split``: both cores busy, as in a pool in
use), a few steps, no warm start — and the median over every transition of a step (rollout ->
reward -> old log-prob -> update -> weight sync) and from a weight sync to the next step's
rollout of the gap between the one's last span and the other's first. It is taken once, beside
the profile's other runtime measurements; the fit keeps what the empty call does not already
charge (:func:`jigsawrl.costmodel.fit.fit_runtime`). The same run measures what the driver,
Ray's daemons and the reward workers take of the host's CPU while the workers compute
(:mod:`jigsawrl.experiments.hostload`).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from jigsawrl.config import ExperimentConfig, PipelineSpec, TrainSpec, validate_config
from jigsawrl.events import Event, Span, StepFinished
from jigsawrl.experiments.hostload import HostSampler
from jigsawrl.experiments.machine import host_cores
from jigsawrl.stages import ROLLOUT_BANDS, Stage

log = logging.getLogger(__name__)

PROBE_STEPS = 8  # enough steps that the host-load window holds ~1 s of them
SYNC_TIMING = "update_weights"  # a step's weight sync in StepFinished.timings_s (verl's key)


def probe_spec(model: str, threads: int, batch_size: int, *, name: str = "profile",
               steps: int = 1, **fields: Any) -> PipelineSpec:
    """A small arithmetic pipeline of ``model``, no warm start, training at ``threads``: what
    the profile's runtime measurements run a worker's own code on."""
    return PipelineSpec(name=name, model=model, task="arithmetic", batch_size=batch_size,
                        group_size=2, steps=steps, use_ref=False,
                        train=TrainSpec(warmup_steps=0, eval_size=0, threads=threads), **fields)


def probe_config(model: str, seed: int = 0, steps: int = PROBE_STEPS) -> ExperimentConfig:
    """Two small arithmetic pipelines of ``model`` on a 2-device CPU pool under verl-split."""
    pipes = [probe_spec(model, 1, 4, name=f"probe-{i}", steps=steps, max_response_tokens=16)
             .model_dump(exclude_unset=True) for i in range(2)]
    return validate_config({"name": "stage-gap-probe", "seed": seed,
                            "cluster": {"accelerator": "cpu-worker", "num_nodes": 1,
                                        "accelerators_per_node": 2},
                            "scheduler": {"name": "verl-split"}, "pipelines": pipes},
                           source="stage-gap probe")


def stage_gaps(events: Sequence[Event]) -> dict[str, list[float]]:
    """Seconds from each stage's last span to the next stage's first span of the same pipeline,
    per transition (``"rollout->reward"``, ...; a step's weight sync to the next step's
    rollout included). A rollout is its bands' spans from the first to the last; overlapping
    stages (none in a sync run) give no gap."""
    spans: dict[tuple[str, int, str], list[float]] = {}
    for e in events:
        if not isinstance(e, Span):
            continue
        stage = str(Stage.ROLLOUT) if e.stage in ROLLOUT_BANDS else str(e.stage)
        got = spans.setdefault((e.pipeline, e.step, stage), [e.start_s, e.end_s])
        got[0], got[1] = min(got[0], e.start_s), max(got[1], e.end_s)
    by_pipe: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for (pipe, _, stage), (start, end) in spans.items():
        by_pipe[pipe].append((start, end, stage))
    gaps: dict[str, list[float]] = defaultdict(list)
    for seq in by_pipe.values():
        seq.sort()
        for (_, end, a), (start, _, b) in zip(seq, seq[1:], strict=False):
            if start >= end:
                gaps[f"{a}->{b}"].append(start - end)
    return dict(gaps)


def gap_summary(events: Sequence[Event]) -> dict[str, Any] | None:
    """``{"gap_s": median, "transitions": n, "by_transition": {name: median}}`` of a run's
    stage transitions (:func:`stage_gaps`), and ``weight_sync_s``: the median of its steps'
    weight syncs, from the driver's call to the result back (``StepFinished.timings_s``; absent
    when no step timed one); None when it had no transition."""
    gaps = stage_gaps(events)
    flat = [g for gs in gaps.values() for g in gs]
    if not flat:
        return None
    out: dict[str, Any] = {
        "gap_s": statistics.median(flat), "transitions": len(flat),
        "by_transition": {k: statistics.median(v) for k, v in sorted(gaps.items())}}
    syncs = [e.timings_s[SYNC_TIMING] for e in events
             if isinstance(e, StepFinished) and e.timings_s.get(SYNC_TIMING)]
    if syncs:
        out["weight_sync_s"] = statistics.median(syncs)
    return out


def measure_probe(model: str, seed: int = 0
                  ) -> tuple[dict[str, Any] | None, dict[str, float] | None]:
    """Run the probe (module docstring) and return its stage gap (:func:`gap_summary`) and the
    host's load beside its workers from its first finished step to its last
    (:mod:`jigsawrl.experiments.hostload`: ``load_cores``, ``worker_cores``, ``seconds``, and
    the host's ``cores``); each None when not measured (no Ray or engine installed, no
    transition, not Linux)."""
    try:
        from jigsawrl.experiments.real import run_real
    except ImportError as exc:  # pragma: no cover - the real extras are installed in CI
        log.warning("stage gap and host load not profiled (%s)", exc)
        return None, None
    steps: list[float] = []
    with HostSampler() as sampler:
        _, events = run_real(probe_config(model, seed),
                             on_progress=lambda done, total: steps.append(time.perf_counter()))
    gap = gap_summary(events)
    if gap is None:
        log.warning("stage gap not profiled: the probe run produced no stage transitions")
    else:
        log.info("stage gap: %.1f ms median over %d transitions", 1e3 * gap["gap_s"],
                 gap["transitions"])
    load = sampler.result(steps[0], steps[-1]) if len(steps) >= 2 else None
    if load is not None:
        load["cores"] = float(host_cores())
        log.info("host load beside the workers: %.2f of %g cores", load["load_cores"],
                 load["cores"])
    return gap, load
