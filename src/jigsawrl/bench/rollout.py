"""Decode throughput of the rollout engine, beside a plain transformers KV-cache loop.

Run: ``HF_HUB_OFFLINE=1 python -m jigsawrl.bench.rollout qwen2-1m qwen2-10m``
(1 thread, 16 requests x 64 new tokens, 12-token prompts, greedy, random-init weights). The plain
loop (one batched ``DynamicCache`` forward per token, argmax, no bookkeeping) is the ceiling the
engine's continuous batching is measured against, in the same process so that machine load hits
both alike. The numbers printed are the median of ``repeats`` interleaved runs.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from transformers import DynamicCache

from jigsawrl.engine.models import build_model, kv_call
from jigsawrl.engine.rollout import GenerationRequest, RolloutEngine, SamplingParams


def _engine_run(engine: RolloutEngine, prompt: list[int], batch: int, new: int, tag: str) -> float:
    reqs = [GenerationRequest(f"{tag}-{i}", prompt, SamplingParams(new, temperature=0.0))
            for i in range(batch)]
    start = time.perf_counter()
    engine.generate(reqs)
    return batch * new / (time.perf_counter() - start)


def _plain_run(model, prompt: list[int], batch: int, new: int) -> float:
    ids = torch.tensor([prompt] * batch)
    start = time.perf_counter()
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        nxt = kv_call(model, ids, None, None, cache, logits_to_keep=1)[:, -1].argmax(-1)
        for _ in range(new - 1):
            nxt = kv_call(model, nxt[:, None], None, None, cache)[:, -1].argmax(-1)
    return batch * new / (time.perf_counter() - start)


def decode_speed(preset: str, batch: int = 16, new_tokens: int = 64, threads: int = 1,
                 repeats: int = 3) -> dict[str, float]:
    """Median tokens/s of the engine and of the plain loop (generated tokens over wall time)."""
    torch.set_num_threads(threads)
    model, tok = build_model(preset, seed=0)
    engine = RolloutEngine(model, tok, eos_token_id=-1)
    prompt = tok.encode("Q: 12+34=? A:")[:12]
    _engine_run(engine, prompt, batch, new_tokens, "warm")
    _plain_run(model, prompt, batch, new_tokens)
    ours, plain = [], []
    for k in range(repeats):
        ours.append(_engine_run(engine, prompt, batch, new_tokens, f"r{k}"))
        plain.append(_plain_run(model, prompt, batch, new_tokens))
    return {"engine_tokens_per_s": statistics.median(ours),
            "plain_loop_tokens_per_s": statistics.median(plain)}


if __name__ == "__main__":
    for name in sys.argv[1:] or ["qwen2-1m", "qwen2-10m"]:
        speed = decode_speed(name)
        print(f"{name}: engine {speed['engine_tokens_per_s']:.0f} tok/s, "
              f"plain loop {speed['plain_loop_tokens_per_s']:.0f} tok/s")
