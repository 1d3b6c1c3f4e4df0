"""Chrome trace-event JSON of a run, for https://ui.perfetto.dev or chrome://tracing.

Why: a timeline you can zoom is the fastest way to see where a schedule leaves devices idle,
which sub-stages were co-located, and where a long tail stalled a step.

Layout (Trace Event Format, "JSON object" form):

- one *process* per device (``pid`` = device index, named ``device D (accelerator)``), with one
  *thread* per pipeline. Spans of one pipeline that overlap in time on one device (an async
  pipeline's rollout beside its own update) go to extra lanes of that pipeline, named
  ``"<pipeline> #2"`` …, because a trace viewer draws only properly nested slices on one thread;
- each :class:`Span` becomes a complete event (``"ph": "X"``, ``ts``/``dur`` in µs) on every
  device it covers, named by its stage, with ``args`` pipeline / step / rank / share / tokens /
  flops / devices;
- one more process, ``pipelines`` (``pid`` = ``num_devices``), holds per pipeline a slice per
  finished step, an instant event (``"ph": "i"``) at each step's end and at each failure, and a
  counter of finished tokens (``"ph": "C"``).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jigsawrl.events import (
    Event,
    PipelineFailed,
    SampleFinished,
    Span,
    StepFinished,
)
from jigsawrl.metrics.summary import RunInfo
from jigsawrl.stages import POST_ROLLOUT, ROLLOUT_BANDS, Stage

logger = logging.getLogger(__name__)

US_PER_S = 1e6
_LANE_TID_STRIDE = 1000  # tid = pipeline_index * stride + lane + 1 (stable across devices)


def _category(stage: str) -> str:
    """The trace category of a span: its rollout, the train side (reward to weight sync), or a
    memory move."""
    if stage in ROLLOUT_BANDS:
        return Stage.ROLLOUT
    return "train" if stage in POST_ROLLOUT else "memory"


def _pipeline_order(events: list[Event], info: RunInfo) -> dict[str, int]:
    """Index of each pipeline: ``info.pipelines`` first, then others in order of appearance."""
    order = {p: i for i, p in enumerate(info.pipelines)}
    for ev in events:
        if ev.pipeline not in order:
            order[ev.pipeline] = len(order)
    return order


def _assign_lanes(spans: list[Span]) -> list[tuple[int, int, Span]]:
    """Per device and pipeline, put overlapping spans on separate lanes (greedy, by start)."""
    by_key: dict[tuple[int, str], list[Span]] = defaultdict(list)
    for sp in spans:
        for d in sp.devices:
            by_key[(d, sp.pipeline)].append(sp)
    out: list[tuple[int, int, Span]] = []
    for (d, _), group in by_key.items():
        lane_end: list[float] = []
        for sp in sorted(group, key=lambda s: (s.start_s, -s.end_s)):
            lane = next((i for i, e in enumerate(lane_end) if e <= sp.start_s), len(lane_end))
            if lane == len(lane_end):
                lane_end.append(sp.end_s)
            else:
                lane_end[lane] = sp.end_s
            out.append((d, lane, sp))
    return out


def _span_events(
    spans: list[Span], order: dict[str, int]
) -> tuple[list[dict[str, Any]], set[tuple[int, str, int]]]:
    """Complete events for spans, and the set of (device, pipeline, lane) threads used."""
    out: list[dict[str, Any]] = []
    threads: set[tuple[int, str, int]] = set()
    for d, lane, sp in _assign_lanes(spans):
        threads.add((d, sp.pipeline, lane))
        out.append(
            {
                "name": sp.stage,
                "cat": _category(sp.stage),
                "ph": "X",
                "ts": sp.start_s * US_PER_S,
                "dur": max(sp.end_s - sp.start_s, 0.0) * US_PER_S,
                "pid": d,
                "tid": order[sp.pipeline] * _LANE_TID_STRIDE + lane + 1,
                "args": {
                    "pipeline": sp.pipeline,
                    "step": sp.step,
                    "rank": sp.rank,
                    "share": sp.compute_share,
                    "tokens": sp.tokens,
                    "flops": sp.flops,
                    "devices": list(sp.devices),
                },
            }
        )
    return out, threads


def _metadata(
    info: RunInfo, threads: set[tuple[int, str, int]], order: dict[str, int]
) -> list[dict[str, Any]]:
    """Process / thread names and sort indices."""
    out: list[dict[str, Any]] = []
    for d in range(info.num_devices):
        out.append(_meta("process_name", d, 0, {"name": f"device {d} ({info.accelerator})"}))
        out.append(_meta("process_sort_index", d, 0, {"sort_index": d}))
    for d, pipe, lane in sorted(threads, key=lambda t: (t[0], order[t[1]], t[2])):
        tid = order[pipe] * _LANE_TID_STRIDE + lane + 1
        name = pipe if lane == 0 else f"{pipe} #{lane + 1}"
        out.append(_meta("thread_name", d, tid, {"name": name}))
        out.append(_meta("thread_sort_index", d, tid, {"sort_index": tid}))
    steps_pid = info.num_devices
    out.append(_meta("process_name", steps_pid, 0, {"name": "pipelines"}))
    out.append(_meta("process_sort_index", steps_pid, 0, {"sort_index": steps_pid}))
    for pipe, i in order.items():
        out.append(_meta("thread_name", steps_pid, i + 1, {"name": pipe}))
    return out


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _token_counters(events: list[Event], pid: int) -> list[dict[str, Any]]:
    """A counter per pipeline of finished (prompt + response) tokens, stepping at each sample."""
    out: list[dict[str, Any]] = []
    finished_tokens: dict[str, int] = defaultdict(int)
    samples = sorted((e for e in events if isinstance(e, SampleFinished)), key=lambda e: e.time_s)
    for s in samples:
        finished_tokens[s.pipeline] += s.prompt_tokens + s.response_tokens
        out.append(
            {
                "name": f"finished tokens {s.pipeline}",
                "ph": "C",
                "ts": s.time_s * US_PER_S,
                "pid": pid,
                "args": {"tokens": finished_tokens[s.pipeline]},
            }
        )
    return out


def _pipeline_events(events: list[Event], info: RunInfo, order: dict[str, int]) -> list[dict]:
    """Step slices, step-end and failure instants, and finished-token counters."""
    pid = info.num_devices
    out = _token_counters(events, pid)
    for ev in events:
        tid = order[ev.pipeline] + 1
        if isinstance(ev, StepFinished):
            base = {"pid": pid, "tid": tid, "cat": "step"}
            args = {"pipeline": ev.pipeline, "step": ev.step, **ev.timings_s}
            out.append(
                {
                    **base,
                    "name": f"step {ev.step}",
                    "ph": "X",
                    "ts": ev.start_s * US_PER_S,
                    "dur": max(ev.end_s - ev.start_s, 0.0) * US_PER_S,
                    "args": args,
                }
            )
            out.append(
                {
                    **base,
                    "name": f"step {ev.step} done",
                    "ph": "i",
                    "s": "p",
                    "ts": ev.end_s * US_PER_S,
                    "args": args,
                }
            )
        elif isinstance(ev, PipelineFailed):
            out.append(
                {
                    "name": f"failed: {ev.error}",
                    "cat": "failure",
                    "ph": "i",
                    "s": "g",
                    "ts": ev.time_s * US_PER_S,
                    "pid": pid,
                    "tid": tid,
                    "args": {"pipeline": ev.pipeline, "step": ev.step, "error": ev.error},
                }
            )
    return out


def trace_dict(events: Iterable[Event], info: RunInfo) -> dict[str, Any]:
    """Build the trace as a dict (see the module docstring for the layout)."""
    evs = list(events)
    order = _pipeline_order(evs, info)
    spans = [e for e in evs if isinstance(e, Span)]
    span_events, threads = _span_events(spans, order)
    trace_events = _metadata(info, threads, order) + span_events
    trace_events += _pipeline_events(evs, info, order)
    return {
        "traceEvents": trace_events,
        "displayTimeUnit": "ms",
        "otherData": {k: str(v) for k, v in info.to_dict().items()},
    }


def write_trace(path: Path, events: Iterable[Event], info: RunInfo) -> None:
    """Write the Chrome trace-event JSON of a run to ``path`` (open it in ui.perfetto.dev).

    Args:
        path: the ``.json`` file to write (its folder must exist).
        events: the run's events, any order.
        info: the run's facts (device count and accelerator name label the processes).
    """
    data = trace_dict(events, info)
    with Path(path).open("w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"), allow_nan=False)
    logger.info("wrote %d trace events to %s", len(data["traceEvents"]), path)
