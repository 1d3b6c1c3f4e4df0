"""``jigsawrl profile``: measure this machine's sub-stage costs and fit the cost model to them.

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
  (:mod:`jigsawrl.executors.raycluster.probe`): what a real run pays per stage beside compute,

then fit the :class:`~jigsawrl.costmodel.CostModel`'s own shape at the largest thread count
(the full share) and write a YAML profile that :func:`jigsawrl.costmodel.profile.load_profile`
reads back.

Why: DESIGN.md §6 asks every cost-model constant to come from a datasheet or a measured profile;
``workload/realpresets.py``'s CPU numbers are guesses. The fit keeps the cost model's formulas
(not a lookup table), so that the simulator can extrapolate to batches it never measured:

- decode iteration ``t = k0 + k_seq * batch + (2 P batch + A ctx) / R_decode``: non-negative
  least squares on the three coefficients (``P`` parameters, ``A`` attention FLOPs per token and
  context token); ``k0`` is ``iter_overhead_s``, ``k_seq`` is ``iter_overhead_per_seq_s``;
- prefill, log-prob and train times become effective FLOP rates (``2P`` per token forward,
  ``6P`` forward + backward; the model's fixed and memory terms subtracted first);
- ``peak_flops`` is the largest of the rates, each stage's efficiency its rate over that peak;
- thread counts become a slowdown table, time(threads) / time(max threads), per stage.

The fitting half is numpy only (tested without torch); torch is imported by the measuring half.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from jigsawrl.costmodel.model import CostModel
from jigsawrl.costmodel.profile import PROFILE_VERSION, cost_inputs
from jigsawrl.costmodel.roofline import CostParams, prefill_flops
from jigsawrl.errors import ConfigError
from jigsawrl.workload.models import ModelSpec
from jigsawrl.workload.realpresets import cpu_worker_params

log = logging.getLogger(__name__)

# CostModel's Adam step moves 30 bytes per parameter (costmodel/model.py); subtracted from the
# measured update time before the train FLOP rate is computed.
_ADAM_BYTES_PER_PARAM = 30.0
_MEMCPY_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """What ``jigsawrl profile`` measures (defaults: a < 60 s run for qwen2-1m at 1 and 2 threads).

    ``decode_iters`` decode iterations are timed per (batch, prompt length) point, in each of
    ``repeats`` sweeps of the grid; a point keeps the median over sweeps of its per-sweep medians.
    The training-side passes run ``repeats`` times after one warm-up.
    """

    model: str = "qwen2-1m"
    threads: tuple[int, ...] = (1, 2)
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
    """``t = overhead_s + per_seq_s * batch + (2 P batch + A ctx) * s_per_flop``."""

    overhead_s: float
    per_seq_s: float
    s_per_flop: float


def decode_features(model: ModelSpec, batch: float, ctx_tokens: float,
                    share: float = 1.0) -> list[float]:
    """Columns of the decode fit: 1, batch, decode FLOPs of one iteration over the share."""
    flops = 2.0 * model.num_params * batch + model.attn_flops_per_token_per_ctx() * ctx_tokens
    return [1.0, float(batch), flops / share]


def fit_decode(model: ModelSpec, points: Sequence[dict[str, float]]) -> DecodeFit:
    """Fit the decode line to ``{"batch", "ctx_tokens", "time_s"[, "share"]}`` points.

    As in :class:`CostModel`, only the FLOP term slows on a ``share`` < 1 (default 1); the
    overheads do not. Relative least squares (each row divided by its time), so that batch-1
    points in milliseconds weigh as much as batch-64 points in tens of milliseconds.
    """
    if len(points) < 3:
        raise ValueError(f"the decode fit needs >= 3 points, got {len(points)}")
    a = np.array([decode_features(model, p["batch"], p["ctx_tokens"], p.get("share", 1.0))
                  for p in points])
    y = np.array([p["time_s"] for p in points])
    scale = np.diag([1.0, 1e-2, 1e-9])  # condition the columns (s, s/seq, s/GFLOP)
    x = nnls((a @ scale) / y[:, None], np.ones_like(y)) @ scale
    return DecodeFit(float(x[0]), float(x[1]), float(x[2]))


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
    adam = _ADAM_BYTES_PER_PARAM * p / mem_bw
    lp_s_per_token, lp_over = pass_line(raw, "logprob", 0.0)
    tr_s_per_token, tr_over = pass_line(raw, "train", adam)
    rates = {
        "prefill": prefill_rate(model, raw["prefill"], fit),
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
        "prefill_eff": rates["prefill"] / peak, "decode_compute_eff": rates["decode"] / peak,
        "hbm_bw_eff": 1.0, "logprob_eff": rates["logprob"] / peak,
        "train_eff": rates["train"] / peak, "iter_overhead_s": fit.overhead_s,
        "iter_overhead_per_seq_s": fit.per_seq_s,
        "weight_sync_overhead_s": max(raw["weight_sync"]["time_s"] - load, 0.0),
        "logprob_overhead_s": lp_over, "train_overhead_s": tr_over,
        "train_pads_rows": True,  # the trainer profiled here pads each micro-batch's rows
    }
    accel = {"peak_flops": peak, "hbm_bytes_per_s": mem_bw,
             "host_link_bytes_per_s": mem_bw / 2.0}
    return {"accelerator": accel, "params": params, "rates_flops_per_s": rates}


def fit_runtime(runtime: dict[str, Any]) -> dict[str, float]:
    """CostParams of the runtime measurements (see :func:`measure_runtime`); {} when absent.

    The transfer line ``time = 2 call + latency + bytes / bandwidth`` goes through the two
    measured sizes (each transfer is two actor calls: one hands the tensors out, one takes
    them); a reward call is one actor call plus the per-sample scoring.
    """
    params: dict[str, float] = {}
    if runtime.get("reward_s_per_sample") is not None:
        params["reward_s_per_sample"] = float(runtime["reward_s_per_sample"])
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


def _stage_times(raw: dict[str, Any]) -> dict[str, float]:
    """One representative time per stage of one thread count (for the slowdown table)."""
    dec = raw["decode"]
    small = min(dec, key=lambda q: (q["batch"], q["ctx_tokens"]))
    large = max(dec, key=lambda q: (q["batch"], q["ctx_tokens"]))
    pre = max(raw["prefill"], key=lambda q: q["tokens"])
    return {"prefill": pre["time_s"], "decode_small": small["time_s"],
            "decode_large": large["time_s"], "old_logprob": raw["logprob"]["time_s"],
            "ref_logprob": raw["logprob"]["time_s"], "actor_update": raw["train"]["time_s"],
            "weight_sync": raw["weight_sync"]["time_s"]}


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
    fitted["params"].update(fit_runtime(runtime or {}))
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
    """numpy scalars and tuples -> plain Python, for yaml.safe_dump."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, str):  # str subclasses (torch's version string) -> str
        return str(value)
    return value


