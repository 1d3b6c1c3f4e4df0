"""The lab's profiled GRPO step (reference/jigsawrl.md) comes out plausibly from the roofline.

Qwen3-4B on 4x H100, batch 256 prompts x 4 samples, one logged step: 129 s in all, generation
59 s, actor update 36 s, ref 18 s, old log-prob 12 s; generation 26-81% of a step across steps.
The response-length distribution of that run is unknown: a lognormal (sigma 0.6) with a 2k-token
mean and an 8192-token cap stands in. Tolerances are wide on purpose.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from jigsawrl.costmodel import CostModel
from jigsawrl.workload.accelerators import ACCELERATORS
from jigsawrl.workload.models import MODELS

PROMPT = 256


def _lengths(n: int, mean: float, sigma: float = 0.6, cap: int = 8192) -> list[int]:
    mu = math.log(mean) - sigma * sigma / 2
    z = NormalDist()
    return sorted(min(cap, int(math.exp(mu + sigma * z.inv_cdf((i + 0.5) / n)))) for i in range(n))


def _engine_generation_s(cm: CostModel, lengths: list[int]) -> float:
    """One TP=1 engine decoding all its sequences together; finished ones leave the batch."""
    model = MODELS["qwen3-4b"]
    n = len(lengths)
    t = cm.prefill_time_s(model, 1, n * PROMPT, num_seqs=n)
    ctx, done = n * PROMPT, 0
    for i, length in enumerate(lengths):
        iters = length - done
        if iters > 0:
            t += cm.decode_span_time_s(model, 1, n - i, ctx, iters)
            ctx += (n - i) * iters
            done = length
        ctx -= PROMPT + length
    return t


def test_lab_step_ratios() -> None:
    cm, model = CostModel(ACCELERATORS["h100-80gb"]), MODELS["qwen3-4b"]
    lengths = _lengths(256, 2000)  # 1024 samples over 4 engines of 256
    tokens = 1024 * (PROMPT + sum(lengths) / len(lengths))
    gen = _engine_generation_s(cm, lengths)
    update = cm.train_time_s(model, 4, tokens)
    old = cm.logprob_time_s(model, 4, tokens)
    step = gen + update + 2 * old + cm.weight_sync_time_s(model, 4) + cm.reward_time_s(1024)
    assert 2.0 < update / old < 4.0  # lab: 36 / 12 = 3.0
    assert 0.26 < gen / step < 0.81  # lab: 26-81% of a step, 46% in the logged one
    assert 129 / 2 < step < 129 * 2
    assert 36 / 2 < update < 36 * 2
