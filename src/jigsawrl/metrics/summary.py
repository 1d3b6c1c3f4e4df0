"""From events to one JSON-able summary of a run: throughput, latency, utilisation, MFU and cost.

Every executor (simulated or Ray) emits the same events (:mod:`jigsawrl.events`), so this module
does not know which one ran. It is the single place where the run's headline numbers are defined;
the CLI tables, ``summary.json`` and ``docs/BENCHMARKS.md`` all read what :func:`summarize` returns.

Definitions (all times in seconds of the executor's clock; ``N`` = ``num_devices``):

``t0_s``, ``end_s``, ``makespan_s``
    ``t0_s`` is the earliest start of any span or step (0 when the run has neither); ``end_s`` the
    latest time of any event (span end, sample, step end, failure). ``makespan_s = end_s - t0_s``.
``throughput_tokens_per_s``
    prompt + response tokens of :class:`SampleFinished` events of all pipelines, divided by the
    makespan. Only *finished* samples count: a request aborted, still running at the end, or lost
    with a failed pipeline contributes nothing, however many tokens it decoded.
``perf/throughput``
    verl's name: ``throughput_tokens_per_s / N`` (tokens per second per device).
``busy_fraction``
    for each device, the length of the *union* of the intervals of spans on it whose stage is in
    :data:`DEVICE_STAGES` (a span with several devices covers each of them); summed over devices
    and divided by ``N × makespan``. Overlapping spans are not double counted; ``tool_wait`` spans
    (the device waits for a tool) and gaps are idle.
``compute_utilisation``
    for each device, the integral over time of ``min(1, Σ compute_share of device spans running on
    it)``; summed over devices and divided by ``N × makespan``. Two co-located spans at share 0.5
    each fill one device; a span at share 0.5 alone fills half of it.
``mfu``
    Σ ``Span.flops`` (the useful model FLOPs of the span, all its devices together) over all spans,
    divided by ``N × peak_flops_per_device × makespan``.
``cost_usd``
    ``N × price_per_device_hour_usd × makespan / 3600``: the whole pool is paid for the whole run,
    idle or not. ``cost_per_million_tokens_usd = cost_usd / (finished tokens / 1e6)``.
``floor_s``, ``efficiency_floor``
    the makespan *floor* of the cost model (:mod:`jigsawrl.graph.bound`: each longest request
    decoded alone at batch 1, no decode work counted; ``RunInfo.lower_bound_s``) and
    ``floor_s / makespan_s``; null without a floor. Before schema 2 these were ``lower_bound_s``
    (in ``run_info``) and ``efficiency``.
``bound_s``, ``efficiency``, ``bound_note``, ``bound_terms``
    the realistic makespan bound (:mod:`jigsawrl.graph.makespan_bound`: batching, KV growth,
    post-rollout chains, the pool's bandwidth and compute) and ``efficiency = bound_s /
    makespan_s``; both null, with the reason in ``bound_note``, when the run has no bound (a real
    run: the bound needs the simulator's true requests). ``bound_note`` also says when the
    makespan is *below* ``bound_s`` (``efficiency`` > 1): the run broke an assumption of the bound
    (a TP change mid-rollout, passes streamed during the rollout, truth noise). ``bound_terms``: the bound's terms, as computed.
``perf/time_per_step``
    mean step latency (below) over the :class:`StepFinished` events of all pipelines.
``mean_latency_vs_solo``
    mean over pipelines of their ``latency_vs_solo`` (those where it is known).
``latency_bounds_missed``
    the pipelines whose ``within_latency_bound`` is false.

Per pipeline (``pipelines`` list, in ``RunInfo.pipelines`` order, then any other pipeline seen):

``steps``, ``samples``, ``tokens``
    count of finished steps, of finished samples, and their prompt + response tokens.
``tokens_per_s``
    ``tokens / makespan_s`` (the run's makespan, so the pipelines' rates add up to the total).
``mean_step_latency_s``, ``p50_step_latency_s``, ``p90_step_latency_s``
    mean / percentiles (linear interpolation) of its finished steps' *latencies*. A step's
    latency runs from when the pipeline was ready for it to its weight sync: from the end of its
    previous step (``StepFinished.end_s`` of step ``k - 1``), and for the first step from the
    pipeline's arrival (``RunInfo.arrival_s``; the run's ``t0_s`` when not given). So time spent
    waiting for devices behind other pipelines counts, as verl's ``timing_s/step`` counts a
    trainer loop's whole iteration. (``StepFinished.start_s``, the rollout's launch, is used
    only for a step whose previous step never finished.) For an async pipeline, whose rollout of
    step ``k`` may start before step ``k - 1`` ends, this is the time between two weight syncs.
``latency_vs_solo``
    ``mean_step_latency_s / solo_step_latency_s[pipeline]`` when the solo latency is known
    (present, finite and > 0); null otherwise.
``max_latency_ratio``, ``within_latency_bound``
    the pipeline's bound (``RunInfo.latency_bounds``; null: none set) and whether its
    ``latency_vs_solo`` stayed within it (null: no bound, or the solo latency unknown).
``timing_s/*``
    verl's names, each a mean over the pipeline's finished steps of the *wall extent* (latest end
    minus earliest start) of that step's spans of the stage(s): ``gen`` = all rollout stages
    (prefill, decode_*, tool_wait), ``reward``, ``old_log_prob`` = old_logprob, ``ref`` =
    ref_logprob, ``update_actor`` = actor_update, ``update_weights`` = weight_sync. A stage with
    no span in a step falls back to ``StepFinished.timings_s`` (key as verl's or the stage name),
    else counts 0. ``timing_s/step`` is the mean step latency (as defined above).
``tool_wait_s``
    Σ duration of the pipeline's ``tool_wait`` spans (worker-seconds spent with every request of
    a worker waiting for tools; not multiplied by the worker's device count).
``device_s``
    Σ ``duration × len(devices) × compute_share`` over its device-stage spans.
``perf/mfu/actor``
    Σ flops of its ``actor_update`` spans / (peak × Σ ``duration × len(devices)`` of those spans):
    MFU during the update, against whole devices (as verl measures it), null without such spans.
``failed``
    the error of its first :class:`PipelineFailed` event, or null; ``failed_step`` likewise.

A quantity that is undefined (division by a zero makespan, no steps) is ``null``, never 0 or NaN.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from jigsawrl.events import (
    Event,
    PipelineFailed,
    SampleFinished,
    Span,
    StepFinished,
)
from jigsawrl.stages import DEVICE_STAGES, VERL_TIMING, Stage

logger = logging.getLogger(__name__)

# 2: ``efficiency`` is against ``bound_s`` (the realistic bound); the old floor and its ratio are
# ``floor_s`` / ``efficiency_floor``; step latencies run from the previous step's end (or the
# pipeline's arrival), not from the rollout's launch.
SCHEMA_VERSION = 2

# verl timing key -> the stages whose wall extent it measures, then fallback keys in timings_s.
TIMING_STAGES = VERL_TIMING
_DEVICE_STAGE_SET = frozenset(DEVICE_STAGES)


@dataclass(frozen=True)
class RunInfo:
    """What the metrics need to know about a run besides its events.

    Args:
        name: run name.
        policy: scheduler name.
        seed: the run's seed.
        num_devices: devices in the pool (every device is paid for and counted idle when unused).
        accelerator: accelerator preset name.
        peak_flops_per_device: dense peak FLOP/s of one device (the MFU denominator).
        price_per_device_hour_usd: price of one device-hour.
        pipelines: names of the pipelines, in display order.
        solo_step_latency_s: each pipeline's mean step latency when run alone on the pool.
        lower_bound_s: the makespan floor of the cost model (``floor_s``; the name predates
            the realistic bound).
        executor: ``"simulated"`` or ``"ray"``.
        bound_s: the realistic makespan bound (``bound_s``), None when there is none.
        bound_note: why there is no bound, or a remark on it.
        bound_terms: the bound's terms (``graph.makespan_bound.BoundReport.terms``).
        arrival_s: when each pipeline arrived (its ``start_s``): the start of its first step's
            latency.
        latency_bounds: each bounded pipeline's ``max_latency_ratio`` (none: no bound set).

    Raises:
        ValueError: a count or rate out of range.
    """

    name: str
    policy: str
    seed: int
    num_devices: int
    accelerator: str
    peak_flops_per_device: float
    price_per_device_hour_usd: float
    pipelines: tuple[str, ...]
    solo_step_latency_s: dict[str, float] | None = None
    lower_bound_s: float | None = None
    executor: str = "simulated"
    bound_s: float | None = None
    bound_note: str | None = None
    bound_terms: dict[str, float] | None = None
    arrival_s: dict[str, float] | None = None
    latency_bounds: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.num_devices < 1:
            raise ValueError(f"num_devices must be >= 1, got {self.num_devices}")
        if not self.peak_flops_per_device > 0:
            raise ValueError(f"peak_flops_per_device must be > 0, got {self.peak_flops_per_device}")
        if self.price_per_device_hour_usd < 0:
            raise ValueError(f"price must be >= 0, got {self.price_per_device_hour_usd}")
        object.__setattr__(self, "pipelines", tuple(self.pipelines))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (stored as ``run_info`` in the summary)."""
        d = asdict(self)
        d["pipelines"] = list(self.pipelines)
        if self.solo_step_latency_s is not None:  # a NaN is not JSON: an unknown solo is absent
            d["solo_step_latency_s"] = {
                k: v for k, v in self.solo_step_latency_s.items() if math.isfinite(v)
            }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunInfo:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["pipelines"] = tuple(d.get("pipelines", ()))
        return cls(**d)


