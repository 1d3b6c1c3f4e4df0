"""Benchmarks of jigsawrl itself (``jigsawrl bench ...``); results go to docs/BENCHMARKS.md."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from jigsawrl.config import load_config
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import run_once
from jigsawrl.scheduler import get_policy


def sim_speed(config: Path, repeats: int = 3) -> dict[str, Any]:
    """Wall time of simulating ``config`` (policy as configured; no solo runs, no file output)."""
    cfg = load_config(config)
    exp = resolve(cfg)
    walls: list[float] = []
    events = 0
    for _ in range(repeats):
        pol = get_policy(cfg.scheduler.name, cfg.scheduler.params)
        pol = pol.variants()[0]
        t0 = time.perf_counter()
        res = run_once(exp, pol, cfg.seed)
        walls.append(time.perf_counter() - t0)
        events = len(res.events)
    return {"devices": exp.num_devices, "pipelines": len(exp.pipelines),
            "steps": sum(p.spec.steps for p in exp.pipelines), "events": events,
            "best_s": min(walls), "median_s": statistics.median(walls)}
