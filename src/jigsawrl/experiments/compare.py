"""Side-by-side comparison of policies on one config (``jigsawrl compare``).

Every policy runs on the same sampled workload (same seeds), so ratios are measured in one run,
as DESIGN.md §6 asks. Each seed's solo-latency reference is computed once and shared.

A compared entry is a *label*: a registered policy name, or a label mapped by ``variants`` to a
policy and its params (``{"jigsaw-depth0": ("jigsaw", {"depth": 0})}``, for ablations). With
``keep_events`` the first seed's :class:`~jigsawrl.experiments.simulated.SimRun` of each label is kept in
``CompareResult.first_runs`` (for timelines); it is not part of ``to_json``.

A comparison degrades, it never aborts: a policy that cannot run the workload (it cannot place it
in memory, asks the pool for the impossible, or stalls) is *skipped* with its reason
(``CompareResult.skipped``, ``compare.json["skipped"]``) and the others are compared; if it was
the baseline, the first policy left becomes the baseline. Only when no policy can run is it an
error. A bad config is an error before any policy runs (it is resolved first).
"""

from __future__ import annotations

import difflib
import json
import logging
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jigsawrl.config import ExperimentConfig, SchedulerSpec
from jigsawrl.driver.loop import SchedulerStalled
from jigsawrl.driver.state import InvariantError
from jigsawrl.errors import ConfigError
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import SimRun, simulate, solo_latencies
from jigsawrl.scheduler import list_policies

log = logging.getLogger(__name__)

# label -> (registered policy name, its scheduler params)
Variants = Mapping[str, tuple[str, Mapping[str, Any]]]

# What a policy that cannot run a workload raises: it cannot place it (memory, devices), it asked
# the pool for the impossible, or it started nothing while nothing ran.
CANNOT_RUN: tuple[type[Exception], ...] = (ConfigError, InvariantError, SchedulerStalled)

# Summary fields averaged over seeds (with their spread) for the comparison table.
NUMERIC_FIELDS = ("throughput_tokens_per_s", "makespan_s", "busy_fraction", "mfu",
                  "cost_per_million_tokens_usd", "mean_latency_vs_solo", "efficiency")


@dataclass(slots=True)
class CompareResult:
    policies: list[str]
    seeds: list[int]
    baseline: str
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # policy -> summaries
    first_runs: dict[str, SimRun] = field(default_factory=dict)  # with keep_events only
    skipped: dict[str, str] = field(default_factory=dict)  # label -> why it could not run
    requested_baseline: str | None = None  # set when the requested baseline was skipped
    notes: list[str] = field(default_factory=list)  # e.g. no solo reference

    @property
    def mean_summaries(self) -> dict[str, dict[str, Any]]:
        return {p: _mean_summary(s) for p, s in self.runs.items()}

    def ratios(self) -> dict[str, dict[str, float]]:
        """Throughput ratio of every policy to every other, from per-seed means."""
        means = {p: s["throughput_tokens_per_s"] for p, s in self.mean_summaries.items()}
        return {p: {q: means[p] / means[q] for q in means if means[q]} for p in means}

    def to_json(self) -> dict[str, Any]:
        return {"policies": self.policies, "seeds": self.seeds, "baseline": self.baseline,
                "runs": self.runs, "mean": self.mean_summaries, "throughput_ratios": self.ratios(),
                **({"skipped": self.skipped} if self.skipped else {}),
                **({"requested_baseline": self.requested_baseline}
                   if self.requested_baseline else {}),
                **({"notes": self.notes} if self.notes else {})}


def compare_policies(cfg: ExperimentConfig, policies: list[str], *, seeds: int = 1,
                     on_run: Callable[[], None] | None = None,
                     baseline: str | None = None, keep_events: bool = False,
                     variants: Variants | None = None,
                     skip_failed: bool = True) -> CompareResult:
    """Simulate each policy (label) for seeds ``cfg.seed .. cfg.seed + seeds - 1``.

    Args:
        keep_events: keep each label's first-seed run (events included) in ``first_runs``.
        variants: labels that stand for a registered policy with params.
        skip_failed: a label whose run raises one of :data:`CANNOT_RUN` (e.g. it does not fit
            in memory, or asked the pool for the impossible) is dropped with a logged warning
            and its reason kept in ``skipped``; a skipped baseline is replaced by the first
            label left (``requested_baseline`` keeps the asked one). False: the error propagates.

    Raises:
        ConfigError: an unknown policy name or baseline, a config that does not resolve, or
            (``skip_failed``) no policy could run — with every policy's reason.
    """
    variants = variants or {}
    _check_labels(policies, variants)
    base = baseline or ("verl" if "verl" in policies else policies[-1])
    if base not in policies:
        raise ConfigError(f"baseline {base!r} is not among the policies", where="--baseline",
                          fix=f"use one of: {', '.join(policies)}")
    resolve(cfg)  # a bad config is an error of the config, not a skip of every policy
    seed_list = [cfg.seed + i for i in range(seeds)]
    result = CompareResult(list(policies), seed_list, base)
    for seed in seed_list:
        solo = _solo(cfg, seed, result)
        for p in list(result.policies):
            try:
                run = _simulate_label(cfg, p, variants, seed, solo)
            except CANNOT_RUN as exc:
                if not skip_failed:
                    raise
                _skip(result, p, exc)
                continue
            result.runs.setdefault(p, []).append(run.summary)
            if keep_events and p not in result.first_runs:
                result.first_runs[p] = run
            if on_run is not None:
                on_run()
    if not result.policies:
        raise ConfigError("no policy can run this workload:\n  " + "\n  ".join(
            f"{p}: {_one_line(why)}" for p, why in result.skipped.items()), where="--policies",
            fix="add a policy that can place it, or change the config (e.g. more devices)")
    return result


