"""``jigsawrl bench real``: several real pipelines under each policy, measured and predicted.

What: :func:`run_bench_real` runs one real multi-pipeline config (``configs/real/bench.yaml``:
``countdown``, ``calculator`` with a tool latency, ``search``) on the local pool once per policy
— ``verl-serial``, ``verl-split``, ``greedy``, ``jigsaw`` by default, same config, same seed —
through :func:`jigsawrl.experiments.real.run_real`, and for each run asks :mod:`jigsawrl.experiments.calibrate` for the
simulator's prediction of it (the same workload replayed, the machine's profile as cost model).
The result is a :class:`~jigsawrl.experiments.compare.CompareResult` (``compare.json`` in the shape of
``jigsawrl compare``), each summary carrying its prediction under ``"predicted"``.

Definitions (said here because the table is read against them):

- *alone*: a pipeline's mean step latency in the ``verl-serial`` run. verl-serial runs each
  pipeline alone on the whole pool, one after the other, so its step latencies are the
  pipelines' solo latencies on this pool (the simulator's ``solo_latencies`` uses verl on the
  whole pool too). Every run's ``latency_vs_solo`` is taken against it.
- *verl*: the better (by finished tokens/s) of ``verl-split`` and ``verl-serial``, the
  project's definition of the verl baseline (DESIGN.md §6; ``runner.simulate`` does the same).
  A placement that cannot hold the config (three pipelines on two devices leave ``verl-split``
  without a device each) is skipped with its reason, before any real run starts.
- *skipped*: a policy that cannot place the workload (the dry run above) or whose real run
  fails is reported with its reason — in ``compare.json`` under ``skipped``, as a row of the
  table and in the notes — and the others are compared. Only when no policy runs is the bench
  an error. A bad config is an error before any policy runs.
- Ray start-up and warm starts are excluded from every makespan (``run_real`` measures them as
  ``startup_s``); the bench's wall time includes them.

Why: ROADMAP item 6 — the number that matters is jigsaw's gain over verl on *real* pipelines, and
whether the simulator that claims the larger gains predicts these runs.

``ray`` and ``torch`` are imported only by ``run_real``; library code logs, the CLI prints.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jigsawrl.config import ExperimentConfig, dump_config, load_config
from jigsawrl.errors import ConfigError, JigsawError
from jigsawrl.experiments.calibrate import Calibration, calibrate, simulate_replay, truth_cost
from jigsawrl.experiments.compare import CANNOT_RUN, CompareResult, write_compare

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path("configs/real/bench.yaml")
DEFAULT_PROFILE = Path("profiles/cpu.yaml")
POLICIES: tuple[str, ...] = ("verl-serial", "verl-split", "greedy", "jigsaw")
VERL_VARIANTS: tuple[str, ...] = ("verl-split", "verl-serial")
ALONE_POLICY = "verl-serial"
# --quick: the same pipelines for fewer steps (the bench's wall time is mostly Ray start-ups
# and the pipeline actors' imports, ~30-40 s per policy on a 2-core machine).
QUICK_STEPS = 3

OnRun = Callable[[str, dict[str, Any] | None, str | None], None]


@dataclass(frozen=True, slots=True)
class BenchRealSpec:
    """What ``jigsawrl bench real`` runs.

    Args:
        config: the real multi-pipeline config.
        quick: run every pipeline for :data:`QUICK_STEPS` steps.
        policies: policies to run (each once); ``verl`` is derived, not run.
        profile: the machine profile for the predictions (None: the built-in preset).
        overrides: ``key.path=value`` overrides applied after ``quick``.
        out_dir: write ``compare.json``, ``compare.png`` and a run folder per policy there.
        threads_per_device: torch threads one logical device maps to.
        cache_dir: warm-start cache (None: the engine's default, ``~/.cache/jigsawrl``).
    """

    config: Path = DEFAULT_CONFIG
    quick: bool = False
    policies: tuple[str, ...] = POLICIES
    profile: Path | None = None
    overrides: tuple[str, ...] = ()
    out_dir: Path | None = None
    threads_per_device: int = 1
    cache_dir: Path | None = None

    def load(self) -> ExperimentConfig:
        """The config with the quick and user overrides applied (raises ConfigError)."""
        base = load_config(self.config)
        quick = [f"pipelines.{i}.steps={QUICK_STEPS}" for i in range(len(base.pipelines))]
        return load_config(self.config, [*(quick if self.quick else []), *self.overrides])


@dataclass(slots=True)
class BenchRealResult:
    """Everything one bench produced; ``compare`` is what ``compare.json`` holds."""

    config: ExperimentConfig
    compare: CompareResult
    calibrations: dict[str, Calibration] = field(default_factory=dict)
    alone_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    profile: str | None = None
    # The machine's 1-minute load average before and after the bench: real timings on a shared
    # machine are only as good as its quiet (recorded, not corrected for).
    load_average: tuple[float | None, float | None] = (None, None)

    @property
    def summaries(self) -> dict[str, dict[str, Any]]:
        return {p: self.compare.runs[p][0] for p in self.compare.policies
                if p in self.compare.runs}

    def ratio(self, policy: str, base: str = "verl") -> float | None:
        """Measured tokens/s of ``policy`` over ``base``'s (None if either did not run)."""
        s = self.summaries
        if policy not in s or base not in s or not s[base].get("throughput_tokens_per_s"):
            return None
        return s[policy]["throughput_tokens_per_s"] / s[base]["throughput_tokens_per_s"]


def feasibility(cfg: ExperimentConfig, policy: str) -> str | None:
    """Why ``policy`` cannot place ``cfg`` (None if it can), from a simulated dry run.

    The dry run uses the real run's resolved experiment with its neutral stub workload and the
    built-in cost model, so it costs milliseconds and no Ray start-up.
    """
    from jigsawrl.experiments.resolve import resolve_real

    try:
        exp = resolve_real(cfg)
        simulate_replay(exp, policy, truth_cost(exp, None))
    except CANNOT_RUN as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def run_bench_real(spec: BenchRealSpec, *, on_run: OnRun | None = None) -> BenchRealResult:
    """Run the bench (see the module docstring).

    Args:
        spec: what to run.
        on_run: called after each policy with ``(policy, summary or None, why skipped)``.

    Raises:
        ConfigError: a bad config (schema, presets, request budget), an unknown policy, or a
            profile that cannot be read — before any real run.
        JigsawError: no policy could run at all (with every policy's reason).
    """
    from jigsawrl.experiments.resolve import resolve_real

    t0, load0 = time.monotonic(), _load()
    cfg = spec.load()
    _check_policies(spec.policies)
    resolve_real(cfg)  # a bad config is an error of the config, not a skip of every policy
    profile = _profile_path(spec.profile)
    result = BenchRealResult(cfg, CompareResult([], [cfg.seed], "verl"), profile=profile)
    ordered = sorted(spec.policies, key=lambda p: p != ALONE_POLICY)  # alone first
    for policy in ordered:
        summary, why = _run_policy(spec, cfg, policy, profile, result)
        if summary is None:
            result.compare.skipped[policy] = why or "did not run"
        else:
            result.compare.runs[policy] = [summary]
        if on_run is not None:
            on_run(policy, summary, why)
    if not result.compare.runs:
        raise JigsawError("no policy could run:\n  " + "\n  ".join(
            f"{p}: " + "; ".join(x.strip() for x in w.splitlines() if x.strip())
            for p, w in result.compare.skipped.items()), where="--policies",
            fix="add a policy that can place the pipelines, or change the config")
    _relate(result, spec.policies)
    result.wall_s = time.monotonic() - t0
    result.load_average = (load0, _load())
    if spec.out_dir is not None:
        write_bench(spec.out_dir, result)
    return result


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _check_policies(policies: Sequence[str]) -> None:
    from jigsawrl.scheduler import list_policies

    known = set(list_policies())
    for p in policies:
        if p not in known or p == "verl":
            raise ConfigError(f"{p!r} is not a policy bench real runs", where="--policies",
                              fix="use single-placement names, e.g. verl-split,verl-serial,"
                                  "greedy,jigsaw (verl is derived from the two verl runs)")
    if not policies:
        raise ConfigError("no policies given", where="--policies", fix="e.g. verl-serial,jigsaw")


def _profile_path(profile: Path | None) -> str | None:
    """The profile to predict with: the given one, else profiles/cpu.yaml if present."""
    if profile is not None:
        from jigsawrl.costmodel.profile import load_profile

        load_profile(profile)  # fail early (InputError) on a bad file, before any real run
        return str(profile)
    if DEFAULT_PROFILE.is_file():
        return str(DEFAULT_PROFILE)
    log.warning("no profile (%s): predictions use the built-in, unmeasured cpu-worker preset; "
                "measure one with `jigsawrl profile --threads 1 --out %s`", DEFAULT_PROFILE,
                DEFAULT_PROFILE)
    return None


def _run_policy(spec: BenchRealSpec, cfg: ExperimentConfig, policy: str, profile: str | None,
                result: BenchRealResult) -> tuple[dict[str, Any] | None, str | None]:
    """One real run and its prediction; ``(None, why)`` when the policy cannot or did not run."""
    from jigsawrl.experiments.real import run_real

    why = feasibility(cfg, policy)
    if why is not None:
        log.info("skipping %s: %s", policy, why)
        return None, why
    out = spec.out_dir / policy if spec.out_dir is not None else None
    try:
        summary, events = run_real(cfg, policy=policy, out_dir=out, cache_dir=spec.cache_dir,
                                   threads_per_device=spec.threads_per_device)
    except Exception as exc:  # noqa: BLE001 - one failed policy must not lose the others
        # The reason is reported (skipped); the traceback only with --verbose.
        log.warning("real run under %s failed: %s: %s", policy, type(exc).__name__, exc)
        log.debug("real run under %s failed", policy, exc_info=True)
        return None, f"{type(exc).__name__}: {exc}"
    try:
        cal = calibrate(cfg, events, policy, profile=profile, measured=summary)
    except JigsawError as exc:
        log.warning("no prediction for %s: %s", policy, exc)
        summary["predicted"] = None
        return summary, None
    result.calibrations[policy] = cal
    summary["predicted"] = {**cal.to_json(), "summary": _headline(cal.sim_summary)}
    return summary, None


def _headline(s: dict[str, Any]) -> dict[str, Any]:
    """The predicted summary's headline numbers (the full one is in the calibration)."""
    keys = ("makespan_s", "throughput_tokens_per_s", "busy_fraction", "samples", "tokens")
    return {**{k: s.get(k) for k in keys}, "pipelines": [
        {k: p.get(k) for k in ("name", "mean_step_latency_s", "tokens_per_s", "steps")}
        for p in s.get("pipelines", [])]}


def _relate(result: BenchRealResult, policies: Sequence[str]) -> None:
    """Fill latency vs alone (measured and predicted) and the derived ``verl`` entry."""
    runs = result.compare.runs
    alone = runs.get(ALONE_POLICY, [None])[0]
    if alone is not None:
        result.alone_s = {p["name"]: p["mean_step_latency_s"] for p in alone["pipelines"]
                          if p.get("mean_step_latency_s")}
        pred_alone = result.calibrations.get(ALONE_POLICY)
        for policy, (s,) in runs.items():
            _vs_alone(s, result.alone_s)
            cal = result.calibrations.get(policy)
            if cal is not None and pred_alone is not None:
                s["predicted"]["mean_latency_vs_solo"] = _mean_vs(
                    cal.sim_summary, _step_lat(pred_alone.sim_summary))
    verl = [v for v in VERL_VARIANTS if v in runs]
    if verl:
        best = max(verl, key=lambda v: runs[v][0].get("throughput_tokens_per_s") or 0.0)
        runs["verl"] = [{**runs[best][0], "policy": "verl", "variant": best}]
    order = [p for p in (*VERL_VARIANTS, "verl", *policies) if p in runs]
    result.compare.policies = list(dict.fromkeys(order))
    if "verl" not in runs:
        result.compare.baseline = result.compare.policies[0]


def _step_lat(summary: dict[str, Any]) -> dict[str, float]:
    return {p["name"]: p["mean_step_latency_s"] for p in summary.get("pipelines", [])
            if p.get("mean_step_latency_s")}


def _vs_alone(summary: dict[str, Any], alone: dict[str, float]) -> None:
    for p in summary["pipelines"]:
        solo, lat = alone.get(p["name"]), p.get("mean_step_latency_s")
        p["latency_vs_solo"] = lat / solo if solo and lat is not None else None
    summary["mean_latency_vs_solo"] = _mean_vs(summary, alone)


def _mean_vs(summary: dict[str, Any], alone: dict[str, float]) -> float | None:
    ratios = [lat / alone[name] for name, lat in _step_lat(summary).items() if alone.get(name)]
    return sum(ratios) / len(ratios) if ratios else None


def write_bench(out_dir: Path, result: BenchRealResult) -> list[Path]:
    """Write ``compare.json`` (+ ``compare.png``) and each policy's ``calibration.json`` and
    predicted ``summary.json`` (``<policy>/predicted/summary.json``); the run folders themselves
    were written by ``run_real``. Returns the files written."""
    out_dir = Path(out_dir)
    written = write_compare(out_dir, result.compare, config_yaml=dump_config(result.config),
                            title="real pipelines on this CPU (measured)", highlight="jigsaw")
    for policy, cal in result.calibrations.items():
        folder = out_dir / policy
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "calibration.json").write_text(json.dumps(cal.to_json(), indent=1))
        (folder / "summary.json").write_text(
            json.dumps(result.compare.runs[policy][0], indent=1))
        written += [folder / "calibration.json", folder / "summary.json"]
    meta = {"wall_s": result.wall_s, "profile": result.profile, "alone_s": result.alone_s,
            "jigsaw_vs_verl": result.ratio("jigsaw"), "load_average": result.load_average}
    (out_dir / "bench_real.json").write_text(json.dumps(meta, indent=1))
    return [*written, out_dir / "bench_real.json"]
