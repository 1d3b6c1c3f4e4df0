"""Timeline PNG of a run: one row per device, time on x, what ran where and with what share.

Why: one picture answers "is the pool busy, and with what?" — the question JigsawRL is about.

Encoding:

- colour = pipeline (a distinct hue each); shade and hatch = sub-stage: rollout prefill is a dark
  shade, decode bands get lighter from ``decode_large`` to ``decode_small`` (the tail), training
  stages are hatched, memory moves are cross-hatched; a legend lists both;
- a device span with ``compute_share`` s fills s of the row's compute band; spans that run at the
  same time on a device are stacked (first fit), so co-location is visible as a split row;
- ``tool_wait`` spans (the device is *not* used) are drawn as a thin hatched strip under the
  row's compute band, so they never look like work; white is idle;
- ticks above the rows mark each pipeline's step ends, a red x a pipeline failure.

Speed: spans are grouped into one compound-path patch per (pipeline, stage), built with numpy
(one fill and one hatch pass per group); there is no per-span plotting call. Rendering uses the Agg
canvas through :class:`matplotlib.figure.Figure` (no pyplot, no global backend switch), so it is
headless and thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, PathPatch
from matplotlib.path import Path as MplPath

from jigsawrl.events import Event, PipelineFailed, Span, StepFinished
from jigsawrl.metrics.summary import RunInfo
from jigsawrl.stages import ALL_SPAN_STAGES, DEVICE_STAGES, Stage

logger = logging.getLogger(__name__)

# Row geometry inside a device row [d - 0.5, d + 0.5] (y grows downwards: the axis is inverted).
COMPUTE_TOP, COMPUTE_HEIGHT = -0.42, 0.70  # band that device spans fill by compute share
TOOL_TOP, TOOL_HEIGHT = 0.31, 0.12  # strip for tool_wait (device idle for that pipeline)
MIN_DRAW_SHARE = 0.04  # a span with a tiny share still gets a visible sliver

# stage -> (shade: <0 darker, >0 lighter, hatch or None)
STAGE_STYLE: dict[str, tuple[float, str | None]] = {
    Stage.PREFILL: (-0.35, None),
    Stage.DECODE_LARGE: (0.0, None),
    Stage.DECODE_MEDIUM: (0.3, None),
    Stage.DECODE_SMALL: (0.55, None),
    Stage.TOOL_WAIT: (0.6, "////"),
    Stage.REWARD: (0.2, ".."),
    Stage.OLD_LOGPROB: (0.1, "\\\\"),
    Stage.REF_LOGPROB: (0.35, "\\\\"),
    Stage.ACTOR_UPDATE: (-0.25, "xx"),
    Stage.WEIGHT_SYNC: (0.25, "--"),
    Stage.OFFLOAD: (0.5, "++"),
    Stage.ONLOAD: (0.5, "++"),
    Stage.MIGRATE: (0.4, "oo"),
}
_UNKNOWN_STYLE = (0.45, "**")
_DEVICE_STAGE_SET = frozenset(DEVICE_STAGES)


def _shade(rgb: tuple[float, float, float], amount: float) -> tuple[float, float, float]:
    """Mix a colour toward white (amount > 0) or black (amount < 0)."""
    c = np.asarray(rgb, dtype=float)
    target = 1.0 if amount > 0 else 0.0
    a = abs(amount)
    return tuple((c * (1 - a) + target * a).tolist())  # type: ignore[return-value]


def pipeline_colours(names: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    """A distinct hue per pipeline: tab10 for up to 10 pipelines, evenly spaced hues beyond."""
    if len(names) <= 10:
        cmap = colormaps["tab10"]
        return {n: to_rgb(cmap(i)) for i, n in enumerate(names)}
    cmap = colormaps["hsv"]
    return {n: to_rgb(cmap(i / len(names))) for i, n in enumerate(names)}


@dataclass
class _Rects:
    """Rectangles of all spans, one per (span, device), as parallel arrays."""

    x0: np.ndarray
    x1: np.ndarray
    y0: np.ndarray
    height: np.ndarray
    pipe: np.ndarray  # pipeline index
    stage: np.ndarray  # index into ALL_SPAN_STAGES (+ unknown stages after it)


def _stack(starts: list[float], ends: list[float], heights: list[float]) -> list[float]:
    """First-fit vertical offsets (fractions of the band) for spans on one device."""
    order = sorted(range(len(starts)), key=lambda i: (starts[i], -heights[i]))
    offsets = [0.0] * len(starts)
    active: list[tuple[float, float, float]] = []  # (end, offset, height)
    for i in order:
        active = [a for a in active if a[0] > starts[i]]
        h, pos = heights[i], 0.0
        for _, off, ah in sorted(active, key=lambda a: a[1]):
            if pos + h <= off + 1e-9:
                break
            pos = max(pos, off + ah)
        if pos + h > 1.0 + 1e-9:  # over-committed device: overlap rather than leave the row
            pos = max(0.0, 1.0 - h)
        offsets[i] = pos
        active.append((ends[i], pos, h))
    return offsets


def _rects(spans: Sequence[Span], pipe_idx: dict[str, int], stage_idx: dict[str, int]) -> _Rects:
    """Place every (span, device) in its row: stacked by share in the band, or in the strip."""
    per_dev: dict[int, list[Span]] = {}
    for sp in spans:
        for d in sp.devices:
            per_dev.setdefault(d, []).append(sp)
    cols: dict[str, list[float]] = {k: [] for k in ("x0", "x1", "y0", "h", "p", "s")}
    for d, dspans in per_dev.items():
        dev = [s for s in dspans if s.stage in _DEVICE_STAGE_SET]
        waits = [s for s in dspans if s.stage not in _DEVICE_STAGE_SET]
        heights = [min(1.0, max(s.compute_share, MIN_DRAW_SHARE)) for s in dev]
        offsets = _stack([s.start_s for s in dev], [s.end_s for s in dev], heights)
        for s, h, off in zip(dev, heights, offsets, strict=True):
            _append(cols, s, d + COMPUTE_TOP + off * COMPUTE_HEIGHT, h * COMPUTE_HEIGHT)
        for s in waits:
            _append(cols, s, d + TOOL_TOP, TOOL_HEIGHT)
    for s in spans:
        stage_idx.setdefault(s.stage, len(stage_idx))
    return _Rects(
        x0=np.asarray(cols["x0"]),
        x1=np.asarray(cols["x1"]),
        y0=np.asarray(cols["y0"]),
        height=np.asarray(cols["h"]),
        pipe=np.asarray([pipe_idx[p] for p in cols["p"]], dtype=int),  # type: ignore[index]
        stage=np.asarray([stage_idx[s] for s in cols["s"]], dtype=int),  # type: ignore[index]
    )


def _append(cols: dict[str, list], s: Span, y0: float, h: float) -> None:
    cols["x0"].append(s.start_s)
    cols["x1"].append(s.end_s)
    cols["y0"].append(y0)
    cols["h"].append(h)
    cols["p"].append(s.pipeline)
    cols["s"].append(s.stage)


def _compound_path(x0: np.ndarray, x1: np.ndarray, y0: np.ndarray, y1: np.ndarray) -> MplPath:
    """All rectangles of a group as one path (one hatch pass for the group, not one per span)."""
    verts = np.stack(
        [np.c_[x0, y0], np.c_[x0, y1], np.c_[x1, y1], np.c_[x1, y0], np.c_[x0, y0]], axis=1
    ).reshape(-1, 2)
    codes = np.tile(
        np.array([MplPath.MOVETO] + [MplPath.LINETO] * 3 + [MplPath.CLOSEPOLY], dtype=np.uint8),
        len(x0),
    )
    return MplPath(verts, codes)


def _draw_spans(ax, r: _Rects, names: list[str], stages: list[str], colours: dict) -> None:
    """One compound-path patch per (pipeline, stage) present."""
    key = r.pipe * len(stages) + r.stage
    for k in np.unique(key):
        m = key == k
        pname, stage = names[k // len(stages)], stages[k % len(stages)]
        shade, hatch = STAGE_STYLE.get(stage, _UNKNOWN_STYLE)
        path = _compound_path(r.x0[m], r.x1[m], r.y0[m], r.y0[m] + r.height[m])
        patch = PathPatch(
            path,
            facecolor=_shade(colours[pname], shade),
            edgecolor=_shade(colours[pname], -0.5),
            linewidth=0.0,
            hatch=hatch,
        )
        _set_hatch_colour(patch, _shade(colours[pname], -0.55))
        ax.add_artist(patch)  # not add_patch: its per-vertex autoscale is slow; limits set later


def _set_hatch_colour(patch: Patch, colour: tuple[float, float, float]) -> None:
    """Hatch in a dark shade of the fill (matplotlib >= 3.10; older ones use the edge colour)."""
    if hasattr(patch, "set_hatchcolor"):
        patch.set_hatchcolor(colour)


def _draw_markers(ax, events: Sequence[Event], colours: dict) -> None:
    """Step-end ticks above the rows (one vlines call per pipeline) and failure crosses."""
    ends: dict[str, list[float]] = {}
    fails: list[float] = []
    for ev in events:
        if isinstance(ev, StepFinished):
            ends.setdefault(ev.pipeline, []).append(ev.end_s)
        elif isinstance(ev, PipelineFailed):
            fails.append(ev.time_s)
    for pname, xs in ends.items():
        ax.vlines(xs, -0.95, -0.6, colors=[colours[pname]], linewidth=1.0)
    if fails:
        ax.plot(fails, [-0.78] * len(fails), "x", color="red", markersize=7)


def _legend(fig: Figure, colours: dict, stages: Iterable[str]) -> None:
    handles = [Patch(facecolor=c, label=n) for n, c in colours.items()]
    grey = (0.45, 0.45, 0.45)
    for st in stages:
        shade, hatch = STAGE_STYLE.get(st, _UNKNOWN_STYLE)
        patch = Patch(facecolor=_shade(grey, shade), hatch=hatch, edgecolor="black", lw=0, label=st)
        _set_hatch_colour(patch, (0.1, 0.1, 0.1))
        handles.append(patch)
    fig.legend(
        handles=handles, loc="lower center", ncol=min(len(handles), 9), fontsize=7, frameon=False
    )


def _limit(spans: list[Span], max_spans: int) -> tuple[list[Span], int]:
    """Keep the ``max_spans`` longest spans (short ones are below pixel width); count dropped."""
    if len(spans) <= max_spans:
        return spans, 0
    keep = sorted(spans, key=lambda s: s.end_s - s.start_s, reverse=True)[:max_spans]
    logger.warning("timeline: drawing the %d longest of %d spans", max_spans, len(spans))
    return keep, len(spans) - max_spans


def plot_timeline(
    path: Path, events: Iterable[Event], info: RunInfo, *, max_spans: int = 200_000
) -> None:
    """Draw the run's timeline to a PNG (encoding in the module docstring).

    Args:
        path: the ``.png`` to write (its folder must exist).
        events: the run's events, any order.
        info: the run's facts (device count, pipeline order, labels).
        max_spans: draw at most this many spans; beyond it the shortest are left out and the
            figure says how many.
    """
    evs = list(events)
    names = list(info.pipelines)
    for ev in evs:
        if ev.pipeline not in names:
            names.append(ev.pipeline)
    colours = pipeline_colours(names)
    spans, dropped = _limit([e for e in evs if isinstance(e, Span)], max_spans)
    stage_idx = {s: i for i, s in enumerate(ALL_SPAN_STAGES)}
    rects = _rects(spans, {n: i for i, n in enumerate(names)}, stage_idx)
    stages = list(stage_idx)
    n_dev = max(info.num_devices, 1 + max((d for s in spans for d in s.devices), default=0))
    height_in = min(2.2 + 0.35 * n_dev, 40.0)
    fig = Figure(figsize=(14, height_in), dpi=110)
    FigureCanvasAgg(fig)
    bottom, top = 1.05 / height_in, 0.35 / height_in  # room for x label + legend, and title
    ax = fig.add_axes((0.06, bottom, 0.92, 1.0 - bottom - top))
    _draw_spans(ax, rects, names, stages, colours)
    _draw_markers(ax, evs, colours)
    _finish_axes(ax, evs, n_dev, info, dropped)
    present = [st for st in stages if np.any(rects.stage == stage_idx[st])]
    _legend(fig, colours, present)
    fig.savefig(path, format="png")
    logger.info("wrote timeline of %d spans to %s", len(spans), path)


def _finish_axes(ax, evs: Sequence[Event], n_dev: int, info: RunInfo, dropped: int) -> None:
    times = [t for e in evs for t in _times(e)]
    lo, hi = (min(times), max(times)) if times else (0.0, 1.0)
    ax.set_xlim(lo, hi if hi > lo else lo + 1.0)
    ax.set_ylim(n_dev - 0.5, -1.0)
    ax.set_yticks(range(n_dev), [f"dev {d}" for d in range(n_dev)], fontsize=7)
    ax.set_xlabel("time (s)")
    title = f"{info.name} — policy {info.policy}, {n_dev}× {info.accelerator} ({info.executor})"
    if dropped:
        title += f" — {dropped} shortest spans not drawn"
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def _times(e: Event) -> tuple[float, ...]:
    if isinstance(e, Span | StepFinished):
        return (e.start_s, e.end_s)
    return (e.time_s,)
