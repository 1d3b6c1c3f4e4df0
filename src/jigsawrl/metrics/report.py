"""Rich tables of run summaries: one run (per pipeline), and several policies side by side.

Builders only: they return :class:`rich.table.Table` objects and never print (library code does
not print, DESIGN.md §5); the CLI prints them. They read only ``summary.json`` fields, so a table
can be rebuilt from a run folder long after the run. A missing or null value shows as ``–``,
never as 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.table import Table

from jigsawrl.errors import JigsawError
from jigsawrl.stages import VERL_TIMING

DASH = "–"
# verl timing keys of the post-rollout stages, in step order
TRAIN_TIMINGS = tuple(key for key in VERL_TIMING if key != "gen")


def _fmt(value: Any, spec: str = ",.1f", suffix: str = "") -> str:
    """Format a number, or a dash when it is missing / null."""
    if value is None or isinstance(value, str):
        return DASH if value is None else value
    return f"{value:{spec}}{suffix}"


def _pct(value: float | None) -> str:
    return _fmt(None if value is None else 100.0 * value, ".1f", "%")


def _train_s(p: dict[str, Any]) -> float | None:
    """Sum of the mean per-step wall extents of the training-side stages."""
    vals = [p.get(f"timing_s/{k}") for k in TRAIN_TIMINGS]
    known = [v for v in vals if v is not None]
    return sum(known) if known else None


def _caption(s: dict[str, Any]) -> str:
    parts = [
        f"makespan {_fmt(s.get('makespan_s'), ',.1f', ' s')}",
        f"busy {_pct(s.get('busy_fraction'))}",
        f"compute {_pct(s.get('compute_utilisation'))}",
        f"MFU {_pct(s.get('mfu'))}",
        f"cost ${_fmt(s.get('cost_usd'), ',.2f')}",
        f"${_fmt(s.get('cost_per_million_tokens_usd'), ',.3f')}/Mtok",
    ]
    if s.get("efficiency") is not None:
        parts.append(f"efficiency {_pct(s['efficiency'])} of bound")
    if s.get("efficiency_floor") is not None:
        parts.append(f"{_pct(s['efficiency_floor'])} of floor")
    return " · ".join(parts)


def _pipeline_row(p: dict[str, Any]) -> list[str]:
    name = str(p.get("name", "?"))
    return [
        f"[red]{name} ✗[/red]" if p.get("failed") else name,
        _fmt(p.get("steps"), "d"),
        _fmt(p.get("samples"), ",d"),
        _fmt(p.get("tokens_per_s"), ",.0f"),
        _fmt(p.get("mean_step_latency_s"), ",.1f"),
        _fmt(p.get("p90_step_latency_s"), ",.1f"),
        _latency_cell(p),
        _fmt(p.get("timing_s/gen"), ",.1f"),
        _fmt(_train_s(p), ",.1f"),
        _fmt(p.get("tool_wait_s"), ",.0f"),
    ]


def _latency_cell(p: dict[str, Any]) -> str:
    """Latency vs solo, in red with its bound where the pipeline went over its
    ``max_latency_ratio``."""
    cell = _fmt(p.get("latency_vs_solo"), ".2f")
    if p.get("within_latency_bound") is False:
        return f"[red]{cell} > {p['max_latency_ratio']:.2f}[/red]"
    return cell


def _totals_row(s: dict[str, Any]) -> list[str]:
    return [
        "total",
        _fmt(s.get("steps"), "d"),
        _fmt(s.get("samples"), ",d"),
        _fmt(s.get("throughput_tokens_per_s"), ",.0f"),
        _fmt(s.get("perf/time_per_step"), ",.1f"),
        DASH,
        _fmt(s.get("mean_latency_vs_solo"), ".2f"),
        DASH,
        DASH,
        _fmt(sum(p.get("tool_wait_s") or 0.0 for p in s.get("pipelines", [])), ",.0f"),
    ]


def _failures(s: dict[str, Any]) -> list[str]:
    return [
        f"[red]{p.get('name')} failed at step {p.get('failed_step')}: {p['failed']}[/red]"
        for p in s.get("pipelines", [])
        if p.get("failed")
    ]


SUMMARY_COLUMNS = ("steps", "samples", "tok/s", "step", "p90", "×solo", "gen", "train", "tool")
SUMMARY_UNITS = "step, p90, gen, train: s per step (mean; p90 of step) · tool: worker-s in all"


def summary_table(summary: dict[str, Any]) -> Table:
    """One run: a row per pipeline, then a totals row; pool-wide figures in the caption.

    Columns: finished steps, finished samples, finished tokens/s, mean and p90 step latency (s),
    mean step latency / solo step latency, mean per-step rollout wall time (``timing_s/gen``)
    and training-stage time (sum of the other ``timing_s/*`` but step), tool-wait
    worker-seconds. A failed pipeline is marked ✗ and its error is in the caption.
    """
    s = summary
    title = (
        f"{s.get('name', '?')} — {s.get('policy', '?')} ({s.get('executor', '?')}, "
        f"{s.get('num_devices', '?')}× {s.get('accelerator', '?')}, seed {s.get('seed', '?')})"
    )
    caption = "\n".join([_caption(s), SUMMARY_UNITS, *_failures(s)])
    table = Table(
        title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True
    )
    names = [str(p.get("name", "?")) for p in s.get("pipelines", [])]
    table.add_column("pipeline", style="bold", overflow="fold", min_width=_label_width(names))
    for col in SUMMARY_COLUMNS:
        table.add_column(col, justify="right", no_wrap=True)
    for p in s.get("pipelines", []):
        table.add_row(*_pipeline_row(p))
    table.add_section()
    table.add_row(*_totals_row(s), style="bold")
    return table


def _label_width(labels: list[str]) -> int:
    """Room for the label column (up to 14 characters; longer labels fold onto two lines)."""
    return min(max([len(x) for x in labels] + [5]), 14)


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


COMPARE_COLUMNS = ("tok/s", "×base", "×solo", "MFU", "busy", "$/Mtok", "makespan s")


def compare_table(summaries: dict[str, dict[str, Any]], baseline: str | None = None,
                  skipped: Mapping[str, str] | None = None) -> Table:
    """Several runs side by side (one row per policy, in the dict's order).

    Args:
        summaries: policy (or run label) -> its summary.
        baseline: the key the throughput ratio is measured against; the first key when None.
        skipped: label -> why it could not run; each is a dim row marked "skipped", with its
            reason (first line) in the caption.

    A policy that ran several placements and kept the best (``verl``) is labelled with the
    winner's name. Columns: finished tokens/s, ratio to the baseline's tokens/s, mean latency vs solo, MFU,
    busy fraction, $ per million finished tokens, makespan (s). The best throughput is bold.

    Raises:
        JigsawError: ``baseline`` is not a key of ``summaries``.
    """
    if summaries and baseline is None:
        baseline = next(iter(summaries))
    if summaries and baseline not in summaries:
        raise JigsawError(
            f"baseline {baseline!r} is not among the compared runs",
            where="baseline",
            fix=f"choose one of: {', '.join(summaries)}",
        )
    base_tp = summaries[baseline].get("throughput_tokens_per_s") if summaries else None
    table = Table(
        title=f"policies compared (×base = tokens/s ÷ {baseline or DASH}'s)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    labels = [*summaries, *(skipped or {})]
    table.add_column("policy", style="bold", overflow="fold", min_width=_label_width(labels))
    for col in COMPARE_COLUMNS:
        table.add_column(col, justify="right", no_wrap=True)
    tps = [s.get("throughput_tokens_per_s") or 0.0 for s in summaries.values()]
    best = max(tps) if tps else None
    for (label, s), tp in zip(summaries.items(), tps, strict=True):
        table.add_row(
            f"{label} ({s['variant']})" if s.get("variant") else label,
            _fmt(s.get("throughput_tokens_per_s"), ",.0f"),
            _fmt(_ratio(s.get("throughput_tokens_per_s"), base_tp), ".2f", "×"),
            _fmt(s.get("mean_latency_vs_solo"), ".2f", "×") + (
                "!" if s.get("latency_bounds_missed") else ""),
            _pct(s.get("mfu")),
            _pct(s.get("busy_fraction")),
            _fmt(s.get("cost_per_million_tokens_usd"), ",.3f"),
            _fmt(s.get("makespan_s"), ",.1f"),
            style="bold" if best and tp == best and len(summaries) > 1 else None,
        )
    over = [f"{label}: {', '.join(s['latency_bounds_missed'])}"
            for label, s in summaries.items() if s.get("latency_bounds_missed")]
    for label in skipped or {}:
        table.add_row(label, "skipped", *[DASH] * (len(COMPARE_COLUMNS) - 1), style="dim")
    notes = [f"skipped {label}: {skip_reason(why)}" for label, why in (skipped or {}).items()]
    if over:
        notes.append("! a pipeline above its max_latency_ratio — " + "; ".join(over))
    if notes:
        table.caption = "\n".join(notes)
        table.caption_justify = "left"
    return table


def skip_reason(why: str) -> str:
    """The first line of a skip reason, with its fix when it has one."""
    lines = [x.strip() for x in why.splitlines() if x.strip()]
    fix = next((x for x in lines[1:] if x.startswith("fix:")), None)
    return lines[0] + (f" ({fix})" if fix else "") if lines else "did not run"