@dataclass
class _Events:
    """The events of a run, split by kind (one pass over an iterable)."""

    spans: list[Span] = field(default_factory=list)
    samples: list[SampleFinished] = field(default_factory=list)
    steps: list[StepFinished] = field(default_factory=list)
    failures: list[PipelineFailed] = field(default_factory=list)

    @classmethod
    def split(cls, events: Iterable[Event]) -> _Events:
        out = cls()
        for ev in events:
            if isinstance(ev, Span):
                out.spans.append(ev)
            elif isinstance(ev, SampleFinished):
                out.samples.append(ev)
            elif isinstance(ev, StepFinished):
                out.steps.append(ev)
            elif isinstance(ev, PipelineFailed):
                out.failures.append(ev)
            else:
                raise TypeError(f"not an event: {ev!r}")
        return out

    def time_range(self) -> tuple[float, float]:
        """``(t0_s, end_s)`` as defined in the module docstring."""
        starts = [s.start_s for s in self.spans] + [s.start_s for s in self.steps]
        ends = (
            [s.end_s for s in self.spans]
            + [s.time_s for s in self.samples]
            + [s.end_s for s in self.steps]
            + [f.time_s for f in self.failures]
        )
        t0 = min(starts) if starts else 0.0
        end = max(ends) if ends else t0
        return t0, max(end, t0)


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals ``[starts[i], ends[i])`` (overlaps counted once)."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # A new merged segment begins where an interval starts after everything before it has ended.
    new_seg = np.empty(len(s), dtype=bool)
    new_seg[0] = True
    new_seg[1:] = s[1:] > reach[:-1]
    seg_start = s[new_seg]
    last_idx = np.append(np.flatnonzero(new_seg)[1:] - 1, len(s) - 1)
    return float(np.sum(reach[last_idx] - seg_start))


