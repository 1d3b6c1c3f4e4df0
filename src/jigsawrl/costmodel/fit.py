"""The fitting half of ``jigsawrl profile`` (numpy only): measured sub-stage times -> cost model.

The measuring half (torch, the real engine) is :mod:`jigsawrl.experiments.profiling`.


What: with the real CPU engine (``jigsawrl.engine``) and for each torch thread count (a CPU
worker's "compute share"), time

- decode iterations of :class:`~jigsawrl.engine.rollout.RolloutEngine` over a grid of batch
  sizes and prompt lengths (short / long KV context), one median per grid point;
- prefill: the engine's first iteration over each batch of prompts;
- log-probs (``compute_logprobs``) and one GRPO update (forward + backward + AdamW) on a
  :class:`~jigsawrl.engine.trainer.TrainBatch`;
- weight sync: ``RolloutEngine.load_weights`` of the trainer's state dict into the engine's model;
- a plain memory copy (the memory bandwidth the cost model's memory terms use);
- once, not per thread count (``runtime``): the built-in tasks' reward functions per sample, and
  through Ray between two worker processes an actor call and a transfer of the model's weights
  (:mod:`jigsawrl.executors.raycluster.probe`), and the wait between two stages of a short real
  run on the Ray executor (:mod:`jigsawrl.experiments.stage_gap`): what a real run pays per
  stage beside compute,

then fit the :class:`~jigsawrl.costmodel.CostModel`'s own shape at the largest thread count
(the full share) and write a YAML profile that :func:`jigsawrl.costmodel.profile.load_profile`
reads back.

Why: DESIGN.md §6 asks every cost-model constant to come from a datasheet or a measured profile;
``workload/realpresets.py``'s CPU numbers are guesses. The fit keeps the cost model's formulas
(not a lookup table), so that the simulator can extrapolate to batches it never measured:

- decode iteration ``t = k0 + k_seq * batch + 2 P batch / R_decode + c_ctx * ctx``:
  non-negative least squares on the four coefficients (``P`` parameters, ``ctx`` the KV tokens
  attended); ``k0`` is ``iter_overhead_s``, ``k_seq`` ``iter_overhead_per_seq_s``, ``c_ctx``
  ``decode_ctx_s_per_token`` (attention's measured price, in place of its FLOPs at
  ``R_decode``); at one thread count ``k_seq`` is 0 and the FLOP term carries it;
- the log-prob, update and weight-sync points are timed in rounds, every point once a round
  (as the decode grid), so that a slow spell hits one round of each rather than one point;
- prefill, log-prob and train times become effective FLOP rates (``2P`` per token forward,
  ``6P`` forward + backward; the model's fixed and memory terms subtracted first);
- ``peak_flops`` is the largest of the rates, each stage's efficiency its rate over that peak;
- thread counts become a slowdown table, time(threads) / time(max threads), per stage.

The fitting half is numpy only (tested without torch); torch is imported by the measuring half.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from jigsawrl.costmodel.cpu import cpu_worker_params
from jigsawrl.costmodel.memory import TRAIN_STATE_BYTES_PER_PARAM
from jigsawrl.costmodel.model import CostModel
from jigsawrl.costmodel.profile import PROFILE_VERSION, cost_inputs
from jigsawrl.costmodel.roofline import CostParams, prefill_flops
from jigsawrl.costmodel.train_cost import ADAM_BYTES_PER_PARAM
from jigsawrl.errors import ConfigError
from jigsawrl.stages import Stage
from jigsawrl.workload.models import ModelSpec

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """What ``jigsawrl profile`` measures (defaults: a < 60 s run for qwen2-1m at 1 thread — a
    Ray CPU worker's full share; the largest count is the full share a run must give each
    device, :func:`~jigsawrl.costmodel.profile.check_full_share`).

    ``decode_iters`` decode iterations are timed per (batch, prompt length) point, in each of
    ``repeats`` sweeps of the grid; a point keeps the median over sweeps of its per-sweep medians.
    The training-side passes run ``repeats`` times after one warm-up.
    """

    model: str = "qwen2-1m"
    threads: tuple[int, ...] = (1,)
    batches: tuple[int, ...] = (1, 4, 16, 64)
    prompt_lens: tuple[int, ...] = (16, 192)
    decode_iters: int = 16
    train_seqs: int = 16
    train_len: int = 128
    repeats: int = 3
    seed: int = 0
    runtime: bool = True  # also measure reward and Ray call / transfer costs (see module doc)

    @classmethod
    def quick(cls, model: str = "qwen2-1m", threads: tuple[int, ...] = (1,)) -> ProfileSettings:
        """A smaller grid (~10 s per thread count for qwen2-1m), for tests and a first look."""
        return cls(model=model, threads=threads, batches=(1, 4, 16), prompt_lens=(16, 96),
                   decode_iters=10, train_seqs=8, train_len=64, repeats=2)


def parse_threads(text: str) -> tuple[int, ...]:
    """``"1,2"`` -> ``(1, 2)``, sorted and unique.

    Raises:
        ConfigError: an empty list or an entry that is not an integer >= 1.
    """
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise ConfigError(f"bad thread list {text!r}", where="--threads",
                          fix="give comma-separated integers >= 1, e.g. 1,2")
    return tuple(values)


# ============================================================================ fitting (numpy only


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``min |a x - y|`` with ``x >= 0``, exactly, for a few columns.

    Enumerates the active sets (2^columns unconstrained solves): the feasible solution with the
    smallest residual is the constrained optimum, since the problem is convex.
    """
    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(y * y))
    for mask in range(1, 2**n):
        cols = [j for j in range(n) if mask >> j & 1]
        sol, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if np.any(sol < 0):
            continue
        x = np.zeros(n)
        x[cols] = sol
        res = float(np.sum((a @ x - y) ** 2))
        if res < best_res:
            best, best_res = x, res
    return best


