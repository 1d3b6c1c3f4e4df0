"""Metrics: from a run's events to its summary, Chrome trace, timeline PNG and tables.

Executors emit :mod:`jigsawrl.events`; everything here reads only those events and a
:class:`RunInfo`, so a simulated run and a real (Ray) run are measured by the same code.
The metric definitions live in :mod:`jigsawrl.metrics.summary`'s docstring.

Typical use (what the CLI does)::

    summary = summarize(events, info)
    write_run(out_dir, events=events, summary=summary, info=info, config_yaml=cfg_text)
    console.print(summary_table(summary))

This package imports neither torch nor ray, and imports matplotlib only when a timeline is drawn
(``plot_timeline`` is loaded on first use), so that ``import jigsawrl.metrics`` stays fast.
"""

from typing import TYPE_CHECKING, Any

from jigsawrl.metrics.report import compare_table, summary_table
from jigsawrl.metrics.rundir import load_run, load_summary, run_info_of, write_run
from jigsawrl.metrics.summary import RunInfo, summarize
from jigsawrl.metrics.trace import write_trace

if TYPE_CHECKING:
    from jigsawrl.metrics.timeline import plot_timeline

__all__ = [
    "RunInfo",
    "compare_table",
    "load_run",
    "load_summary",
    "plot_timeline",
    "run_info_of",
    "summarize",
    "summary_table",
    "write_run",
    "write_trace",
]


def __getattr__(name: str) -> Any:
    """Load :func:`plot_timeline` (and matplotlib) lazily."""
    if name == "plot_timeline":
        from jigsawrl.metrics.timeline import plot_timeline

        return plot_timeline
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