def capped_share_integral(starts: np.ndarray, ends: np.ndarray, shares: np.ndarray) -> float:
    """∫ min(1, Σ shares of intervals covering t) dt: device compute used, capped at one device."""
    if len(starts) == 0:
        return 0.0
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([shares, -shares])
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    level = np.clip(np.cumsum(deltas)[:-1], 0.0, 1.0)
    return float(np.sum(level * np.diff(times)))


def _device_intervals(spans: Sequence[Span], num_devices: int) -> dict[int, list[Span]]:
    """Device-stage spans per device (a span with several devices is listed under each)."""
    per_device: dict[int, list[Span]] = defaultdict(list)
    for sp in spans:
        if sp.stage not in _DEVICE_STAGE_SET:
            continue
        for d in sp.devices:
            if not 0 <= d < num_devices:
                raise ValueError(
                    f"span {sp.pipeline}/{sp.step}/{sp.stage}/{sp.rank} is on device {d}, "
                    f"outside the pool of {num_devices} devices"
                )
            per_device[d].append(sp)
    return per_device


def device_metrics(spans: Sequence[Span], num_devices: int) -> tuple[list[float], list[float]]:
    """Per device: busy seconds (union of device spans) and capped share-seconds."""
    busy = [0.0] * num_devices
    used = [0.0] * num_devices
    for d, dspans in _device_intervals(spans, num_devices).items():
        starts = np.fromiter((s.start_s for s in dspans), float, len(dspans))
        ends = np.fromiter((s.end_s for s in dspans), float, len(dspans))
        shares = np.fromiter((s.compute_share for s in dspans), float, len(dspans))
        busy[d] = union_length(starts, ends)
        used[d] = capped_share_integral(starts, ends, shares)
    return busy, used


def _div(num: float, den: float) -> float | None:
    """``num / den``, or None when undefined (zero or non-finite denominator, non-finite result).

    An undefined metric is null in the summary, never NaN (which is not JSON) nor a made-up 0.
    """
    if not (den > 0 and math.isfinite(den)):
        return None
    q = num / den
    return q if math.isfinite(q) else None


