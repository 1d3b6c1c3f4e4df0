"""Tables and plots of real runs beside their predictions (``jigsawrl run --ray``, ``bench real``).

What: rich :class:`~rich.table.Table` builders (the CLI prints them; nothing here prints) for

- one real run: per pipeline, measured and predicted mean step latency and tokens/s
  (:func:`run_table`, from a :class:`~jigsawrl.experiments.calibrate.Calibration`);
- a bench: per policy, measured throughput, ratio to verl, makespan, busy fraction and latency vs
  alone, each with the simulator's prediction beside it (:func:`bench_table`), and per pipeline
  and policy the step latency (:func:`bench_pipeline_table`); with ``--repeats`` the medians
  over the repeats, the range of tokens/s and the ratio per repeat (:func:`bench_notes`);

and :func:`plot_reward_curves`, the per-step mean reward of each pipeline of a run
(``summary["pipeline_metrics"]``) as ``reward_curves.png``.

Why a module of its own: ``metrics/report.py`` renders one summary's shape; these put two runs
(real and simulated) side by side, and the engine CLI stays short.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from jigsawrl.bench.real import BenchRealResult, Spread
from jigsawrl.experiments.calibrate import TARGET_REL_ERROR, Calibration, Compared, samples_per_s

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
    line = (f"prediction: largest error {err:.0%} on step latency / throughput — {verdict} "
            f"the {TARGET_REL_ERROR:.0%} aim")
    if not cal.replays or cal.noise_sigma is None:
        return line
    judged = [c for k, c in cal.pool.items() if k in cal.JUDGED_POOL]
    judged += [c for d in cal.pipelines.values() for k, c in d.items()
               if k in cal.JUDGED_PIPELINE]
    inside = [c.in_range for c in judged if c.in_range is not None]
    return (f"{line}; range: that of the prediction and of {cal.replays} replays "
            f"under this run's call-time scatter (σ {cal.noise_sigma:.1%}): the measurement "
            f"lies within it for {sum(inside)} of {len(inside)}")


def speed_note(cal: Calibration | None) -> str | None:
    """One line on the machine's speed for the run against the profile's (the speed probe)
    and the makespan / throughput errors once the profile is scaled by it; None without
    probes. Shown beside the plain prediction, never instead of it: one probe before the run
    did not follow this VM's drift (docs/BENCHMARKS.md, "Speed probe")."""
    if cal is None or cal.speed_factor is None or cal.speed_adjusted is None:
        return None
    pool = cal.speed_adjusted["pool"]
    errs = [f"{label} {pool[key]['rel_error']:+.0%}"
            for key, label in (("makespan_s", "makespan"), ("throughput_tokens_per_s", "tokens/s"))
            if pool.get(key, {}).get("rel_error") is not None]
    pace = ("slower" if cal.speed_factor >= 1 else "faster")
    ratio = cal.speed_factor if cal.speed_factor >= 1 else 1 / cal.speed_factor
    return (f"speed probe (before and after the run): this run's machine {ratio:.2f}× {pace} "
            f"than at profile time; prediction scaled to it: "
            f"{', '.join(errs) or 'nothing to compare'} (on a VM whose speed moves within "
            f"seconds the probe can miss the run's speed: docs/BENCHMARKS.md, \"Speed probe\")")


def run_table(summary: Mapping[str, Any], cal: Calibration | None) -> Table:
    """One real run, per pipeline: measured step latency, tokens/s and rewards, then (dim) the
    simulator's prediction of the same run with its error."""
    span = cal.pool["makespan_s"] if cal else _only(summary, "makespan_s")
    title = (f"{summary.get('name')} under {summary.get('policy')}: makespan "
             f"{_f(span.measured, '.1f')} s (predicted {_pred_err(span, '.1f')})")
    caption = "each pipeline: measured, then predicted (error)" + (
        ", then the range of it and the replays" if cal is not None and cal.replays else "")
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD)
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
        if cal is None:
            continue
        lat, tok = c.get("step_latency_s"), c.get("tokens_per_s")
        table.add_row("  predicted", "", _pred_err(lat, ".2f", ranged=False),
                      _pred_err(tok, ",.0f", ranged=False), "", style="dim")
        if cal.replays and any(x is not None and x.low is not None for x in (lat, tok)):
            table.add_row("  range", "", _range(lat, ".2f"), _range(tok, ",.0f"), "",
                          style="dim")
    return table


def _pred_err(c: Compared | None, spec: str, *, ranged: bool = True) -> str:
    """The prediction, its error and (``ranged``) the replays' range in brackets."""
    if c is None or c.predicted is None:
        return DASH
    err = c.rel_error
    span = f" [{_range(c, spec)}]" if ranged and c.low is not None else ""
    return _f(c.predicted, spec) + ("" if err is None else f" ({err:+.0%})") + span