@dataclass(frozen=True, slots=True)
class DecodeFit:
    """``t = overhead_s + per_seq_s * batch + 2 P batch * s_per_flop + s_per_ctx_token * ctx``
    (at a share: the last two over it)."""

    overhead_s: float
    per_seq_s: float
    s_per_flop: float
    s_per_ctx_token: float = 0.0


def decode_features(model: ModelSpec, batch: float, ctx_tokens: float,
                    share: float = 1.0) -> list[float]:
    """Columns of the decode fit: 1, batch, the iteration's dense FLOPs and the KV tokens it
    attends, both over the share (attention's FLOPs are in the context column's price)."""
    return [1.0, float(batch), 2.0 * model.num_params * batch / share, ctx_tokens / share]


def fit_decode(model: ModelSpec, points: Sequence[dict[str, float]]) -> DecodeFit:
    """Fit the decode line to ``{"batch", "ctx_tokens", "time_s"[, "share"]}`` points.

    As in :class:`CostModel`, only the FLOP and context terms slow on a ``share`` < 1 (default
    1); the overheads do not. Relative least squares (each row divided by its time), so that
    batch-1 points in milliseconds weigh as much as batch-64 points in tens of milliseconds.
    The context is priced on its own column (``s_per_ctx_token``, which replaces attention's
    FLOPs at the fitted rate in the cost model): with the FLOPs alone four profiles of this CPU
    missed their own grid by up to 16-28% (the line too flat in the context), with it by 4-13%
    (one taken right after boot: 27%), and batch-128 points outside the grid by 1-15% instead of
    4-35% (docs/BENCHMARKS.md, 2026-12-07). At one share the batch column is the dense FLOPs'
    twin (2 P per sequence): the per-sequence overhead cannot be told from the FLOP term, which
    then carries it (points at several shares separate them).
    """
    if len(points) < 3:
        raise ValueError(f"the decode fit needs >= 3 points, got {len(points)}")
    a = np.array([decode_features(model, p["batch"], p["ctx_tokens"], p.get("share", 1.0))
                  for p in points])
    y = np.array([p["time_s"] for p in points])
    scale = np.array([1.0, 1e-2, 1e-9, 1e-6])  # condition the columns (s, s/seq, s/GFLOP, s/ktok)
    rows = (a * scale) / y[:, None]
    cols = [0, 1, 2, 3] if np.linalg.matrix_rank(rows) == 4 else [0, 2, 3]
    x = np.zeros(4)
    x[cols] = nnls(rows[:, cols], np.ones_like(y)) * scale[cols]
    return DecodeFit(float(x[0]), float(x[1]), float(x[2]), float(x[3]))


