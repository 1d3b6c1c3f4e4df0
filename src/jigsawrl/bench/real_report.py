"""Tables and plots of real runs beside their predictions (``jigsawrl run --ray``, ``bench real``).

What: rich :class:`~rich.table.Table` builders (the CLI prints them; nothing here prints) for

- one real run: per pipeline, measured and predicted mean step latency and tokens/s
  (:func:`run_table`, from a :class:`~jigsawrl.experiments.calibrate.Calibration`);
- a bench: per policy, measured throughput, ratio to verl, makespan, busy fraction and latency vs
  alone, each with the simulator's prediction beside it (:func:`bench_table`), and per pipeline
  and policy the step latency (:func:`bench_pipeline_table`);

and :func:`plot_reward_curves`, the per-step mean reward of each pipeline of a run
(``summary["pipeline_metrics"]``) as ``reward_curves.png``.

Why a module of its own: ``metrics/report.py`` renders one summary's shape; these put two runs
(real and simulated) side by side, and the engine CLI stays short.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from jigsawrl.experiments.calibrate import TARGET_REL_ERROR, Calibration, Compared, samples_per_s

if TYPE_CHECKING:
    from jigsawrl.bench.real import BenchRealResult

log = logging.getLogger(__name__)

REWARD_KEY = "critic/score/mean"
DASH = "–"


def _f(v: float | None, spec: str = ",.2f", suffix: str = "") -> str:
    return DASH if v is None else f"{v:{spec}}{suffix}"


def error_note(cal: Calibration | None) -> str:
    """One line on how far the prediction is from the measurement, against the 10% aim."""
    if cal is None:
        return "no prediction"
    err = cal.max_abs_rel_error
    if err is None:
        return "prediction: nothing to compare"
    verdict = "within" if cal.within_target else "MISSES"
    return (f"prediction: largest error {err:.0%} on step latency / throughput — {verdict} "
            f"the {TARGET_REL_ERROR:.0%} aim")


def run_table(summary: Mapping[str, Any], cal: Calibration | None) -> Table:
    """One real run, per pipeline: measured step latency, tokens/s and rewards, then (dim) the
    simulator's prediction of the same run with its error."""
    span = cal.pool["makespan_s"] if cal else _only(summary, "makespan_s")
    title = (f"{summary.get('name')} under {summary.get('policy')}: makespan "
             f"{_f(span.measured, '.1f')} s (predicted {_pred_err(span, '.1f')})")
    table = Table(title=title, caption="each pipeline: measured, then predicted (error)",
                  box=box.SIMPLE_HEAD)
    for col in ("pipeline", "steps", "s/step", "tokens/s", "reward first → last"):
        table.add_column(col, justify="left" if col == "pipeline" else "right", no_wrap=True)
    curves = reward_curves(summary)
    rows = [(p["name"], str(p.get("steps")), p, cal.pipelines.get(p["name"], {}) if cal else {})
            for p in summary.get("pipelines", [])]
    pool = cal.pool if cal else {}
    rows.append(("all", str(summary.get("steps")), {"tokens_per_s": summary.get(
        "throughput_tokens_per_s")}, {"tokens_per_s": pool.get("throughput_tokens_per_s")}))
    for name, steps, p, c in rows:
        curve = curves.get(name, [])
        table.add_row(name, steps, _f(p.get("mean_step_latency_s")),
                      _f(p.get("tokens_per_s"), ",.0f"),
                      f"{curve[0]:.3f} → {curve[-1]:.3f}" if curve else DASH,
                      style="bold" if name == "all" else None)
        if cal is not None:
            table.add_row("  predicted", "", _pred_err(c.get("step_latency_s"), ".2f"),
                          _pred_err(c.get("tokens_per_s"), ",.0f"), "", style="dim")
    return table


def _pred_err(c: Compared | None, spec: str) -> str:
    if c is None or c.predicted is None:
        return DASH
    err = c.rel_error
    return _f(c.predicted, spec) + ("" if err is None else f" ({err:+.0%})")


def _only(d: Mapping[str, Any], key: str) -> Compared:
    v = d.get(key)
    return Compared(float(v) if isinstance(v, int | float) else None, None)


def reward_curves(summary: Mapping[str, Any]) -> dict[str, list[float]]:
    """Pipeline -> mean reward per step, from ``summary["pipeline_metrics"]`` (may be absent)."""
    out: dict[str, list[float]] = {}
    for name, rows in (summary.get("pipeline_metrics") or {}).items():
        pts = sorted((r.get("step", i), r[REWARD_KEY]) for i, r in enumerate(rows)
                     if isinstance(r, Mapping) and isinstance(r.get(REWARD_KEY), int | float))
        if pts:
            out[name] = [v for _, v in pts]
    return out


