"""A fixed model pass, timed: how fast this machine is now, next to when it was profiled.

Why: this VM's speed drifts by up to 1.6x within minutes (BENCHMARKS.md), and a profile is timed
at one moment. A real run's prediction error then mixes two things: the cost model's error and
the machine running at another speed than when the profile was taken. ``jigsawrl profile``
times this probe and stores it in the profile (``speed_probe_s``); every device worker times it
again right before the run clock starts (``speed_probes_s``) and once the run has ended, after
the clock (``speed_probes_end_s``), and the calibration takes the median of both ends. Their ratio
says how much slower (> 1) or faster the machine was for the run, and the calibration reports
the prediction both as profiled and scaled by that ratio (``costmodel.profile.slower``).

What it times: one forward and backward pass of the ``qwen2-1m`` preset built from its config
(seed 0) over a fixed batch of 4 x 64 tokens, on one torch thread, the median of
``repeats`` passes after two untimed ones. A model pass rather than a bare matmul, because the
cost model prices model passes, whose small-op overheads drift with the machine as the FLOPs
do. Simplification, said here: one probe scales every machine cost alike (compute, the fixed
overheads, memory copies); tool latency, which the machine does not set, is not scaled.

What it showed (BENCHMARKS.md, "Speed probe"): on this VM the probe itself moves by +-15% from
one second to the next, so one probe before a run does not follow the run's speed; the scaled
prediction is reported beside the plain one, never instead of it.
"""

from __future__ import annotations

import statistics
import time

import torch

from jigsawrl.engine.models import build_model

PROBE_MODEL = "qwen2-1m"
PROBE_SHAPE = (4, 64)  # rows x tokens


def speed_probe_s(repeats: int = 15) -> float:
    """Seconds of one probe pass (the median of ``repeats``; module docstring), on one thread.

    The caller's torch thread count is restored afterwards.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, _ = build_model(PROBE_MODEL, seed=0)
        model.train()
        gen = torch.Generator().manual_seed(0)
        vocab = int(model.config.vocab_size)
        ids = torch.randint(0, vocab, PROBE_SHAPE, generator=gen)
        times = []
        for i in range(repeats + 2):
            t0 = time.perf_counter()
            logits = model(input_ids=ids).logits
            logits.float().logsumexp(-1).mean().backward()
            model.zero_grad(set_to_none=True)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(before)