def _range(c: Compared | None, spec: str) -> str:
    """``low–high`` of the prediction and the replays under the run's scatter (a dash: none)."""
    if c is None or c.low is None or c.high is None:
        return DASH
    return f"{_f(c.low, spec)}–{_f(c.high, spec)}"


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
    """Two rows per label: measured, then the simulator's prediction of the same runs (its
    largest error in the last column); ×verl is measured. With repeats every value is the
    median over the repeats, ``range`` the lowest–highest tokens/s and ×verl a ratio of
    medians."""
    runs = result.summaries
    n = result.compare.repeats
    base = runs.get(result.compare.baseline, {}).get("throughput_tokens_per_s")
    what = f"median of {n} repeats, " if n > 1 else ""
    table = Table(title=f"bench real: {result.config.name}, {len(result.config.pipelines)} "
                  f"pipelines on {result.config.cluster.num_devices} CPU devices",
                  caption=f"each policy: measured, then predicted ({what}smp/s = samples/s, "
                  "span = makespan, err = largest |error| of step latency / throughput)",
                  box=box.SIMPLE_HEAD)
    cols = ["policy", "tok/s", *(["range"] if n > 1 else []), f"×{result.compare.baseline}",
            "smp/s", "span s", "busy", "×alone", "err"]
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for policy, s in runs.items():
        tp = s.get("throughput_tokens_per_s")
        label = f"{policy}={s['variant']}" if s.get("variant") else policy
        lo_hi = (s.get("spread") or {}).get("throughput_tokens_per_s")
        rng = [f"{lo_hi[0]:,.0f}{DASH}{lo_hi[1]:,.0f}" if lo_hi else DASH] if n > 1 else []
        table.add_row(label, _f(tp, ",.0f"), *rng,
                      _f(tp / base if tp and base else None, ".2f", "×"),
                      _f(_median(samples_per_s(x) for x in result.compare.runs[policy]), ".1f"),
                      _f(s.get("makespan_s"), ".1f"), _f(s.get("busy_fraction"), ".0%"),
                      _f(s.get("mean_latency_vs_solo"), ".2f", "×"), "")
        cals = [c for c in result.calibrations.get(policy, []) if c is not None]
        if not cals or s.get("variant"):
            continue
        pred_vs = _median((x.get("predicted") or {}).get("mean_latency_vs_solo")
                          for x in result.compare.runs[policy])
        table.add_row("  predicted", _pred(cals, "throughput_tokens_per_s", ",.0f"),
                      *([""] if n > 1 else []), "", _pred(cals, "samples_per_s", ".1f"),
                      _pred(cals, "makespan_s", ".1f"), _pred(cals, "busy_fraction", ".0%"),
                      _f(pred_vs, ".2f", "×"),
                      _f(_median(c.max_abs_rel_error for c in cals), ".0%"), style="dim")
    for policy in result.compare.skipped:  # why: in bench_notes, under the table
        table.add_row(policy, "skipped", *[DASH] * (len(cols) - 2), style="dim")
    return table


def _median(values: Iterable[Any]) -> float | None:
    s = Spread.of(values)
    return None if s is None else s.median


def _pred(cals: list[Calibration], key: str, spec: str) -> str:
    """The median over repeats of the predicted pool quantity ``key``."""
    return _f(_median(c.pool[key].predicted for c in cals if key in c.pool), spec)


