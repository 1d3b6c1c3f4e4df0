"""Pictures of a policy comparison: ``compare.png`` and one run folder per policy.

Why: a ratio in a table says *how much*; the timelines of the runs it compares say *why* (where the
pool sat idle under one policy and was filled under another). ``jigsawrl compare --out DIR`` and
``jigsawrl bench paper`` write:

- ``DIR/compare.png``: left, finished tokens/s per policy (bar = mean over seeds, error bar = the
  lowest to the highest seed); right, mean step latency relative to running alone (dashed line at
  1.0 = as fast as solo), same error-bar convention;
- ``DIR/<policy>/``: the first seed's run folder of each policy (``summary.json``, ``trace.json``,
  ``timeline.png``, ``events.jsonl``, ``config.yaml``), written by :func:`write_run`, so that
  ``jigsawrl report DIR/<policy>`` reads it back.

Inputs are plain summaries (``summary.json`` dicts), so this module knows nothing of how the runs
were made. Rendering uses the Agg canvas through :class:`matplotlib.figure.Figure` (no pyplot).
"""

from __future__ import annotations

import logging
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from jigsawrl.events import Event
from jigsawrl.metrics.rundir import write_run
from jigsawrl.metrics.summary import RunInfo

logger = logging.getLogger(__name__)

COMPARE_FILE = "compare.png"
Summaries = Mapping[str, Sequence[Mapping[str, Any]]]  # label -> per-seed summaries


def seed_spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, mean - lowest, highest - mean) of per-seed values: a bar and its error bar."""
    mean = statistics.fmean(values)
    return mean, mean - min(values), max(values) - mean


def _values(runs: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(s[key]) for s in runs if isinstance(s.get(key), int | float)]


def _bars(ax: Any, labels: list[str], runs: Summaries, key: str, highlight: str | None) -> None:
    """One bar per label (mean over seeds) with the seed range as an error bar."""
    means, lows, highs, colours = [], [], [], []
    for label in labels:
        vals = _values(runs[label], key)
        mean, lo, hi = seed_spread(vals) if vals else (0.0, 0.0, 0.0)
        means.append(mean)
        lows.append(lo)
        highs.append(hi)
        colours.append("tab:orange" if label == highlight else "tab:blue")
    xs = list(range(len(labels)))
    ax.bar(xs, means, color=colours, yerr=[lows, highs], capsize=4, edgecolor="black", lw=0.5)
    ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
    for x, m in zip(xs, means, strict=True):
        ax.annotate(f"{m:,.0f}" if m >= 100 else f"{m:.2f}", (x, m), ha="center", va="bottom",
                    fontsize=7, xytext=(0, 2), textcoords="offset points")


def plot_compare(path: Path, runs: Summaries, *, baseline: str | None = None,
                 title: str = "policies compared", highlight: str | None = None) -> Path:
    """Draw ``compare.png``: throughput and mean latency vs solo per policy.

    Args:
        path: the PNG to write.
        runs: label -> its per-seed summaries (in display order).
        baseline: named in the left panel's title (the policy ratios are taken to).
        title: figure title.
        highlight: a label drawn in another colour (e.g. ``jigsaw``).

    Returns:
        ``path``.
    """
    labels = list(runs)
    fig = Figure(figsize=(max(6.0, 1.3 * len(labels) + 3.0), 4.2), dpi=110)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    _bars(left, labels, runs, "throughput_tokens_per_s", highlight)
    left.set_ylabel("finished tokens/s (all pipelines)")
    left.set_title("throughput" + (f" (baseline {baseline})" if baseline else ""), fontsize=9)
    _bars(right, labels, runs, "mean_latency_vs_solo", highlight)
    right.axhline(1.0, color="black", ls="--", lw=0.8)
    right.set_ylabel("mean step latency / solo")
    right.set_title("per-pipeline latency vs running alone", fontsize=9)
    seeds = max((len(r) for r in runs.values()), default=0)
    fig.suptitle(f"{title} — bars: mean of {seeds} seed(s); error bars: lowest..highest seed",
                 fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    logger.info("wrote %s", path)
    return path


def safe_dirname(label: str) -> str:
    """A folder name for a policy label (anything but ``[A-Za-z0-9_.-]`` becomes ``_``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label) or "_"


def write_policy_runs(out_dir: Path, first_runs: Mapping[str, tuple[list[Event], dict[str, Any],
                                                                     RunInfo]],
                      *, config_yaml: str, timeline: bool = True) -> list[Path]:
    """Write ``out_dir/<label>/`` (a complete run folder) for each label's first-seed run.

    Args:
        first_runs: label -> (events, summary, run info) of its first seed.
        config_yaml: the compared config (the same for every label).
        timeline: also draw each ``timeline.png``.

    Returns:
        the folders written, in ``first_runs`` order.
    """
    folders = []
    for label, (events, summary, info) in first_runs.items():
        folder = Path(out_dir) / safe_dirname(label)
        write_run(folder, events=events, summary=summary, info=info, config_yaml=config_yaml,
                  timeline=timeline)
        folders.append(folder)
    return folders
