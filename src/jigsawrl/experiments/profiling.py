"""The measuring half of ``jigsawrl profile``: time this machine's sub-stages with the real engine.

What is measured, and how it is fitted, is described in :mod:`jigsawrl.costmodel.fit` (the
numpy-only fitting half, which this module feeds); torch is imported here, inside functions.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from jigsawrl.costmodel.fit import (
    ProfileSettings,
    build_profile,
    interleaved_median_times,
    median_time_s,
)
from jigsawrl.experiments.machine import machine_info
from jigsawrl.experiments.stage_gap import measure_probe, probe_spec
from jigsawrl.stages import Stage

log = logging.getLogger(__name__)

_MEMCPY_BYTES = 64 * 2**20
# A stop string of the length of a task's answer tag that decoded text never contains (a NUL
# byte): the profile's requests pay the matching without ever stopping on it.
_NEVER_STOP = "\x00/answer>"


def _decode_point(model: Any, tok: Any, batch: int, prompt_len: int, iters: int,
                  seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """(decode point, prefill point) of one batch of equal-length prompts on a fresh engine.

    The requests sample as a pipeline's do (temperature 1, a generator seeded per request, a
    stop string matched on the decoded text: :meth:`RealPipeline._params`), which costs 10-30%
    more per iteration than greedy decoding at 1M parameters; the stop string is one the random
    prompts' tokens cannot produce, so that no request ends early and the batch stays whole."""
    from jigsawrl.engine.rollout import GenerationRequest, RolloutEngine, SamplingParams

    rng = np.random.default_rng(seed + batch * 1000 + prompt_len)
    engine = RolloutEngine(model, tok, max_batch_tokens=batch * (prompt_len + iters + 4),
                           max_num_seqs=batch, eos_token_id=-1)
    low = len(tok.all_special_ids)
    for i in range(batch):
        ids = rng.integers(low, len(tok), prompt_len).tolist()
        params = SamplingParams(iters + 1, 1.0, 1.0, stop=(_NEVER_STOP,),
                                seed=seed * 7919 + batch * 131 + i)
        engine.add_request(GenerationRequest(f"p{i}", ids, params))
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


GRPO_GROUP = 8  # rows per prompt in the profile's GRPO-shaped pass


