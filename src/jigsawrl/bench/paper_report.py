"""``BENCHMARKS-paper.md``: the paper matrix's results as markdown, and its headline claims.

Why a separate module: :mod:`jigsawrl.bench.paper` runs the matrix; this one only reads the
summaries it produced and formats them, so the report can change without touching the runs.

The report opens with what DESIGN.md §6 asks for — the exact command, the machine, the seeds —
then a summary that sets our figures beside the paper's reported ones (``reference/jigsawrl.md``),
a table of the lead policy's throughput ratio to every baseline per group, what each of the lead's
mechanisms is worth on the ablation groups (:mod:`jigsawrl.bench.paper_mechanisms`), and one table
per group.
Every ratio is a ratio of mean throughputs over the same seeds, measured in one run (one
``compare_policies`` call per group). A missing value is ``–`` (the policy was not registered,
did not fit, or the group has no such baseline), never 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jigsawrl.bench.paper_matrix import GroupResult, PaperRun
from jigsawrl.bench.paper_mechanisms import lookahead_lines, mechanism_lines

DASH = "–"


def _x(v: float | None) -> str:
    return DASH if v is None else f"{v:.2f}×"


def _pct(v: float | None) -> str:
    return DASH if v is None else f"{100 * v:.2f}%"


def _num(v: Any, spec: str = ",.0f") -> str:
    return DASH if not isinstance(v, int | float) else f"{v:{spec}}"


def _max_mean(vals: list[float]) -> str:
    if not vals:
        return DASH
    return f"{max(vals):.2f}× / {statistics.fmean(vals):.2f}×"


@dataclass(frozen=True)
class Claim:
    """One headline figure: the paper's reported value beside ours (and over how many groups)."""

    what: str
    paper: str
    ours: str
    groups: int


def _lead(run: PaperRun) -> str:
    return run.groups[0].group.lead if run.groups else "jigsaw"


def _ratios(groups: Iterable[GroupResult], baseline: str) -> list[float]:
    return [r for g in groups if (r := g.lead_ratios().get(baseline)) is not None]


def _lead_summaries(groups: Iterable[GroupResult]) -> list[tuple[GroupResult, dict[str, Any]]]:
    return [(g, g.result.mean_summaries[g.group.lead]) for g in groups
            if g.result is not None and g.group.lead in g.result.runs]


def pipeline_latency_vs_solo(g: GroupResult, label: str) -> dict[str, float]:
    """Each pipeline's latency vs solo under ``label``, averaged over seeds."""
    per: dict[str, list[float]] = {}
    for summary in g.result.runs.get(label, []) if g.result else []:
        for p in summary.get("pipelines", []):
            if isinstance(p.get("latency_vs_solo"), int | float):
                per.setdefault(p["name"], []).append(p["latency_vs_solo"])
    return {k: statistics.fmean(v) for k, v in per.items()}


def _bounded(g: GroupResult) -> bool:
    """Does a pipeline of the group set a latency bound (``max_latency_ratio``)?"""
    return any(p.max_latency_ratio is not None for p in g.config.pipelines)


def _mfu(groups: Iterable[GroupResult], label: str) -> list[float]:
    return [m for g in groups if g.result is not None and label in g.result.runs
            and isinstance(m := g.result.mean_summaries[label].get("mfu"), int | float)]


