"""Side-by-side comparison of policies on one config (``jigsawrl compare``).

Every policy runs on the same sampled workload (same seeds), so ratios are measured in one run,
as DESIGN.md §6 asks. Each seed's solo-latency reference is computed once and shared.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jigsawrl.config import ExperimentConfig
from jigsawrl.errors import ConfigError
from jigsawrl.runner import simulate, solo_latencies
from jigsawrl.scheduler import list_policies

# Summary fields averaged over seeds (with their spread) for the comparison table.
NUMERIC_FIELDS = ("throughput_tokens_per_s", "makespan_s", "busy_fraction", "mfu",
                  "cost_per_million_tokens_usd", "mean_latency_vs_solo", "efficiency")


@dataclass(slots=True)
class CompareResult:
    policies: list[str]
    seeds: list[int]
    baseline: str
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # policy -> summaries

    @property
    def mean_summaries(self) -> dict[str, dict[str, Any]]:
        return {p: _mean_summary(s) for p, s in self.runs.items()}

    def ratios(self) -> dict[str, dict[str, float]]:
        """Throughput ratio of every policy to every other, from per-seed means."""
        means = {p: s["throughput_tokens_per_s"] for p, s in self.mean_summaries.items()}
        return {p: {q: means[p] / means[q] for q in means if means[q]} for p in means}

    def to_json(self) -> dict[str, Any]:
        return {"policies": self.policies, "seeds": self.seeds, "baseline": self.baseline,
                "runs": self.runs, "mean": self.mean_summaries, "throughput_ratios": self.ratios()}


def compare_policies(cfg: ExperimentConfig, policies: list[str], *, seeds: int = 1,
                     on_run: Callable[[], None] | None = None,
                     baseline: str | None = None) -> CompareResult:
    """Simulate each policy for seeds ``cfg.seed .. cfg.seed + seeds - 1``.

    Raises:
        ConfigError: an unknown policy name or baseline.
    """
    known = set(list_policies())
    for p in policies:
        if p not in known:
            raise ConfigError(f"unknown policy {p!r}", where="--policies",
                              fix=f"use names from: {', '.join(sorted(known))}")
    if not policies:
        raise ConfigError("no policies given", where="--policies", fix="e.g. verl,jigsaw")
    base = baseline or ("verl" if "verl" in policies else policies[-1])
    if base not in policies:
        raise ConfigError(f"baseline {base!r} is not among the policies", where="--baseline")
    seed_list = [cfg.seed + i for i in range(seeds)]
    result = CompareResult(list(policies), seed_list, base)
    for seed in seed_list:
        solo = solo_latencies(cfg, seed)
        for p in policies:
            run = simulate(cfg, policy=p, seed=seed, solo=solo)
            result.runs.setdefault(p, []).append(run.summary)
            if on_run is not None:
                on_run()
    return result


def _mean_summary(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(summaries[-1])
    for key in NUMERIC_FIELDS:
        vals = [s[key] for s in summaries if isinstance(s.get(key), int | float)]
        if vals:
            out[key] = statistics.fmean(vals)
            out[f"{key}_std"] = statistics.pstdev(vals) if len(vals) > 1 else 0.0
    out["seeds"] = len(summaries)
    return out