def _extent(spans: Iterable[Span]) -> float | None:
    """Wall extent (latest end - earliest start) of some spans, None when there are none."""
    lo, hi = math.inf, -math.inf
    for sp in spans:
        lo, hi = min(lo, sp.start_s), max(hi, sp.end_s)
    return hi - lo if hi >= lo else None


def step_latencies(steps: Iterable[StepFinished], arrival_s: Mapping[str, float] | None = None,
                   t0_s: float = 0.0) -> dict[tuple[str, int], float]:
    """Each finished step's latency, keyed ``(pipeline, step)`` (module docstring): from the end
    of the pipeline's previous step, for step 0 from its arrival (``arrival_s``, else ``t0_s``),
    and from the step's own ``start_s`` when its previous step never finished."""
    steps = list(steps)
    ends = {(s.pipeline, s.step): s.end_s for s in steps}
    arrival = arrival_s or {}
    out: dict[tuple[str, int], float] = {}
    for st in steps:
        if st.step == 0:
            ready = arrival.get(st.pipeline, t0_s)
        else:
            ready = ends.get((st.pipeline, st.step - 1), st.start_s)
        out[(st.pipeline, st.step)] = st.end_s - ready
    return out


def _step_timings(
    steps: Sequence[StepFinished], spans_by_step: dict[int, list[Span]],
    latency: Mapping[tuple[str, int], float],
) -> dict[str, float | None]:
    """Mean per finished step of each verl ``timing_s/*`` key (module docstring)."""
    out: dict[str, float | None] = {}
    for key, stages in TIMING_STAGES.items():
        values = []
        for st in steps:
            ext = _extent(sp for sp in spans_by_step.get(st.step, ()) if sp.stage in stages)
            if ext is None:
                ext = st.timings_s.get(key, st.timings_s.get(stages[0], 0.0))
            values.append(ext)
        out[f"timing_s/{key}"] = float(np.mean(values)) if values else None
    lat = [latency[(st.pipeline, st.step)] for st in steps]
    out["timing_s/step"] = float(np.mean(lat)) if lat else None
    return out


def _pipeline_summary(name: str, ev: _Events, info: RunInfo, makespan: float,
                      latency: Mapping[tuple[str, int], float]) -> dict[str, Any]:
    """One entry of the ``pipelines`` list (filtered to pipeline ``name``)."""
    spans = [s for s in ev.spans if s.pipeline == name]
    steps = sorted((s for s in ev.steps if s.pipeline == name), key=lambda s: s.step)
    samples = [s for s in ev.samples if s.pipeline == name]
    fails = sorted((f for f in ev.failures if f.pipeline == name), key=lambda f: f.time_s)
    spans_by_step: dict[int, list[Span]] = defaultdict(list)
    for sp in spans:
        spans_by_step[sp.step].append(sp)
    lat = np.array([latency[(s.pipeline, s.step)] for s in steps], dtype=float)
    tokens = sum(s.prompt_tokens + s.response_tokens for s in samples)
    mean_lat = float(lat.mean()) if len(lat) else None
    solo = (info.solo_step_latency_s or {}).get(name)
    ratio = _div(mean_lat, solo) if (mean_lat is not None and solo) else None
    bound = (info.latency_bounds or {}).get(name)
    actor = [s for s in spans if s.stage == Stage.ACTOR_UPDATE]
    actor_dev_s = sum(s.duration_s * len(s.devices) for s in actor)
    return {
        "name": name,
        "steps": len(steps),
        "samples": len(samples),
        "tokens": tokens,
        "tokens_per_s": _div(tokens, makespan),
        "mean_step_latency_s": mean_lat,
        "p50_step_latency_s": float(np.percentile(lat, 50)) if len(lat) else None,
        "p90_step_latency_s": float(np.percentile(lat, 90)) if len(lat) else None,
        "latency_vs_solo": ratio,
        "max_latency_ratio": bound,
        "within_latency_bound": None if bound is None or ratio is None else ratio <= bound,
        **_step_timings(steps, spans_by_step, latency),
        "tool_wait_s": sum((s.duration_s for s in spans if s.stage == Stage.TOOL_WAIT), 0.0),
        "device_s": sum(
            s.duration_s * len(s.devices) * s.compute_share
            for s in spans
            if s.stage in _DEVICE_STAGE_SET
        ),
        "perf/mfu/actor": _div(
            sum(s.flops for s in actor), info.peak_flops_per_device * actor_dev_s
        ),
        "failed": fails[0].error if fails else None,
        "failed_step": fails[0].step if fails else None,
    }