def prefill_rate(model: ModelSpec, points: Sequence[dict[str, float]], fit: DecodeFit) -> float:
    """Median effective prefill FLOP rate, the iteration overheads of ``fit`` subtracted.

    Points are ``{"tokens", "seqs", "time_s"}``; only the larger half (by tokens) is used, where
    the FLOPs, not the overheads, dominate.
    """
    big = sorted(points, key=lambda p: p["tokens"])[len(points) // 2:]
    rates = []
    for p in big:
        fixed = fit.overhead_s + fit.per_seq_s * p["seqs"]
        busy = max(p["time_s"] - fixed, 0.1 * p["time_s"])
        rates.append(prefill_flops(model, p["tokens"], 0, int(p["seqs"])) / busy)
    return statistics.median(rates)


def fit_params(model: ModelSpec, raw_by_threads: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The fitted section of a profile from the raw medians of each thread count.

    The decode line is fitted to every thread count at once (share = threads / max threads);
    the FLOP rates, bandwidth and weight-sync overhead come from the largest thread count.

    Returns ``{"accelerator": {...}, "params": {...}, "rates_flops_per_s": {...}}``, in the
    units of :class:`~jigsawrl.workload.accelerators.AcceleratorSpec` and :class:`CostParams`.
    """
    p = model.num_params
    top = max(raw_by_threads)
    raw = raw_by_threads[top]
    fit = fit_decode(model, [{**q, "share": t / top} for t, r in raw_by_threads.items()
                             for q in r["decode"]])
    mem_bw = 2.0 * raw["memcpy"]["bytes"] / raw["memcpy"]["time_s"]  # read + write
    # the cost model's Adam step, subtracted from the measured update time before the train
    # FLOP rate is computed
    adam = ADAM_BYTES_PER_PARAM * p / mem_bw
    lp_s_per_token, lp_over = pass_line(raw, "logprob", 0.0)
    tr_s_per_token, tr_over = pass_line(raw, "train", adam)
    buckets = {k: v for k, v in (
        ("logprob", bucket_tokens(raw, "logprob", (lp_s_per_token, lp_over), 0.0)),
        ("train", bucket_tokens(raw, "train", (tr_s_per_token, tr_over), adam)))
        if v is not None}
    rates = {
        Stage.PREFILL: prefill_rate(model, raw[Stage.PREFILL], fit),
        "decode": 1.0 / fit.s_per_flop if fit.s_per_flop > 0 else 0.0,
        "logprob": 2.0 * p / lp_s_per_token,
        "train": 6.0 * p / tr_s_per_token,
    }
    peak = max(rates.values())
    if rates["decode"] == 0.0:  # no measurable FLOP term: decode at peak, all in the overheads
        log.info("decode fit found no FLOP term; decode_compute_eff set to 1")
        rates["decode"] = peak
    load = 2.0 * model.weight_bytes() / mem_bw  # CostModel.weight_sync_time_s's copy term
    params = {
        "prefill_eff": rates[Stage.PREFILL] / peak, "decode_compute_eff": rates["decode"] / peak,
        "hbm_bw_eff": 1.0, "logprob_eff": rates["logprob"] / peak,
        "train_eff": rates["train"] / peak, "iter_overhead_s": fit.overhead_s,
        "iter_overhead_per_seq_s": fit.per_seq_s, "decode_ctx_s_per_token": fit.s_per_ctx_token,
        "weight_sync_overhead_s": max(raw[Stage.WEIGHT_SYNC]["time_s"] - load, 0.0),
        "logprob_overhead_s": lp_over, "train_overhead_s": tr_over,
        "train_pads_rows": True,  # the trainer profiled here pads each micro-batch's rows
        # ... and forwards each GRPO group's prompt once (engine/shared_prompt.py): counted so
        # since the first steps' page faults are gone (docs/BENCHMARKS.md, "First steps")
        "train_shares_prompt": True,
        # the rollout engine prefills a GRPO group's shared prompt once (engine/batch.py)
        "rollout_shares_prompt": True,
    }
    if buckets:  # one value for both passes (the cost model's pass_tokens serves both)
        params["bucket_overhead_tokens"] = statistics.mean(buckets.values())
    accel = {"peak_flops": peak, "hbm_bytes_per_s": mem_bw,
             "host_link_bytes_per_s": mem_bw / 2.0}
    return {"accelerator": accel, "params": params, "rates_flops_per_s": rates,
            "bucket_overhead_tokens_by_pass": buckets}


def fit_runtime(runtime: dict[str, Any], host_link_bytes_per_s: float | None = None,
                threads: int = 1) -> dict[str, float]:
    """CostParams of the runtime measurements (see :func:`measure_runtime`); {} when absent.

    The transfer line ``time = 2 call + latency + bytes / bandwidth`` goes through the two
    measured sizes (each transfer is two actor calls: one hands the tensors out, one takes
    them); a reward call is one actor call plus the per-sample scoring. A train state's moves
    keep what their bytes' transfer over ``host_link_bytes_per_s`` (what the simulator charges
    for those bytes already) leaves of the measured time. The host's cores and the load beside
    its workers become slots of a device's ``threads`` (``host_slots``, ``host_load_slots``).
    """
    params: dict[str, float] = {}
    host = runtime.get("host_load")
    if host:
        params["host_slots"] = float(host["cores"]) / threads
        params["host_load_slots"] = float(host["load_cores"]) / threads
    if runtime.get("reward_s_per_sample") is not None:
        params["reward_s_per_sample"] = float(runtime["reward_s_per_sample"])
    if runtime.get("rank_setup_s") is not None:
        params["rollout_setup_s"] = float(runtime["rank_setup_s"])
    moves = runtime.get("state_move")
    if moves:
        nbytes = TRAIN_STATE_BYTES_PER_PARAM * float(moves["num_params"])
        by_bytes = (nbytes / host_link_bytes_per_s if host_link_bytes_per_s else 0.0) \
            + CostParams().host_transfer_latency_s
        params["state_onload_s"] = max(float(moves["onload_s"]) - by_bytes, 0.0)
        params["state_offload_s"] = max(float(moves["offload_s"]) - by_bytes, 0.0)
    ray_raw = runtime.get("ray")
    if not ray_raw:
        return params
    call = float(ray_raw["call_s"])
    (b1, t1), (b2, t2) = sorted((float(q["bytes"]), float(q["time_s"]))
                                for q in ray_raw["transfer"])
    slope = (t2 - t1) / (b2 - b1) if b2 > b1 and t2 > t1 else t2 / max(b2, 1.0)
    params.update(call_overhead_s=call, reward_overhead_s=call,
                  worker_link_bytes_per_s=1.0 / slope,
                  worker_link_latency_s=max(t1 - b1 * slope - 2.0 * call, 0.0))
    gap = runtime.get("stage_gap")
    if gap:  # the empty call is charged per stage already: the rest of the measured wait
        params["stage_gap_s"] = max(float(gap["gap_s"]) - call, 0.0)
        if gap.get("weight_sync_s"):  # measured whole, the call and its wait included
            params["weight_sync_s"] = float(gap["weight_sync_s"])
    return params


def pass_line(raw: dict[str, Any], key: str, fixed_s: float) -> tuple[float, float]:
    """Seconds per token and fixed seconds per call of a log-prob or update pass.

    With a second, smaller measurement (``raw[key + "_small"]``) the two points give a line
    ``time = overhead + tokens × slope`` (tiny passes are dominated by per-call costs: Python,
    per-layer kernel launches); without one, or when noise makes the slope non-positive, the
    overhead is 0 and the slope the large pass's time per token. ``fixed_s`` (the optimizer's
    memory-bound step, modelled apart) is taken off both points first.
    """
    big = raw[key]
    t_big = max(big["time_s"] - fixed_s, 0.5 * big["time_s"])
    small = raw.get(f"{key}_small")
    if small and small["tokens"] < big["tokens"]:
        t_small = max(small["time_s"] - fixed_s, 0.5 * small["time_s"])
        slope = (t_big - t_small) / (big["tokens"] - small["tokens"])
        if slope > 0:
            return slope, max(0.0, t_big - slope * big["tokens"])
    return t_big / big["tokens"], 0.0


def bucket_tokens(raw: dict[str, Any], key: str, line: tuple[float, float],
                  fixed_s: float) -> float | None:
    """What one more forward call of the shared-prompt forward costs, in positions of the
    pass's ``line`` (``(seconds per position, fixed seconds)``, :func:`pass_line`): the
    GRPO-shaped pass's (``raw[key + "_grpo"]``) time beyond what its positions predict, over
    its calls beyond the profiled line's two (prompts, one bucket). None without that point."""
    point = raw.get(f"{key}_grpo")
    slope, over = line
    if not point or point.get("buckets", 0) < 2 or slope <= 0:
        return None
    t = max(point["time_s"] - fixed_s, 0.5 * point["time_s"])
    return max(0.0, ((t - over) / slope - point["tokens"]) / (point["buckets"] - 1))