def bench_pipeline_table(result: BenchRealResult) -> Table:
    """Per pipeline: mean step latency under each policy, measured (×alone), then predicted
    (error); with repeats both are medians over the repeats."""
    runs = {p: s for p, s in result.summaries.items() if not s.get("variant")}
    what = " (medians of repeats)" if result.compare.repeats > 1 else ""
    table = Table(title=f"mean step latency, s: measured ×alone, then predicted (error){what}",
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
            cals = [c for c in result.calibrations.get(policy, []) if c is not None]
            pred = _median(c.pipelines.get(p.name, {}).get("step_latency_s", Compared(
                None, None)).predicted for c in cals)
            err = Compared(row.get("mean_step_latency_s"), pred).rel_error
            predicted.append(DASH if pred is None else
                             _f(pred) + ("" if err is None else f" ({err:+.0%})"))
        table.add_row(p.name, _f(result.alone_s.get(p.name)), *measured)
        table.add_row("  predicted", "", *predicted, style="dim")
    return table


def bench_notes(result: BenchRealResult) -> list[str]:
    """The lines that say how to read the tables and whether the aims were met."""
    compare, n = result.compare, result.compare.repeats
    verl = compare.runs.get("verl", [{}])[0].get("variant")
    notes = ["alone = each pipeline's mean step latency under verl-serial (each pipeline runs "
             "alone on the whole pool, one after another); verl = the best verl placement that "
             "ran (verl-split, verl-serial, verl-sized, verl-queue-K) by "
             + ("median " if n > 1 else "") + "measured tokens/s"
             + (f": {verl}" if verl else "")]
    if n > 1:
        notes.append(f"{n} repeats, interleaved (repeat 1 of every policy, then repeat 2, ...): "
                     "values are medians, range = lowest–highest, ratios of medians")
    for policy, why in compare.skipped.items():
        lines = [x.strip() for x in why.splitlines() if x.strip()]
        fix = next((x for x in lines[1:] if x.startswith("fix:")), None)
        notes.append(f"{policy} skipped: {lines[0] if lines else 'did not run'}"
                     + (f" ({fix})" if fix else ""))
    notes += compare.notes
    ratio = result.ratio("jigsaw")
    if ratio is not None and n == 1:
        notes.append(f"jigsaw / verl measured tokens/s: {ratio:.2f}× "
                     f"({'meets' if ratio >= 1.5 else 'below'} the 1.5× aim)")
    elif ratio is not None:
        each = compare.per_repeat_ratios("verl").get("jigsaw", [])
        worst = min((r for r in each if r is not None), default=None)
        notes.append(f"jigsaw / verl measured tokens/s: {ratio:.2f}× (ratio of medians; aim "
                     f">= 1.3×), per repeat " + ", ".join(_f(r, ".2f", "×") for r in each)
                     + (f" (aim >= 1.0× in every repeat: "
                        f"{'met' if worst >= 1.0 else 'missed'})" if worst is not None else ""))
    bound = bound_note(result)
    if bound:
        notes.append(bound)
    loads = _loads(result)
    if loads:
        notes.append(f"1-minute load average before each run: {loads}")
    for policy, cals in result.calibrations.items():
        known = [c for c in cals if c is not None]
        if n == 1 or len(cals) == 1:
            notes.append(f"{policy}: {error_note(cals[0])}")
        else:
            errs = ", ".join(_f(c.max_abs_rel_error if c else None, ".0%") for c in cals)
            notes.append(f"{policy}: prediction's largest error per repeat {errs} (median "
                         f"{_f(_median(c.max_abs_rel_error for c in known), '.0%')}; aim "
                         f"{TARGET_REL_ERROR:.0%})")
        speeds = [speed_note(c) for c in cals]
        notes += [f"{policy}{'' if len(cals) == 1 else f' (repeat {i})'}: {line}"
                  for i, line in enumerate(speeds) if line is not None]
        notes += [f"{policy}: {line}" for line in dict.fromkeys(
            x for c in known for x in c.notes)]
    notes.append(f"predictions: {_source(result)}")
    return notes


def bound_note(result: BenchRealResult) -> str | None:
    """How close each policy's predicted tokens/s comes to the realistic bound of the replayed
    workload (both under the profile's costs): the room the bench leaves for scheduling."""
    known = {policy: [c for c in cals if c is not None]
             for policy, cals in result.calibrations.items()}
    bound = _median(c.bound_tokens_per_s for cals in known.values() for c in cals)
    if not bound:
        return None
    shares = []
    for policy, cals in known.items():
        pred = _median(c.pool["throughput_tokens_per_s"].predicted for c in cals
                       if "throughput_tokens_per_s" in c.pool)
        if pred is not None:
            shares.append(f"{policy} {pred / bound:.0%}")
    return (f"realistic bound of the replayed workload (the profile's costs; "
            f"graph/makespan_bound.py): {bound:,.0f} tokens/s (median over runs); predicted "
            f"tokens/s ÷ bound: " + ", ".join(shares))


def _loads(result: BenchRealResult) -> str:
    """``label r1 a, r2 b`` per label, from each run's ``load_average_1m`` (empty if none)."""
    parts = []
    for policy, runs in result.compare.runs.items():
        if policy == "verl":
            continue
        vals = [(s.get("repeat"), (s.get("load_average_1m") or [None])[0]) for s in runs]
        if any(v is not None for _, v in vals):
            parts.append(f"{policy} " + ", ".join(_f(v, ".1f") for _, v in vals))
    return "; ".join(parts)


def _source(result: BenchRealResult) -> str:
    if result.profile is None:
        return ("built-in cpu-worker preset (no profile: run `jigsawrl profile --threads 1 "
                "--out profiles/cpu.yaml`)")
    return f"profile {result.profile}"