def _pipeline_names(ev: _Events, info: RunInfo) -> list[str]:
    """``info.pipelines`` first, then any other pipeline named by an event (sorted)."""
    seen = {e.pipeline for group in (ev.spans, ev.samples, ev.steps, ev.failures) for e in group}
    extra = sorted(seen - set(info.pipelines))
    if extra:
        logger.warning("events name pipelines not in RunInfo.pipelines: %s", extra)
    return list(info.pipelines) + extra


def summarize(events: Iterable[Event], info: RunInfo) -> dict[str, Any]:
    """Summarise a run's events into a JSON-able dict (definitions in the module docstring).

    Args:
        events: every event the run emitted, in any order.
        info: the run's static facts (pool size, peak FLOP/s, price, solo latencies, ...).

    Returns:
        The summary: run identity, headline metrics, per-device and per-pipeline entries.

    Raises:
        ValueError: a span on a device outside ``range(info.num_devices)``.
        TypeError: an object that is not an event.
    """
    ev = _Events.split(events)
    t0, end = ev.time_range()
    makespan = end - t0
    latency = step_latencies(ev.steps, info.arrival_s, t0)
    pipes = [_pipeline_summary(p, ev, info, makespan, latency) for p in _pipeline_names(ev, info)]
    ratios = [p["latency_vs_solo"] for p in pipes if p["latency_vs_solo"] is not None]
    step_lat = list(latency.values())
    return {
        "schema_version": SCHEMA_VERSION,
        "name": info.name,
        "policy": info.policy,
        "seed": info.seed,
        "executor": info.executor,
        "num_devices": info.num_devices,
        "accelerator": info.accelerator,
        "t0_s": t0,
        "end_s": end,
        "makespan_s": makespan,
        "samples": len(ev.samples),
        "steps": len(ev.steps),
        **_pool_metrics(ev, info, makespan),
        "perf/time_per_step": float(np.mean(step_lat)) if step_lat else None,
        **_bound_metrics(info, makespan),
        "mean_latency_vs_solo": float(np.mean(ratios)) if ratios else None,
        "latency_bounds_missed": [p["name"] for p in pipes if p["within_latency_bound"] is False],
        "failed_pipelines": [p["name"] for p in pipes if p["failed"] is not None],
        "pipelines": pipes,
        "run_info": info.to_dict(),
    }


NO_BOUND_NOTE = "no makespan bound: it needs the simulator's true requests (a real run)"


def _bound_metrics(info: RunInfo, makespan: float) -> dict[str, Any]:
    """``floor_s``, ``efficiency_floor``, ``bound_s``, ``efficiency``, ``bound_note`` and
    ``bound_terms`` (module docstring)."""
    floor, bound = info.lower_bound_s, info.bound_s
    eff = _div(bound, makespan) if bound is not None else None
    note = info.bound_note
    if bound is None and note is None:
        note = NO_BOUND_NOTE
    elif eff is not None and eff > 1.0:
        note = (f"makespan {makespan:.6g} s is below bound_s {bound:.6g} s: the run broke an "
                "assumption of the bound (a pipeline's TP changed mid-rollout, its passes "
                "streamed during the rollout, or truth noise made it lucky)") + (f"; {note}" if note else "")
    return {
        "floor_s": floor,
        "efficiency_floor": _div(floor, makespan) if floor is not None else None,
        "bound_s": bound,
        "efficiency": eff,
        "bound_note": note,
        "bound_terms": dict(info.bound_terms) if info.bound_terms is not None else None,
    }


def _pool_metrics(ev: _Events, info: RunInfo, makespan: float) -> dict[str, Any]:
    """Tokens, throughput, busy / compute fractions, MFU and cost of the whole pool."""
    n = info.num_devices
    pool_s = n * makespan
    busy, used = device_metrics(ev.spans, n)
    tokens_p = sum(s.prompt_tokens for s in ev.samples)
    tokens_r = sum(s.response_tokens for s in ev.samples)
    tokens = tokens_p + tokens_r
    cost = n * info.price_per_device_hour_usd * makespan / 3600.0
    throughput = _div(tokens, makespan)
    return {
        "prompt_tokens": tokens_p,
        "response_tokens": tokens_r,
        "tokens": tokens,
        "throughput_tokens_per_s": throughput,
        "perf/throughput": throughput / n if throughput is not None else None,
        "busy_fraction": _div(sum(busy), pool_s),
        "compute_utilisation": _div(sum(used), pool_s),
        "device_busy_fraction": [_div(b, makespan) for b in busy],
        "mfu": _div(sum(s.flops for s in ev.spans), info.peak_flops_per_device * pool_s),
        "cost_usd": cost,
        "cost_per_million_tokens_usd": _div(cost, tokens / 1e6),
    }