def _stage_times(raw: dict[str, Any]) -> dict[str, float]:
    """One representative time per stage of one thread count (for the slowdown table)."""
    dec = raw["decode"]
    small = min(dec, key=lambda q: (q["batch"], q["ctx_tokens"]))
    large = max(dec, key=lambda q: (q["batch"], q["ctx_tokens"]))
    pre = max(raw[Stage.PREFILL], key=lambda q: q["tokens"])
    return {Stage.PREFILL: pre["time_s"], Stage.DECODE_SMALL: small["time_s"],
            Stage.DECODE_LARGE: large["time_s"], Stage.OLD_LOGPROB: raw["logprob"]["time_s"],
            Stage.REF_LOGPROB: raw["logprob"]["time_s"], Stage.ACTOR_UPDATE: raw["train"]["time_s"],
            Stage.WEIGHT_SYNC: raw[Stage.WEIGHT_SYNC]["time_s"]}


def slowdown_table(raw_by_threads: dict[int, dict[str, Any]]) -> dict[str, dict[float, float]]:
    """stage -> {share: time(threads) / time(max threads)}, share = threads / max threads."""
    top = max(raw_by_threads)
    full = _stage_times(raw_by_threads[top])
    table: dict[str, dict[float, float]] = {stage: {} for stage in full}
    for threads, raw in sorted(raw_by_threads.items()):
        share = round(threads / top, 4)
        for stage, t in _stage_times(raw).items():
            table[stage][share] = round(t / full[stage], 4)
    return table


