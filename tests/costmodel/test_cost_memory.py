"""Memory per device: weights, KV cache, training state, activations, and fit answers."""

from __future__ import annotations

import pytest

from jigsawrl.costmodel import CostModel
from jigsawrl.workload.accelerators import ACCELERATORS
from jigsawrl.workload.models import MODELS

H100 = ACCELERATORS["h100-80gb"]
Q4 = MODELS["qwen3-4b"]
Q32 = MODELS["qwen3-32b"]


@pytest.fixture
def cm() -> CostModel:
    return CostModel(H100)


def test_weights_and_kv(cm: CostModel) -> None:
    assert cm.rollout_weight_bytes(Q4, 1) == pytest.approx(8.0e9)
    assert cm.rollout_weight_bytes(Q4, 4) == pytest.approx(2.0e9)
    per_token = 2 * 36 * 8 * 128 * 2  # K and V, layers, kv heads, head dim, bf16
    assert cm.kv_bytes(Q4, 1000, 1) == pytest.approx(1000 * per_token)
    assert cm.kv_bytes(Q4, 1000, 2) == pytest.approx(500 * per_token)
    # 8 KV heads: beyond tp=8 each device keeps one (replicated) head
    assert cm.kv_bytes(Q4, 1000, 16) == cm.kv_bytes(Q4, 1000, 8)


def test_kv_budget_inverts_kv_bytes(cm: CostModel) -> None:
    budget = cm.kv_budget_tokens(Q4, 2, 16e9)
    assert cm.kv_bytes(Q4, budget, 2) <= 16e9 < cm.kv_bytes(Q4, budget + 1, 2)
    assert cm.kv_budget_tokens(Q4, 1, 0) == 0


def test_train_state_and_activations(cm: CostModel) -> None:
    assert cm.train_state_bytes(Q4, 1) == pytest.approx(64e9)
    assert cm.train_state_bytes(Q4, 8) == pytest.approx(8e9)
    a1 = cm.activation_bytes(Q4, 8192, 4)
    assert cm.activation_bytes(Q4, 16384, 4) > a1 > 0
    assert 2e9 < cm.activation_bytes(Q4, 16384, 4) < 40e9


def test_fit_answers(cm: CostModel) -> None:
    assert cm.fits_training(Q4, 8) == (True, "")
    assert cm.fits_training(Q4, 4)[0]
    ok, reason = cm.fits_training(Q32, 1)
    assert not ok
    assert "qwen3-32b" in reason and "1 device" in reason and "h100-80gb has 80 GB" in reason
    assert "use at least" in reason
    assert cm.fits_training(Q32, 16)[0]