def summary_claims(run: PaperRun) -> list[Claim]:
    """The paper's headline claims, each with our value from this run."""
    lead = _lead(run)
    sync = [g for g in run.groups if g.group.section in ("sync", "hetero", "scaling")]
    asyn = [g for g in run.groups if g.group.section == "async"]
    hetero = [g for g in run.groups if g.group.section == "hetero"]
    scaling = sorted((g for g in run.groups if g.group.section == "scaling"),
                     key=lambda g: g.config.cluster.num_devices)
    measured = [g for g in run.groups if g.group.section != "ablation"]
    lat = [s["mean_latency_vs_solo"] for _, s in _lead_summaries(measured)
           if isinstance(s.get("mean_latency_vs_solo"), int | float)]
    free = [g for g in hetero if not _bounded(g)]
    het = [v for g in free for v in pipeline_latency_vs_solo(g, lead).values()]
    tied = [g for g in hetero if _bounded(g)]
    het_b = [v for g in tied for v in pipeline_latency_vs_solo(g, lead).values()]
    tied_r = _ratios(tied, "verl")
    big = _ratios(scaling[-1:], "verl")
    mfu_v, mfu_l = _mfu(sync, "verl"), _mfu(sync, lead)
    at = f"{scaling[-1].config.cluster.num_devices} devices" if scaling else "no scaling group"
    return [
        Claim(f"{lead} ÷ verl, sync matrix (max / mean)", "1.85× / 1.56×",
              _max_mean(_ratios(sync, "verl")), len(_ratios(sync, "verl"))),
        Claim(f"{lead} ÷ rollmux, sync matrix (max / mean)", "– / 1.27×",
              _max_mean(_ratios(sync, "rollmux")), len(_ratios(sync, "rollmux"))),
        Claim(f"{lead} ÷ streamrl, async (max / mean)", "1.54× / 1.25×",
              _max_mean(_ratios(asyn, "streamrl")), len(_ratios(asyn, "streamrl"))),
        Claim(f"{lead} ÷ areal, async (max / mean)", "1.41× / 1.21×",
              _max_mean(_ratios(asyn, "areal")), len(_ratios(asyn, "areal"))),
        Claim(f"{lead} ÷ verl at the largest scale ({at})", "1.75×–1.85× (64 A100)",
              _x(big[0]) if big else DASH, len(big)),
        Claim(f"{lead} mean step latency vs solo (mean / best)", "1.48× / 1.14×",
              f"{statistics.fmean(lat):.2f}× / {min(lat):.2f}×" if lat else DASH, len(lat)),
        Claim(f"heterogeneous pair: worst pipeline latency vs solo under {lead}", "≤ 1.34×",
              _x(max(het)) if het else DASH, len(free) if het else 0),
        Claim(f"heterogeneous pair with max_latency_ratio set: worst latency vs solo / {lead} "
              "÷ verl", "≤ 1.34× / –",
              f"{_x(max(het_b))} / {_x(min(tied_r))}" if het_b and tied_r else DASH,
              len(tied) if het_b else 0),
        Claim(f"mean MFU, sync matrix: verl / {lead}", "2.29% / 3.89%",
              f"{_pct(_mean(mfu_v))} / {_pct(_mean(mfu_l))}", len(mfu_l)),
    ]


def _sensitivity_table(run: PaperRun) -> list[str]:
    """Each headline ratio at the default assumptions and with one assumption changed."""
    rows = [(g, b) for g in run.groups if g.sensitivity for b in g.lead_ratios()
            if any(b in per for per in g.sensitivity.values())]
    if not rows:
        return []
    settings = list(dict.fromkeys(k for g, _ in rows for k in g.sensitivity))
    lead = _lead(run)
    lines = ["## Sensitivity to assumptions no GPU here can measure", "",
             f"{lead} ÷ each headline baseline: at the defaults (co-location cheap, `s_sat` "
             "0.4; offload off; mean over seeds), then re-run on the group's first seed with "
             "costly co-location (`s_sat` 0.8) and with verl's parameter and optimizer offload "
             "on for every pipeline (`jigsawrl.bench.paper_sensitivity`).", "",
             "| group | baseline | default | " + " | ".join(settings) + " |",
             "|---|---|---:|" + "---:|" * len(settings)]
    for g, b in rows:
        cells = [_x(g.sensitivity.get(k, {}).get(b)) for k in settings]
        lines.append(f"| {g.group.name} | {b} | {_x(g.lead_ratios().get(b))} | "
                     + " | ".join(cells) + " |")
    return [*lines, ""]


def _mean(vals: list[float]) -> float | None:
    return statistics.fmean(vals) if vals else None


def _header(run: PaperRun) -> list[str]:
    m = run.machine
    seeds = f"{run.seeds} per policy"
    if run.groups:
        first = run.groups[0].config.seed
        seeds += f" (seeds {first}..{first + run.seeds - 1} of each group's config; the same " \
                 "seeds for every policy of a group)"
    return [
        "# JigsawRL paper matrix — simulated" + (" (quick: reduced matrix)" if run.quick else ""),
        "",
        f"- command: `{run.command or 'jigsawrl bench paper'}`",
        f"- machine: {m['platform']}; CPU {m['cpu']}; {m['cores']} cores; Python {m['python']}",
        f"- seeds: {seeds}",
        f"- policies registered in this run: {', '.join(run.registered)}",
        f"- started {run.started_utc}; wall time {run.wall_s:.1f} s for {len(run.groups)} groups",
        "- executor: simulated (event-driven clock, truth cost model with 5% lognormal noise); "
        "the devices named in each group are simulated, not this machine. Ratios are measured "
        "side by side in one run (DESIGN.md §6).",
        "",
    ]


