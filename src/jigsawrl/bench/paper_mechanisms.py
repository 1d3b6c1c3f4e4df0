"""What each of jigsaw's mechanisms is worth, read off the matrix's ablation groups (issue 11
item 7: a mechanism that changes nothing on any group is removed, or the report says why it
stays).

An ablation group's variants are the lead policy with some parameters changed. A variant that
differs from another run of the same group (the lead, or another variant) in exactly one
parameter measures that parameter: the mechanism's worth is the reference's tokens/s ÷ the
variant's (> 1: the setting the reference has is faster). So ``jigsaw-no-migration`` against
``jigsaw`` measures ``migration``, and ``jigsaw-no-tp-search-fair-widths`` against
``jigsaw-no-tp-search`` measures ``plan_widths`` at the config's rollout TP. A mechanism whose
every comparison on every group is within :data:`NOTHING` of 1 "changed nothing here"; the
report then prints why it stays (:data:`WHY_IT_STAYS`) or, without a recorded reason, that it
is a candidate for removal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jigsawrl.bench.paper_matrix import GroupResult

NOTHING = 0.005  # |ratio - 1| below this: the mechanism changed nothing on that comparison

# Why a mechanism that changed nothing on the ablation groups is kept (measured elsewhere;
# docs/BENCHMARKS.md names the runs). Keyed by jigsaw parameter.
WHY_IT_STAYS: dict[str, str] = {
    "fallback": (
        "the ablation groups run jigsaw's own plan either way; the fallback acts where a verl "
        "placement is predicted sooner (the memory-tight pairs, the real `bench real` pool, "
        "which runs verl-queue-2)"),
    "depth": (
        "the look-ahead's options are 'start the ready pass now' or 'wait' (one train state on "
        "the devices at a time); on every sync group starting now forecasts best, so it agrees "
        "with greedy to the digit; on the async groups its deferrals cost up to 2.7% against "
        "greedy until it was made to depart from greedy only on a forecast 5% better "
        "(lookahead.LA_MARGIN), after which it ties greedy everywhere measured; on the real "
        "pool, whose devices take turns, it does not offer to wait (its deferrals there cost "
        "6%: docs/BENCHMARKS.md, 'Shared prompts, consistent urgencies, serial placement'; "
        "'Real tasks' tool waits'). Kept as issue 11 item 3's search, whose candidate set is "
        "the open work (the train-state order by forecast was tried and lost: 'Latency bounds "
        "honoured'); it costs nothing but decision time"),
    "tail_logprobs": (
        "issue 11 item 4 asks for it as an option (off by default, exact: tested); it acts only "
        "where a sync rollout's drained ranks would idle: +2.7-3.0% at the config's rollout TP "
        "when measured on 2026-12-03 (docs/BENCHMARKS.md 'In-tail log-probs'), +0.1% on the "
        "same groups since the tail mechanisms changed (not re-explained)"),
}


@dataclass(frozen=True, slots=True)
class Effect:
    """One comparison: ``variant`` differs from ``reference`` only in ``param`` (set to
    ``value`` in the variant); ``worth`` = reference tokens/s ÷ variant tokens/s."""

    group: str
    param: str
    value: Any
    variant: str
    reference: str
    worth: float


def _settings(g: GroupResult) -> dict[str, dict[str, Any]]:
    """Every run of the group that is the lead's policy: label -> its parameters."""
    lead_policy, lead_params = g.group.policy_of(g.group.lead)
    out = {g.group.lead: dict(lead_params)}
    for label, (policy, params) in g.group.variants.items():
        if policy == lead_policy and label != g.group.lead:
            out[label] = dict(params)
    return out


def group_effects(g: GroupResult) -> list[Effect]:
    """Each one-parameter comparison among the group's runs of the lead policy."""
    if g.result is None:
        return []
    tput = {p: s.get("throughput_tokens_per_s") for p, s in g.result.mean_summaries.items()}
    settings = {k: v for k, v in _settings(g).items() if tput.get(k)}
    effects = []
    for label, params in settings.items():
        for ref, ref_params in settings.items():
            # the variant sets exactly one parameter more than the reference, which keeps its
            # default (pairs where both set it to different values are not read)
            extra = set(params) - set(ref_params)
            if len(extra) != 1 or any(params.get(k) != v for k, v in ref_params.items()):
                continue
            (param,) = extra
            effects.append(Effect(g.group.name, param, params[param], label, ref,
                                  tput[ref] / tput[label]))
    return sorted(effects, key=lambda e: (e.param, e.variant))


