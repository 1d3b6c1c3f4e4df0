"""The truth model's noise: seeded, deterministic, centred (median 1); the belief has none."""

from __future__ import annotations

import math
import statistics

from jigsawrl.costmodel import CostModel
from jigsawrl.workload.accelerators import ACCELERATORS
from jigsawrl.workload.models import MODELS

H100 = ACCELERATORS["h100-80gb"]
Q4 = MODELS["qwen3-4b"]


def _draws(cm: CostModel, n: int) -> list[float]:
    return [cm.prefill_time_s(Q4, 1, 2048) for _ in range(n)]


def test_belief_is_deterministic() -> None:
    cm = CostModel(H100)
    assert len(set(_draws(cm, 10))) == 1
    assert cm.draw_noise() == 1.0


def test_truth_is_seeded_and_reproducible() -> None:
    a, b, c = CostModel(H100, noise_sigma=0.1, seed=7), CostModel(H100, noise_sigma=0.1, seed=7), \
        CostModel(H100, noise_sigma=0.1, seed=8)
    assert _draws(a, 50) == _draws(b, 50)
    assert _draws(CostModel(H100, noise_sigma=0.1, seed=7), 50) != _draws(c, 50)


def test_truth_is_centred_on_the_belief() -> None:
    sigma = 0.2
    belief = CostModel(H100).train_time_s(Q4, 4, 1_000_000)
    truth = CostModel(H100, noise_sigma=sigma, seed=3)
    logs = [math.log(truth.train_time_s(Q4, 4, 1_000_000) / belief) for _ in range(5000)]
    assert abs(statistics.fmean(logs)) < 4 * sigma / math.sqrt(5000)
    assert abs(statistics.stdev(logs) - sigma) < 0.02


def test_every_time_gets_a_fresh_factor_and_explicit_noise_is_honoured() -> None:
    truth = CostModel(H100, noise_sigma=0.1, seed=1)
    belief = CostModel(H100)
    times = [truth.decode_span_time_s(Q4, 1, 8, 8000, 50) for _ in range(3)]
    assert len(set(times)) == 3
    assert truth.weight_sync_time_s(Q4, 4, noise=1.0) == belief.weight_sync_time_s(Q4, 4)
    assert truth.reward_time_s(64, noise=2.0) == 2.0 * belief.reward_time_s(64)
