"""What each mechanism is worth, read off ablation groups (``bench/paper_mechanisms.py``).

Groups are built from hand-set summaries (no simulation): the pairing of variants that differ in
one parameter, the worth ratio, and the verdict lines — a mechanism that changed nothing names
its reason to stay, or is called a candidate for removal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jigsawrl.bench.paper_matrix import BenchGroup, GroupResult
from jigsawrl.bench.paper_mechanisms import (
    WHY_IT_STAYS,
    changed_nothing,
    group_effects,
    lookahead_lines,
    mechanism_lines,
)
from jigsawrl.config import ExperimentConfig
from jigsawrl.experiments.compare import CompareResult

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "own": ("jigsaw", {"fallback": False}),
    "own-fair": ("jigsaw", {"fallback": False, "plan_widths": False}),
    "own-d0": ("jigsaw", {"fallback": False, "depth": 0}),
    "own-tp": ("jigsaw", {"fallback": False, "tp_search": False}),
    "own-tp-fair": ("jigsaw", {"fallback": False, "tp_search": False, "plan_widths": False}),
    "own-d2": ("jigsaw", {"fallback": False, "depth": 2}),  # with own-d0 both set depth: no pair
    "own-col": ("jigsaw", {"fallback": False, "max_colocated": 2}),  # no reason recorded
    "mem": ("verl-split", {"gpu_memory_utilization": 0.7}),  # another policy: not read
}


def _group(tput: dict[str, float], name: str = "ablation-x", section: str = "ablation"
           ) -> GroupResult:
    labels = list(tput)
    grp = BenchGroup(name, Path(f"{name}.yaml"), section, name, False,
                     ExperimentConfig.model_construct(), tuple(labels),
                     {k: v for k, v in VARIANTS.items() if k in tput}, "jigsaw", "verl")
    runs = {k: [{"throughput_tokens_per_s": v}] for k, v in tput.items()}
    return GroupResult(grp, grp.config, CompareResult(labels, [0], "verl", runs=runs), {}, 1.0)


def test_pairs_differ_in_one_parameter_and_worth_is_reference_over_variant() -> None:
    g = _group({"verl": 50.0, "jigsaw": 100.0, "own": 100.0, "own-fair": 80.0, "own-d0": 100.0,
                "own-tp": 90.0, "own-tp-fair": 60.0, "own-d2": 100.0, "mem": 10.0})
    got = {(e.param, e.variant, e.reference): e.worth for e in group_effects(g)}
    assert got == {
        ("fallback", "own", "jigsaw"): 1.0,
        ("plan_widths", "own-fair", "own"): pytest.approx(1.25),
        ("depth", "own-d0", "own"): 1.0,
        ("depth", "own-d2", "own"): 1.0,
        ("tp_search", "own-tp", "own"): pytest.approx(100 / 90),
        ("plan_widths", "own-tp-fair", "own-tp"): pytest.approx(1.5),
        ("tp_search", "own-tp-fair", "own-fair"): pytest.approx(80 / 60),  # at fair widths
    }


def test_verdicts_name_the_reason_to_stay_or_a_candidate_for_removal() -> None:
    g = _group({"verl": 50.0, "jigsaw": 100.0, "own": 100.0, "own-fair": 80.0, "own-d0": 100.2,
                "own-col": 100.0})
    text = "\n".join(mechanism_lines([g, _group({"verl": 1.0, "jigsaw": 2.0}, "sync-y", "sync")]))
    assert "## What each mechanism is worth" in text
    depth = next(line for line in text.splitlines() if line.startswith("- `depth`"))
    assert "changed nothing" in depth and WHY_IT_STAYS["depth"][:40] in depth
    colocated = next(line for line in text.splitlines() if line.startswith("- `max_colocated`"))
    assert "candidate for removal" in colocated  # no reason recorded for it
    widths = next(line for line in text.splitlines() if line.startswith("- `plan_widths`"))
    assert "1.250×" in widths and "changed nothing" not in widths
    assert "sync-y" not in text  # only ablation groups are read


def test_changed_nothing_needs_every_comparison_within_the_margin() -> None:
    g1 = _group({"verl": 1.0, "jigsaw": 100.0, "own": 100.0, "own-d0": 100.0})
    g2 = _group({"verl": 1.0, "jigsaw": 100.0, "own": 100.0, "own-d0": 97.0}, "ablation-z")
    depth = [e for g in (g1, g2) for e in group_effects(g) if e.param == "depth"]
    assert not changed_nothing(depth)
    assert changed_nothing(depth[:1])
    assert not changed_nothing([])
    assert mechanism_lines([_group({"verl": 1.0}, "ablation-empty")]) == []


def test_the_lookahead_table_sums_the_leads_choices_over_seeds() -> None:
    """Issue 11 item 3's report: the lead's look-ahead stats summed over seeds, beside the
    lead's tokens/s over greedy's (– where the group did not run greedy)."""
    g = _group({"verl": 1.0, "jigsaw": 2.0, "greedy": 1.6}, "sync-y", "sync")
    la = {"decisions": 10, "with_choice": 7, "differed": 2, "deferred": 1}
    assert g.result is not None
    g.result.runs["jigsaw"] = [{"throughput_tokens_per_s": 2.0, "policy_report": {"lookahead": la}}
                               for _ in range(2)]
    text = "\n".join(lookahead_lines([g]))
    assert "| sync-y | 20 | 14 | 4 | 2 | 1.250× |" in text
    assert lookahead_lines([_group({"verl": 1.0, "jigsaw": 2.0}, "sync-z", "sync")]) == []