def mechanism_effects(groups: Iterable[GroupResult]) -> dict[str, list[Effect]]:
    """The ablation groups' comparisons, by parameter."""
    out: dict[str, list[Effect]] = {}
    for g in groups:
        if g.group.section != "ablation":
            continue
        for e in group_effects(g):
            out.setdefault(e.param, []).append(e)
    return out


def changed_nothing(effects: list[Effect]) -> bool:
    """True when every comparison of a mechanism is within :data:`NOTHING` of 1."""
    return bool(effects) and all(abs(e.worth - 1.0) < NOTHING for e in effects)


def mechanism_lines(groups: Iterable[GroupResult]) -> list[str]:
    """The report's section: a row per comparison, then the verdict per mechanism."""
    by_param = mechanism_effects(groups)
    if not by_param:
        return []
    lines = ["## What each mechanism is worth (ablation groups)", "",
             "Each row: a variant that differs from a reference run of its group in one "
             "parameter; worth = the reference's tokens/s ÷ the variant's (> 1: the reference's "
             "setting is faster).", "",
             "| parameter | variant (value) | reference | group | worth |",
             "|---|---|---|---|---:|"]
    for param, effects in sorted(by_param.items()):
        lines += [f"| `{param}` | {e.variant} ({e.value}) | {e.reference} | {e.group} | "
                  f"{e.worth:.3f}× |" for e in effects]
    lines.append("")
    for param, effects in sorted(by_param.items()):
        lo, hi = min(e.worth for e in effects), max(e.worth for e in effects)
        if changed_nothing(effects):
            why = WHY_IT_STAYS.get(param)
            verdict = (f"changed nothing on any comparison here (within {NOTHING:.1%}); "
                       + (f"why it stays: {why}." if why else
                          "no reason to keep it is recorded: a candidate for removal."))
        else:
            verdict = f"worth {lo:.3f}×–{hi:.3f}× over {len(effects)} comparisons."
        lines.append(f"- `{param}`: {verdict}")
    return lines + [""]


def lookahead_lines(groups: Iterable[GroupResult]) -> list[str]:
    """Issue 11 item 3's report of the look-ahead: per group, over its seeds, the lead's
    decisions that asked it, those with two or more options, those where it chose otherwise
    than ``greedy`` (its depth-0 ablation, the first candidate) and of these the deferrals —
    beside what that was worth (the lead's tokens/s ÷ greedy's, where the group ran greedy)."""
    rows = []
    for g in groups:
        if g.result is None or g.group.lead not in g.result.runs:
            continue
        stats = [((s.get("policy_report") or {}).get("lookahead") or {})
                 for s in g.result.runs[g.group.lead]]
        if not any(stats):
            continue
        total = {k: sum(int(st.get(k, 0)) for st in stats)
                 for k in ("decisions", "with_choice", "differed", "deferred")}
        worth = g.lead_ratios().get("greedy")
        rows.append(f"| {g.group.name} | {total['decisions']:,} | {total['with_choice']:,} | "
                    f"{total['differed']:,} | {total['deferred']:,} | "
                    f"{'–' if worth is None else f'{worth:.3f}×'} |")
    if not rows:
        return []
    return ["## The look-ahead's choices", "",
            "Per group, summed over its seeds: the decisions that asked the lead's look-ahead "
            "which ready pass to start, those with two or more options, those where it chose "
            "otherwise than greedy (depth 0: the most urgent candidate) and how many of these "
            "deferred every pass; worth = the lead's tokens/s ÷ greedy's (– where the group "
            "did not run greedy).", "",
            "| group | asked | ≥ 2 options | chose otherwise | deferred | worth |",
            "|---|---:|---:|---:|---:|---:|", *rows, ""]