def _check_labels(policies: list[str], variants: Variants) -> None:
    """Every label names a registered policy (or a variant of one)."""
    if not policies:
        raise ConfigError("no policies given", where="--policies", fix="e.g. verl,jigsaw")
    known = set(list_policies())
    for p in policies:
        if variants.get(p, (p,))[0] not in known:
            close = difflib.get_close_matches(p, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"unknown policy {p!r}", where="--policies",
                              fix=f"{hint}use names from: {', '.join(sorted(known))}")


def _solo(cfg: ExperimentConfig, seed: int, result: CompareResult) -> dict[str, float] | bool:
    """Each pipeline's solo latency for ``seed``; False (no ×solo column) when it cannot run."""
    try:
        return solo_latencies(cfg, seed)
    except CANNOT_RUN as exc:
        note = f"no solo-latency reference (seed {seed}): {type(exc).__name__}: {exc}"
        log.info("%s", note)
        result.notes.append(note)
        return False


def _one_line(why: str) -> str:
    """A multi-line reason (message, then ``fix: ...``) on one line."""
    return "; ".join(x.strip() for x in why.splitlines() if x.strip())


def _skip(result: CompareResult, label: str, exc: Exception) -> None:
    """Drop ``label`` from the comparison, keeping why; re-pick the baseline if it was it."""
    log.info("skipping %s: %s: %s", label, type(exc).__name__, exc)  # the CLI prints it
    result.skipped[label] = f"{type(exc).__name__}: {exc}"
    result.policies.remove(label)
    result.runs.pop(label, None)
    result.first_runs.pop(label, None)
    if label == result.baseline and result.policies:
        result.requested_baseline = result.requested_baseline or label
        result.baseline = result.policies[0]


def _simulate_label(cfg: ExperimentConfig, label: str, variants: Variants, seed: int,
                    solo: dict[str, float] | bool) -> SimRun:
    if label not in variants:
        return simulate(cfg, policy=label, seed=seed, solo=solo)
    name, params = variants[label]
    cfg_v = cfg.model_copy(update={"scheduler": SchedulerSpec(name=name, params=dict(params))})
    run = simulate(cfg_v, policy=name, seed=seed, solo=solo)
    run.summary["label"] = label
    return run


def _mean_summary(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(summaries[-1])
    for key in NUMERIC_FIELDS:
        vals = [s[key] for s in summaries if isinstance(s.get(key), int | float)]
        if vals:
            out[key] = statistics.fmean(vals)
            out[f"{key}_std"] = statistics.pstdev(vals) if len(vals) > 1 else 0.0
    out["seeds"] = len(summaries)
    # a pipeline over its latency bound at any seed
    missed = {m for s in summaries for m in s.get("latency_bounds_missed") or ()}
    if missed or any("latency_bounds_missed" in s for s in summaries):
        out["latency_bounds_missed"] = sorted(missed)
    won = sorted({s["variant"] for s in summaries if s.get("variant")})
    if won:  # the placement that won (verl: split, serial, sized, a queue), per seed if they differ
        out["variant"] = "/".join(won)
    return out


def write_compare(out_dir: Path, result: CompareResult, *, config_yaml: str,
                  title: str = "policies compared", highlight: str | None = None,
                  plots: bool = True) -> list[Path]:
    """Write ``compare.json`` and (``plots``) ``compare.png`` and, for the labels whose first run
    was kept (``keep_events``), their run folders ``out_dir/<label>/`` with a timeline.

    Returns:
        the files and folders written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "compare.json"]
    written[0].write_text(json.dumps(result.to_json(), indent=1))
    if not plots:
        return written
    from jigsawrl.metrics.compare_plots import plot_compare, write_policy_runs  # matplotlib

    runs = {p: result.runs[p] for p in result.policies if p in result.runs}
    written.append(plot_compare(out_dir / "compare.png", runs, baseline=result.baseline,
                                title=title, highlight=highlight))
    first = {p: (r.events, r.summary, r.info) for p, r in result.first_runs.items()}
    written += write_policy_runs(out_dir, first, config_yaml=config_yaml)
    return written