# ============================================================================ measuring (torch)


def machine_info() -> dict[str, Any]:
    """The bench report's machine facts, plus the torch version and the load average (profiles
    taken on a busy machine read slower)."""
    import torch

    from jigsawrl.benchpaper import machine_info as base_info

    return {**base_info(), "torch": str(torch.__version__),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def median_time_s(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _decode_point(model: Any, tok: Any, batch: int, prompt_len: int, iters: int,
                  seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """(decode point, prefill point) of one batch of equal-length prompts on a fresh engine."""
    from jigsawrl.engine.rollout import GenerationRequest, RolloutEngine, SamplingParams

    rng = np.random.default_rng(seed + batch * 1000 + prompt_len)
    engine = RolloutEngine(model, tok, max_batch_tokens=batch * (prompt_len + iters + 4),
                           max_num_seqs=batch, eos_token_id=-1)
    low = len(tok.all_special_ids)
    for i in range(batch):
        ids = rng.integers(low, len(tok), prompt_len).tolist()
        engine.add_request(GenerationRequest(f"p{i}", ids, SamplingParams(iters + 1, 0.0)))
    t0 = time.perf_counter()
    engine.step()  # prefill of every prompt (and one sampled token each)
    prefill = {"tokens": batch * prompt_len, "seqs": batch, "time_s": time.perf_counter() - t0}
    times, ctxs = [], []
    for j in range(iters):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
        ctxs.append(batch * (prompt_len + j + 1))  # KV tokens attended, summed over the batch
    decode = {"batch": batch, "prompt_len": prompt_len, "ctx_tokens": statistics.median(ctxs),
              "time_s": statistics.median(times)}
    return decode, prefill


def _train_batch(tok: Any, settings: ProfileSettings) -> Any:
    import torch

    from jigsawrl.engine.trainer import build_batch

    rng = np.random.default_rng(settings.seed)
    low, half = len(tok.all_special_ids), settings.train_len // 2
    seqs = []
    for _ in range(settings.train_seqs):
        ids = rng.integers(low, len(tok), settings.train_len).tolist()
        seqs.append((ids[:half], ids[half:], [1] * (settings.train_len - half)))
    adv = torch.tensor(rng.standard_normal(settings.train_seqs), dtype=torch.float32)
    return build_batch(seqs, adv, tok.pad_token_id)


def _train_side(model: Any, engine_model: Any, tok: Any,
                settings: ProfileSettings) -> dict[str, Any]:
    """Median log-prob, update, weight-sync and memcpy times at the current thread count."""
    import torch

    from jigsawrl.engine.rollout import RolloutEngine
    from jigsawrl.engine.trainer import GRPOConfig, GRPOTrainer, compute_logprobs

    batch = _train_batch(tok, settings)
    tokens = int(batch.attention_mask.sum())
    mb = settings.train_seqs
    batch.old_logprobs = compute_logprobs(model, batch, mb)
    # a second, small pass (a quarter of the rows, half the length) separates per-call costs
    small = _train_batch(tok, dataclasses.replace(
        settings, train_seqs=max(2, settings.train_seqs // 4),
        train_len=max(8, settings.train_len // 2)))
    small.old_logprobs = compute_logprobs(model, small, mb)
    trainer = GRPOTrainer(model, GRPOConfig(micro_batch_size=mb))
    engine = RolloutEngine(engine_model, tok)
    src, dst = torch.ones(_MEMCPY_BYTES // 4), torch.empty(_MEMCPY_BYTES // 4)
    reps = settings.repeats
    small_tokens = int(small.attention_mask.sum())
    return {
        "logprob": {"tokens": tokens,
                    "time_s": median_time_s(lambda: compute_logprobs(model, batch, mb), reps)},
        "logprob_small": {"tokens": small_tokens,
                          "time_s": median_time_s(lambda: compute_logprobs(model, small, mb), reps)},
        "train": {"tokens": tokens, "time_s": median_time_s(lambda: trainer.update(batch), reps)},
        "train_small": {"tokens": small_tokens,
                        "time_s": median_time_s(lambda: trainer.update(small), reps)},
        "weight_sync": {"params": sum(p.numel() for p in model.parameters()),
                        "time_s": median_time_s(lambda: engine.load_weights(model.state_dict()), reps)},
        "memcpy": {"bytes": _MEMCPY_BYTES, "time_s": median_time_s(lambda: dst.copy_(src), reps + 2)},
    }


def _median_point(rounds: list[dict[str, float]]) -> dict[str, float]:
    """One point whose ``time_s`` is the median over rounds (other fields from the first)."""
    return {**rounds[0], "time_s": statistics.median(r["time_s"] for r in rounds)}


def measure_threads(settings: ProfileSettings, threads: int, models: tuple[Any, Any, Any]
                    ) -> dict[str, Any]:
    """Every raw median at one torch thread count.

    The decode grid is swept ``repeats`` times, one point after the other, so that a burst of
    load from other processes hits one round of every point rather than every round of one.
    """
    import torch

    engine_model, trainer_model, tok = models
    torch.set_num_threads(threads)
    _decode_point(engine_model, tok, 2, 8, 2, settings.seed)  # warm-up
    grid = [(b, n) for n in settings.prompt_lens for b in settings.batches]
    decode: dict[tuple[int, int], list[dict[str, float]]] = {g: [] for g in grid}
    prefill: dict[tuple[int, int], list[dict[str, float]]] = {g: [] for g in grid}
    for _ in range(settings.repeats):
        for batch, prompt_len in grid:
            d, p = _decode_point(engine_model, tok, batch, prompt_len, settings.decode_iters,
                                 settings.seed)
            decode[batch, prompt_len].append(d)
            prefill[batch, prompt_len].append(p)
    out = {"decode": [_median_point(decode[g]) for g in grid],
           "prefill": [_median_point(prefill[g]) for g in grid]}
    for d in out["decode"]:
        log.info("threads %d batch %d prompt %d: decode %.2f ms", threads, d["batch"],
                 d["prompt_len"], 1e3 * d["time_s"])
    return {**out, **_train_side(trainer_model, engine_model, tok, settings)}


def measure_rewards(seed: int = 0, per_task: int = 32) -> float:
    """Median seconds per sample of the built-in tasks' reward functions (what a reward
    worker runs per sample), each scoring its examples' ground truths and a wrong answer."""
    from jigsawrl.tasks import get_task, list_tasks, safe_score

    per_sample = []
    for name in list_tasks():
        task = get_task(name)
        examples = task.make_dataset(per_task, seed)
        answers = [(ex.ground_truth, ex) for ex in examples] + [("<answer>0</answer>", ex)
                                                                for ex in examples]
        t0 = time.perf_counter()
        for text, ex in answers:
            safe_score(task, str(text), ex)
        per_sample.append((time.perf_counter() - t0) / len(answers))
        log.info("reward %s: %.3f ms per sample", name, 1e3 * per_sample[-1])
    return statistics.median(per_sample)


def measure_runtime(settings: ProfileSettings, engine_model: Any) -> dict[str, Any]:
    """Reward scoring per sample, and (when Ray is installed) an actor call and a transfer of
    ``engine_model``'s fp32 weights between two Ray worker processes."""
    out: dict[str, Any] = {"reward_s_per_sample": measure_rewards(settings.seed)}
    try:
        from jigsawrl.executors.raycluster.probe import measure_transport
    except ImportError as exc:
        log.warning("Ray call and transfer costs not profiled (%s)", exc)
        return out
    weights = {k: v.detach().float().clone() for k, v in engine_model.state_dict().items()}
    out["ray"] = measure_transport(weights, reps=max(5, 3 * settings.repeats))
    return out


def run_profile(settings: ProfileSettings,
                on_threads: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Measure every thread count of ``settings`` and return the profile document.

    Raises:
        ConfigError: an unknown model preset.
    """
    import torch

    from jigsawrl.engine.models import build_model
    from jigsawrl.workload.realpresets import engine_model_spec

    spec = engine_model_spec(settings.model)
    engine_model, tok = build_model(settings.model, seed=settings.seed)
    trainer_model = copy.deepcopy(engine_model)
    before = torch.get_num_threads()
    raw: dict[int, dict[str, Any]] = {}
    try:
        for threads in settings.threads:
            if on_threads is not None:
                on_threads(threads)
            raw[threads] = measure_threads(settings, threads, (engine_model, trainer_model, tok))
    finally:
        torch.set_num_threads(before)
    runtime = measure_runtime(settings, engine_model) if settings.runtime else None
    return build_profile(spec, settings, raw, machine_info(), runtime)
