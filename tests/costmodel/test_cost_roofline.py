"""Roofline times and FLOPs: monotonicity, memory- vs compute-boundness, parallel scaling."""

from __future__ import annotations

import pytest

from jigsawrl.costmodel import CostModel, CostParams
from jigsawrl.workload.accelerators import ACCELERATORS
from jigsawrl.workload.models import MODELS

H100 = ACCELERATORS["h100-80gb"]
Q4 = MODELS["qwen3-4b"]
Q32 = MODELS["qwen3-32b"]


@pytest.fixture
def cm() -> CostModel:
    return CostModel(H100)


def test_flop_formulas(cm: CostModel) -> None:
    assert cm.train_flops(Q4, 1000) == pytest.approx(6 * 4.0e9 * 1000)
    assert cm.logprob_flops(Q4, 1000) == pytest.approx(2 * 4.0e9 * 1000)
    attn = Q4.attn_flops_per_token_per_ctx()
    assert cm.decode_flops(Q4, 4, 100) == pytest.approx(2 * 4.0e9 * 4 + attn * 100)
    # two iterations: context 100 then 104
    assert cm.decode_flops(Q4, 4, 100, iters=2) == pytest.approx(
        2 * 2 * 4.0e9 * 4 + attn * (100 + 104))
    assert cm.prefill_flops(Q4, 10, 0) == pytest.approx(2 * 4.0e9 * 10 + attn * (50 + 5))
    # batched prompts attend only within their own sequence
    assert cm.prefill_flops(Q4, 1000, num_seqs=10) < cm.prefill_flops(Q4, 1000)


def test_times_grow_with_work(cm: CostModel) -> None:
    assert cm.prefill_time_s(Q4, 1, 2000) > cm.prefill_time_s(Q4, 1, 1000)
    assert cm.prefill_time_s(Q4, 1, 1000, 4000) > cm.prefill_time_s(Q4, 1, 1000, 0)
    assert cm.decode_iter_time_s(Q4, 1, 64, 64_000) > cm.decode_iter_time_s(Q4, 1, 32, 32_000)
    assert cm.decode_iter_time_s(Q4, 1, 32, 64_000) > cm.decode_iter_time_s(Q4, 1, 32, 32_000)
    assert cm.decode_span_time_s(Q4, 1, 8, 8000, 20) > cm.decode_span_time_s(Q4, 1, 8, 8000, 10)
    assert cm.train_time_s(Q4, 4, 2_000_000) > cm.train_time_s(Q4, 4, 1_000_000)
    assert cm.logprob_time_s(Q4, 4, 2_000_000) > cm.logprob_time_s(Q4, 4, 1_000_000)
    assert cm.host_transfer_time_s(2e9) > cm.host_transfer_time_s(1e9)
    assert cm.reward_time_s(200) > cm.reward_time_s(100)


def test_compute_bound_work_shrinks_with_devices(cm: CostModel) -> None:
    for n_small, n_big in ((1, 2), (2, 4), (4, 8), (8, 16)):
        assert cm.train_time_s(Q4, n_big, 4_000_000) < cm.train_time_s(Q4, n_small, 4_000_000)
        assert cm.logprob_time_s(Q4, n_big, 4_000_000) < cm.logprob_time_s(Q4, n_small, 4_000_000)
    assert cm.prefill_time_s(Q32, 4, 16_000) < cm.prefill_time_s(Q32, 2, 16_000)
    assert cm.host_transfer_time_s(8e9, 4) < cm.host_transfer_time_s(8e9, 1)


def test_scaling_is_sublinear_because_of_communication(cm: CostModel) -> None:
    one = cm.train_time_s(Q4, 1, 4_000_000)
    eight = cm.train_time_s(Q4, 8, 4_000_000)
    sixteen = cm.train_time_s(Q4, 16, 4_000_000)  # spans two nodes: the NIC is the link
    assert one / 8 < eight < one / 6
    assert sixteen > eight / 2


def test_decode_is_memory_bound_at_small_batch(cm: CostModel) -> None:
    # batch 1: the time is the weights over HBM bandwidth plus the iteration overhead
    t = cm.decode_iter_time_s(Q4, 1, 1, 512)
    weights_s = Q4.weight_bytes() / (H100.hbm_bytes_per_s * cm.params.hbm_bw_eff)
    assert t == pytest.approx(weights_s + cm.params.iter_overhead_s, rel=0.05)
    # per-token cost falls steeply with batch while memory-bound
    per_tok_1 = cm.decode_iter_time_s(Q4, 1, 1, 0)
    per_tok_64 = cm.decode_iter_time_s(Q4, 1, 64, 0) / 64
    assert per_tok_64 < per_tok_1 / 20


def test_decode_approaches_compute_bound_at_large_batch(cm: CostModel) -> None:
    # short contexts, large batch: time grows ~linearly with batch (compute-bound)
    t1 = cm.decode_iter_time_s(Q4, 1, 1024, 1024)
    t2 = cm.decode_iter_time_s(Q4, 1, 2048, 2048)
    assert 1.8 < t2 / t1 < 2.05


def test_tp_splits_weights_and_adds_comm(cm: CostModel) -> None:
    t1 = cm.decode_iter_time_s(Q32, 1, 1, 1000)
    t4 = cm.decode_iter_time_s(Q32, 4, 1, 1000)
    assert t4 < t1 / 2  # weight streaming split 4 ways
    assert t4 > t1 / 4  # ...but overhead and per-layer all-reduces do not shrink


def test_weight_sync_and_host_transfer(cm: CostModel) -> None:
    t = cm.weight_sync_time_s(Q4, 4)
    assert cm.params.weight_sync_overhead_s < t < 5.0
    assert cm.weight_sync_time_s(Q4, 16) > cm.weight_sync_time_s(Q4, 8)  # crosses nodes
    # 64 GB of train state over PCIe Gen5 at 55 GB/s per device, 4 devices in parallel
    assert cm.host_transfer_time_s(64e9, 4) == pytest.approx(16e9 / 55e9, rel=0.01)
    assert cm.host_transfer_time_s(0) == 0.0


def test_zero_work_is_free(cm: CostModel) -> None:
    assert cm.prefill_time_s(Q4, 1, 0) == 0.0
    assert cm.decode_span_time_s(Q4, 1, 8, 100, 0) == 0.0
    assert cm.train_time_s(Q4, 4, 0) == 0.0
    assert cm.reward_time_s(0) == 0.0


def test_invalid_share_and_params_rejected(cm: CostModel) -> None:
    with pytest.raises(ValueError, match="share"):
        cm.prefill_time_s(Q4, 1, 100, share=0.0)
    with pytest.raises(ValueError, match="share"):
        cm.decode_iter_time_s(Q4, 1, 1, 100, share=1.5)
    with pytest.raises(ValueError, match="train_eff"):
        CostParams(train_eff=0.0)
    with pytest.raises(ValueError, match="noise_sigma"):
        CostModel(H100, noise_sigma=-1.0)


def test_costmodel_imports_neither_torch_nor_ray() -> None:
    import subprocess
    import sys

    code = ("import sys, jigsawrl.costmodel; "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
