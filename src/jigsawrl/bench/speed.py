"""Benchmarks of jigsawrl itself (``jigsawrl bench ...``); results go to docs/BENCHMARKS.md.

:func:`sim_speed` times one policy's simulation of a config (``--policy``, ``--steps``,
``--param`` override the config's); :func:`sim_scaling` times it over pool sizes, the pipelines
and steps growing with the pool, to show how the cost grows (issue 11: no faster than devices ×
steps). Wall times are this machine's and depend on its load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from jigsawrl.config import ExperimentConfig, load_config, validate_config
from jigsawrl.errors import ConfigError
from jigsawrl.experiments.core import make_policy
from jigsawrl.experiments.resolve import check_policy, resolve
from jigsawrl.experiments.simulated import run_once


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` scheduler params (VALUE read as YAML: ``fallback=false``, ``depth=0``).

    Raises:
        ConfigError: an item without ``=`` or without a key.
    """
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param {item!r} is not KEY=VALUE", where="--param",
                              fix="e.g. --param fallback=false")
        params[key.strip()] = yaml.safe_load(value)
    return params


def _overrides(path: Path, steps: int | None) -> list[str]:
    if steps is None:
        return []
    raw = yaml.safe_load(path.read_text()) or {}
    return [f"pipelines.{i}.steps={steps}" for i in range(len(raw.get("pipelines", [])))]


def sim_speed(config: Path | ExperimentConfig, repeats: int = 3, *, policy: str | None = None,
              steps: int | None = None,
              params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Wall time of simulating ``config`` (no solo runs, no file output) under ``policy``
    (default: the config's; the first of its variants), with every pipeline's ``steps`` and
    the scheduler ``params`` overridden when given.

    Raises:
        ConfigError: an unknown policy, params it does not take, or an infeasible config.
    """
    if isinstance(config, ExperimentConfig):
        cfg = config
        if steps is not None:
            raw = cfg.model_dump()
            for p in raw["pipelines"]:
                p["steps"] = steps
            cfg = validate_config(raw, source="sim-speed")
    else:
        cfg = load_config(config, overrides=_overrides(Path(config), steps))
    exp = resolve(cfg)
    name = check_policy(policy or cfg.scheduler.name, "--policy")
    walls: list[float] = []
    events = decisions = 0
    makespan = 0.0
    for _ in range(repeats):
        pol = make_policy(cfg, name, params if params else None).variants()[0]
        t0 = time.perf_counter()
        res = run_once(exp, pol, cfg.seed)
        walls.append(time.perf_counter() - t0)
        events, decisions, makespan = len(res.events), len(res.decision_times_s), res.makespan_s
    return {"policy": name, "devices": exp.num_devices, "pipelines": len(exp.pipelines),
            "steps": sum(p.spec.steps for p in exp.pipelines), "events": events,
            "decisions": decisions, "makespan_s": makespan,
            "best_s": min(walls), "median_s": statistics.median(walls)}


# (devices, pipelines) of the scaling sweep: 32 devices per pipeline, each pipeline's batch
# sized to 8 requests per device (2 prompts x group 4), so that the work grows as the pool.
SCALING_SIZES: tuple[tuple[int, int], ...] = ((16, 1), (64, 2), (128, 4), (256, 8), (512, 16))


def sim_scaling(policy: str, sizes: Sequence[tuple[int, int]] = SCALING_SIZES, *,
                steps: int = 4, repeats: int = 1,
                params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """:func:`sim_speed` at each (devices, pipelines) of ``bench decide``'s mixed Qwen3-4B
    configs (batch ``2 * devices / pipelines`` prompts x 4, ``steps`` steps each); each row
    adds the best wall time per device-step (ms): flat when the cost grows as devices x steps."""
    from jigsawrl.bench.decide import decide_config

    rows = []
    for devices, pipelines in sizes:
        cfg = decide_config(devices, pipelines, steps=steps,
                            batch_size=max(1, 2 * devices // pipelines))
        row = sim_speed(cfg, repeats, policy=policy, params=params)
        row["ms_per_device_step"] = 1000.0 * row["best_s"] / (devices * steps)
        rows.append(row)
    return rows