def _ratio_table(run: PaperRun) -> list[str]:
    lead = _lead(run)
    groups = [g for g in run.groups if g.group.section != "ablation"]  # ablations: own table
    cols: list[str] = []
    for g in groups:
        cols += [p for p in g.lead_ratios() if p not in cols]
    lines = [f"## Throughput of {lead} ÷ each baseline (all groups but ablations)", ""]
    if not cols:
        return lines + [f"No group ran {lead} (is it registered?): no ratios yet.", ""]
    lines += ["| group | section | " + " | ".join(f"÷ {c}" for c in cols) + " |",
              "|---|---|" + "---:|" * len(cols)]
    for g in groups:
        r = g.lead_ratios()
        lines.append(f"| {g.group.name} | {g.group.section} | "
                     + " | ".join(_x(r.get(c)) for c in cols) + " |")
    return lines + [""]


def _policy_row(g: GroupResult, label: str) -> str:
    assert g.result is not None
    s = g.result.mean_summaries[label]
    base = g.result.mean_summaries[g.result.baseline].get("throughput_tokens_per_s")
    tp = s.get("throughput_tokens_per_s")
    lead_r = g.lead_ratios().get(label) if label != g.group.lead else None
    cells = [f"{_num(tp)} ± {_num(s.get('throughput_tokens_per_s_std'))}",
             _x(tp / base if isinstance(tp, int | float) and base else None),
             _x(lead_r), _x(s.get("mean_latency_vs_solo")), _pct(s.get("mfu")),
             _pct(s.get("busy_fraction")), _num(s.get("cost_per_million_tokens_usd"), ",.3f"),
             _num(s.get("makespan_s"), ",.1f")]
    name = f"**{label}**" if label == g.group.lead else label
    if s.get("variant") and s["variant"] != label:  # verl: the placement the runner kept
        name += f" ({s['variant']})"
    return f"| {name} | " + " | ".join(cells) + " |"


def _group_section(g: GroupResult) -> list[str]:
    cfg, grp = g.config, g.group
    c = cfg.cluster
    pipes = ", ".join(f"{p.name} ({p.model}, {p.task}, {p.mode}, {p.batch_size}×{p.group_size}, "
                      f"{p.steps} steps)" for p in cfg.pipelines)
    lines = [f"### {grp.section}: {grp.title}", "",
             f"`{grp.path}` — {c.num_devices}× {c.accelerator} ({c.accelerators_per_node} per "
             f"node); {pipes}; wall {g.wall_s:.1f} s" + (f"; `{g.out_dir}/compare.json`"
                                                          if g.out_dir else ""), ""]
    if g.result is not None:
        lead, base = grp.lead, g.result.baseline
        lines += [f"| policy | tok/s (mean ± sd) | ×{base} | {lead} ÷ this | ×solo | MFU | busy "
                  "| $/Mtok | makespan s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [_policy_row(g, p) for p in g.result.policies]
        variants = [f"{k} = {v[0]} {v[1]}" for k, v in grp.variants.items()
                    if k in g.result.policies]
        if variants:
            lines += ["", "variants: " + "; ".join(variants)]
    if g.skipped:
        lines.append("")
        lines += [f"- skipped **{label}**: {why.splitlines()[0]}" for label, why in g.skipped.items()]
    return lines + [""]


def render_markdown(run: PaperRun) -> str:
    """The whole report (header, summary vs the paper, ratio table, one section per group)."""
    lines = _header(run)
    lines += ["## Summary against the paper's reported numbers", "",
              "| claim | paper | here | groups |", "|---|---|---|---:|"]
    lines += [f"| {c.what} | {c.paper} | {c.ours} | {c.groups} |" for c in summary_claims(run)]
    lines += ["", "Sync matrix = sections sync, hetero and scaling. Paper values from "
              "`reference/jigsawrl.md` (some from secondary summaries).", ""]
    lines += _ratio_table(run)
    lines += _sensitivity_table(run)
    lines += mechanism_lines(run.groups)
    lines += lookahead_lines(run.groups)
    lines += ["## Groups", "", "Columns: finished tokens/s (mean ± population sd over seeds); "
              "÷ the group's baseline; the lead's tokens/s ÷ this policy's; mean step latency ÷ "
              "solo; MFU; busy fraction; $ per million finished tokens; makespan.", ""]
    for g in run.groups:
        lines += _group_section(g)
    return "\n".join(lines).rstrip() + "\n"