def decode_errors(doc: dict[str, Any], model: ModelSpec) -> list[dict[str, float]]:
    """Relative error of the loaded cost model on every measured decode point, per share."""
    accel, params = cost_inputs(doc)
    cm = CostModel(accel, params=params)
    raw = doc["raw"]
    top = max(int(t) for t in raw)
    rows = []
    for threads, data in sorted(raw.items(), key=lambda kv: int(kv[0])):
        share = int(threads) / top
        for q in data["decode"]:
            pred = cm.decode_iter_time_s(model, 1, int(q["batch"]), int(q["ctx_tokens"]), share)
            rows.append({"threads": int(threads), "batch": q["batch"],
                         "ctx_tokens": q["ctx_tokens"], "measured_s": q["time_s"],
                         "predicted_s": pred, "rel_error": pred / q["time_s"] - 1.0})
    return rows


def build_profile(model: ModelSpec, settings: ProfileSettings, raw: dict[int, dict[str, Any]],
                  machine: dict[str, Any], runtime: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The profile document: machine, model, settings, raw medians and fitted values
    (``runtime``: :func:`measure_runtime`'s result, when measured)."""
    top = max(raw)
    fitted = fit_params(model, raw)
    fitted["params"].update(fit_runtime(runtime or {},
                                        fitted["accelerator"]["host_link_bytes_per_s"], top))
    fitted["full_share_threads"] = top
    fitted["slowdown"] = slowdown_table(raw)
    base = cpu_worker_params()
    fitted["unprofiled_params"] = {f.name: getattr(base, f.name)
                                   for f in dataclasses.fields(CostParams)
                                   if f.name not in fitted["params"]}
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    doc = {
        "version": PROFILE_VERSION,
        "source": f"jigsawrl profile {date} on {machine.get('cpu', 'unknown CPU')}",
        "machine": machine,
        "model": {"preset": settings.model, "num_params": model.num_params},
        "settings": {k: list(v) if isinstance(v, tuple) else v
                     for k, v in asdict(settings).items()},
        "raw": {str(t): raw[t] for t in sorted(raw)},
        "raw_runtime": runtime or {},
        "fitted": fitted,
    }
    doc["fitted"]["decode_errors"] = decode_errors(doc, model)
    return doc


def write_profile(doc: dict[str, Any], path: str | Path) -> Path:
    """Write the profile as YAML (parent folders created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(_plain(doc), sort_keys=False, width=100))
    log.info("wrote profile %s", path)
    return path


def _plain(value: Any) -> Any:
    """numpy scalars, tuples and str subclasses (keys too: a Stage) -> plain Python, for
    yaml.safe_dump."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, str):  # str subclasses (torch's version string) -> str
        return str(value)
    return value


def median_time_s(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_median_times(fns: Mapping[str, Callable[[], object]], repeats: int
                             ) -> dict[str, float]:
    """Median wall time of each of ``fns`` over ``repeats`` rounds that call every one once,
    in turn, after one warm-up call each.

    Why rounds: the points of one fit (a pass's line and its GRPO-shaped point) must see the
    machine at the same speed. Timed one point after the other, a slow spell of a few seconds
    on this VM fell on every repeat of one point: a profile's small update took 60 ms where two
    others measured 41.5, the fitted per-call overhead came out 27 ms instead of 11-12, and the
    demo's updates were predicted 30% slower than they ran (docs/BENCHMARKS.md, 2026-12-07).
    """
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    return {key: statistics.median(ts) for key, ts in times.items()}