def _grpo_batch(tok: Any, settings: ProfileSettings) -> tuple[Any, int, int]:
    """A GRPO-shaped batch: ``train_seqs`` prompts of ``train_len / 8`` tokens, each with
    :data:`GRPO_GROUP` responses of spread lengths (``train_len / 32`` to ``train_len / 2``),
    so that the shared-prompt forward runs several response buckets. Returns the batch, the
    positions it computes and its bucket count (as the cost model counts them)."""
    import torch

    from jigsawrl.costmodel.train_cost import shared_prompt_positions
    from jigsawrl.engine.trainer import build_batch

    rng = np.random.default_rng(settings.seed + 1)
    low = len(tok.all_special_ids)
    prompt_len = max(4, settings.train_len // 8)
    short, long = max(2, settings.train_len // 32), max(4, settings.train_len // 2)
    seqs = []
    for _ in range(settings.train_seqs):
        prompt = rng.integers(low, len(tok), prompt_len).tolist()
        for _ in range(GRPO_GROUP):
            n = int(rng.integers(short, long + 1))
            seqs.append((prompt, rng.integers(low, len(tok), n).tolist(), [1] * n))
    rows = len(seqs)
    adv = torch.tensor(rng.standard_normal(rows), dtype=torch.float32)
    lens = [len(p) + len(r) for p, r, _ in seqs]
    positions, buckets = shared_prompt_positions(lens, [prompt_len] * rows, 0, rows, GRPO_GROUP)
    return build_batch(seqs, adv, tok.pad_token_id), positions, buckets


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
    grpo, grpo_positions, grpo_buckets = _grpo_batch(tok, settings)
    grpo_mb = settings.train_seqs * GRPO_GROUP  # one micro-batch, as the demo's recipes
    grpo.old_logprobs = compute_logprobs(model, grpo, grpo_mb)
    trainer = GRPOTrainer(model, GRPOConfig(micro_batch_size=mb))
    grpo_trainer = GRPOTrainer(model, GRPOConfig(micro_batch_size=grpo_mb))
    engine = RolloutEngine(engine_model, tok)
    src, dst = torch.ones(_MEMCPY_BYTES // 4), torch.empty(_MEMCPY_BYTES // 4)
    reps = settings.repeats
    small_tokens = int(small.attention_mask.sum())
    # in rounds, every point once a round: a slow spell hits one round of each, not one point
    t = interleaved_median_times({
        "logprob": lambda: compute_logprobs(model, batch, mb),
        "logprob_small": lambda: compute_logprobs(model, small, mb),
        "train": lambda: trainer.update(batch),
        "train_small": lambda: trainer.update(small),
        "logprob_grpo": lambda: compute_logprobs(model, grpo, grpo_mb),
        "train_grpo": lambda: grpo_trainer.update(grpo),
        Stage.WEIGHT_SYNC: lambda: engine.load_weights(model.state_dict())}, reps)
    return {
        "logprob": {"tokens": tokens, "time_s": t["logprob"]},
        "logprob_small": {"tokens": small_tokens, "time_s": t["logprob_small"]},
        "train": {"tokens": tokens, "time_s": t["train"]},
        "train_small": {"tokens": small_tokens, "time_s": t["train_small"]},
        # positions and buckets as the cost model counts the shared-prompt forward's
        "logprob_grpo": {"tokens": grpo_positions, "buckets": grpo_buckets,
                         "time_s": t["logprob_grpo"]},
        "train_grpo": {"tokens": grpo_positions, "buckets": grpo_buckets,
                       "time_s": t["train_grpo"]},
        Stage.WEIGHT_SYNC: {"params": sum(p.numel() for p in model.parameters()),
                            "time_s": t[Stage.WEIGHT_SYNC]},
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
           Stage.PREFILL: [_median_point(prefill[g]) for g in grid]}
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


@contextmanager
def _threads_kept() -> Iterator[None]:
    """Restore torch's thread count after a measurement that builds a pipeline (its start sets
    the count to the pipeline's own)."""
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_state_moves(settings: ProfileSettings) -> dict[str, float]:
    """Median seconds of a train state's offload and onload as a device worker runs them
    (``RealPipeline.export_train_state`` / ``import_train_state``: copying the actor and its
    optimizer out to host tensors; building the actor and its trainer from them), and the
    model's parameter count — at the profiled model, in this process, at the full share's
    thread count, with no warm start (the weights' values do not change the cost).
    """
    from jigsawrl.engine.pipeline import RealPipeline

    with _threads_kept():
        pipe = RealPipeline(probe_spec(settings.model, max(settings.threads), 1), settings.seed)
        pipe.start(train=True)
        pipe.import_train_state(pipe.export_train_state())  # first uses, untimed
        offloads, onloads = [], []
        for _ in range(max(3, settings.repeats)):  # an export drops the state: alternate
            t0 = time.perf_counter()
            state = pipe.export_train_state()
            t1 = time.perf_counter()
            pipe.import_train_state(state)
            offloads.append(t1 - t0)
            onloads.append(time.perf_counter() - t1)
        offload_s, onload_s = statistics.median(offloads), statistics.median(onloads)
    params = sum(int(t.numel()) for t in pipe.model.parameters())
    log.info("train state moves: offload %.1f ms, onload %.1f ms", 1e3 * offload_s,
             1e3 * onload_s)
    return {"offload_s": offload_s, "onload_s": onload_s, "num_params": params}


def measure_rank_setup(settings: ProfileSettings) -> float | None:
    """Median set-up of a rollout rank's first slice as a Ray device worker runs it (its
    ``setup_s``: a fresh engine holding the step's weights, the step's requests built), at the
    profiled model on an arithmetic pipeline, in this process; None without Ray installed (the
    worker's module imports it)."""
    try:
        from jigsawrl.executors.raycluster.messages import SliceRequest
        from jigsawrl.executors.raycluster.worker_pipes import LocalPipelines
        from jigsawrl.executors.raycluster.worker_rollout import RolloutHost
    except ImportError as exc:
        log.warning("rollout set-up not profiled (%s)", exc)
        return None
    spec = probe_spec(settings.model, max(settings.threads), 4, max_response_tokens=8)
    with _threads_kept():
        local = LocalPipelines(0, {spec.name: spec.model_dump_json()}, settings.seed)
        host = RolloutHost(local)
        pipe = local.get(spec.name)
        host.warm(pipe)
        host.preload(spec.name, 0, pipe.engine.model.state_dict())
        setups = []
        for step in range(max(3, settings.repeats) + 1):
            req = SliceRequest(spec.name, step, 0, 0.0, max(settings.threads),
                               tuple(range(spec.batch_size * spec.group_size)), 0, False, False)
            setups.append(host.run_slice(req, None, ()).setup_s)
            host.ranks.clear()
    seconds = statistics.median(setups[1:])  # the first is a warm-up
    log.info("rollout rank set-up: %.1f ms", 1e3 * seconds)
    return seconds


def measure_runtime(settings: ProfileSettings, engine_model: Any) -> dict[str, Any]:
    """Reward scoring per sample, a train state's moves (:func:`measure_state_moves`), a
    rollout rank's set-up (:func:`measure_rank_setup`), and (when Ray is installed) an actor
    call and a transfer of ``engine_model``'s fp32 weights between two Ray worker processes,
    and the wait between two stages of a real run on the Ray executor and the host's load
    beside its workers (:func:`~jigsawrl.experiments.stage_gap.measure_probe`)."""
    out: dict[str, Any] = {"reward_s_per_sample": measure_rewards(settings.seed),
                           "state_move": measure_state_moves(settings)}
    setup = measure_rank_setup(settings)
    if setup is not None:
        out["rank_setup_s"] = setup
    try:
        from jigsawrl.executors.raycluster.probe import measure_transport
    except ImportError as exc:
        log.warning("Ray call and transfer costs not profiled (%s)", exc)
        return out
    weights = {k: v.detach().float().clone() for k, v in engine_model.state_dict().items()}
    out["ray"] = measure_transport(weights, reps=max(5, 3 * settings.repeats))
    with _threads_kept():
        gap, host = measure_probe(settings.model, settings.seed)
    if gap is not None:
        out["stage_gap"] = gap
    if host is not None:
        out["host_load"] = host
    return out


def run_profile(settings: ProfileSettings,
                on_threads: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Measure every thread count of ``settings`` and return the profile document.

    Raises:
        ConfigError: an unknown model preset.
    """
    import torch

    from jigsawrl.engine.allocator import keep_freed_memory
    from jigsawrl.engine.models import build_model
    from jigsawrl.engine.speedprobe import speed_probe_s
    from jigsawrl.workload.realpresets import engine_model_spec

    keep_freed_memory()  # the allocator of the device workers whose costs this profile prices
    spec = engine_model_spec(settings.model)
    engine_model, tok = build_model(settings.model, seed=settings.seed)
    trainer_model = copy.deepcopy(engine_model)
    before = torch.get_num_threads()
    probes = [speed_probe_s()]  # the machine's speed now, and again at the end (its drift)
    raw: dict[int, dict[str, Any]] = {}
    try:
        for threads in settings.threads:
            if on_threads is not None:
                on_threads(threads)
            raw[threads] = measure_threads(settings, threads, (engine_model, trainer_model, tok))
    finally:
        torch.set_num_threads(before)
    runtime = measure_runtime(settings, engine_model) if settings.runtime else None
    probes.append(speed_probe_s())
    machine = machine_info(with_torch=True)
    machine["speed_probe_s"] = sum(probes) / len(probes)
    machine["speed_probes_s"] = probes
    return build_profile(spec, settings, raw, machine, runtime)