def plot_reward_curves(path: Path, summary: Mapping[str, Any]) -> Path | None:
    """Write ``path`` (PNG): mean reward per step, one line per pipeline; None if no metrics."""
    curves = reward_curves(summary)
    if not curves:
        return None
    from matplotlib.figure import Figure  # matplotlib only when drawing

    fig = Figure(figsize=(6.5, 3.6), dpi=110)
    ax = fig.add_subplot()
    for name, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, marker="o", ms=3, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(f"mean reward ({REWARD_KEY})")
    ax.set_title(f"{summary.get('name')} under {summary.get('policy')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return Path(path)


def bench_table(result: BenchRealResult) -> Table:
    """Two rows per policy: measured, then the simulator's prediction of the same run (its
    largest error in the last column); ×verl is measured."""
    runs = result.summaries
    base = runs.get(result.compare.baseline, {}).get("throughput_tokens_per_s")
    table = Table(title=f"bench real: {result.config.name}, {len(result.config.pipelines)} "
                  f"pipelines on {result.config.cluster.num_devices} CPU devices",
                  caption="each policy: measured, then predicted; smp/s = samples/s, span = "
                  "makespan, err = largest |error| of step latency / throughput",
                  box=box.SIMPLE_HEAD)
    for col in ("policy", "tok/s", f"×{result.compare.baseline}", "smp/s", "span s", "busy",
                "×alone", "err"):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for policy, s in runs.items():
        tp = s.get("throughput_tokens_per_s")
        label = f"{policy}={s['variant']}" if s.get("variant") else policy
        table.add_row(label, _f(tp, ",.0f"), _f(tp / base if tp and base else None, ".2f", "×"),
                      _f(samples_per_s(s), ".1f"), _f(s.get("makespan_s"), ".1f"),
                      _f(s.get("busy_fraction"), ".0%"),
                      _f(s.get("mean_latency_vs_solo"), ".2f", "×"), "")
        cal = result.calibrations.get(policy)
        if cal is None or s.get("variant"):
            continue
        pool, pred = cal.pool, s.get("predicted") or {}
        table.add_row("  predicted", _pred(pool.get("throughput_tokens_per_s"), ",.0f"), "",
                      _pred(pool.get("samples_per_s"), ".1f"),
                      _pred(pool.get("makespan_s"), ".1f"),
                      _pred(pool.get("busy_fraction"), ".0%"),
                      _f(pred.get("mean_latency_vs_solo"), ".2f", "×"),
                      _f(cal.max_abs_rel_error, ".0%"), style="dim")
    for policy in result.compare.skipped:  # why: in bench_notes, under the table
        table.add_row(policy, "skipped", *[DASH] * 6, style="dim")
    return table


def _pred(c: Compared | None, spec: str) -> str:
    return DASH if c is None or c.predicted is None else _f(c.predicted, spec)


def bench_pipeline_table(result: BenchRealResult) -> Table:
    """Per pipeline: mean step latency under each policy, measured (×alone), then predicted
    (error)."""
    runs = {p: s for p, s in result.summaries.items() if not s.get("variant")}
    table = Table(title="mean step latency, s: measured ×alone, then predicted (error)",
                  box=box.SIMPLE_HEAD)
    table.add_column("pipeline", no_wrap=True)
    table.add_column("alone s", justify="right")
    for policy in runs:
        table.add_column(policy, justify="right", no_wrap=True)
    for p in result.config.pipelines:
        measured, predicted = [], []
        for policy, s in runs.items():
            row = next((q for q in s["pipelines"] if q["name"] == p.name), {})
            measured.append(f"{_f(row.get('mean_step_latency_s'))} "
                            f"{_f(row.get('latency_vs_solo'), '.2f', '×')}")
            cal = result.calibrations.get(policy)
            c = cal.pipelines.get(p.name, {}).get("step_latency_s") if cal else None
            err = c.rel_error if c else None
            predicted.append(DASH if c is None or c.predicted is None else
                             f"{_f(c.predicted)}" + ("" if err is None else f" ({err:+.0%})"))
        table.add_row(p.name, _f(result.alone_s.get(p.name)), *measured)
        table.add_row("  predicted", "", *predicted, style="dim")
    return table


def bench_notes(result: BenchRealResult) -> list[str]:
    """The lines that say how to read the tables and whether the aims were met."""
    notes = ["alone = each pipeline's mean step latency under verl-serial (each pipeline runs "
             "alone on the whole pool, one after another); verl = best of verl-split and "
             "verl-serial by measured tokens/s"]
    for policy, why in result.compare.skipped.items():
        lines = [x.strip() for x in why.splitlines() if x.strip()]
        fix = next((x for x in lines[1:] if x.startswith("fix:")), None)
        notes.append(f"{policy} skipped: {lines[0] if lines else 'did not run'}"
                     + (f" ({fix})" if fix else ""))
    ratio = result.ratio("jigsaw")
    if ratio is not None:
        notes.append(f"jigsaw / verl measured tokens/s: {ratio:.2f}× "
                     f"({'meets' if ratio >= 1.5 else 'below'} the 1.5× aim)")
    for policy, cal in result.calibrations.items():
        notes.append(f"{policy}: {error_note(cal)}")
        notes += [f"{policy}: {line}" for line in cal.notes]
    notes.append(f"predictions: {_source(result)}")
    return notes


def _source(result: BenchRealResult) -> str:
    if result.profile is None:
        return ("built-in cpu-worker preset (no profile: run `jigsawrl profile --threads 1 "
                "--out profiles/cpu.yaml`)")
    return f"profile {result.profile}"

