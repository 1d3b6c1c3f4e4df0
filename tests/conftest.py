"""Shared test helpers: a tiny, exact cost model for hand-checkable timelines."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI runs a fixed set of examples (reproducible; a failure there is the same on every rerun);
# local runs explore new random examples each time.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from jigsawrl.workload.accelerators import ACCELERATORS  # noqa: E402 (after the offline env)


class FakeCost:
    """Exact toy costs: 1 s per decode iteration, 0.01 s per prefill token, 0.001 s per training
    token, 1 s per weight sync; compute-bound stages slow by 1/share, decode does not slow."""

    decode_iter_s = 1.0
    accel = ACCELERATORS["h100-80gb"]

    class params:  # noqa: N801 (mirrors CostModel.params)
        s_sat = 0.4
        train_eff = 0.4
        rollout_shares_prompt = False
        rollout_engine_limits = False

    def decode_iter_time_s(self, model, tp, batch, ctx, share=1.0):  # noqa: ANN001
        return self.decode_iter_s

    def kv_bytes(self, model, tokens, tp):  # noqa: ANN001
        return float(tokens)  # 1 byte per token, as kv_budget_tokens counts

    def decode_span_time_s(self, model, tp, batch, ctx, iters, share=1.0):  # noqa: ANN001
        return self.decode_iter_s * iters

    def decode_flops(self, model, batch, ctx, iters=1):  # noqa: ANN001
        return float(batch * iters)

    def prefill_time_s(self, model, tp, new, ctx=0, share=1.0, num_seqs=1):  # noqa: ANN001
        return 0.01 * new / share

    def prefill_flops(self, model, new, ctx=0, num_seqs=1):  # noqa: ANN001
        return float(new)

    def reward_time_s(self, n):  # noqa: ANN001
        return 0.5

    def pass_tokens(self, seq_lens, n, micro_batch_rows, prompt_lens=None,  # noqa: ANN001
                    group_size=1):  # noqa: ANN001
        return sum(seq_lens)  # padding removed

    def dispatch_time_s(self, model, stage, n, rounds=1):  # noqa: ANN001
        return 0.0  # no worker-pool costs

    def logprob_time_s(self, model, n, tokens, share=1.0):  # noqa: ANN001
        return 0.001 * tokens / n

    def train_time_s(self, model, n, tokens, share=1.0):  # noqa: ANN001
        return 0.003 * tokens / n

    def weight_sync_time_s(self, model, n, tp=1):  # noqa: ANN001
        return 1.0

    def logprob_flops(self, model, tokens):  # noqa: ANN001
        return 2.0 * tokens

    def train_flops(self, model, tokens):  # noqa: ANN001
        return 6.0 * tokens

    def host_transfer_time_s(self, nbytes, n=1):  # noqa: ANN001
        return 0.0

    def train_state_bytes(self, model, n):  # noqa: ANN001
        return 1e9

    def activation_bytes(self, model, tokens, n):  # noqa: ANN001
        return 1e6

    def kv_budget_tokens(self, model, tp, mem):  # noqa: ANN001
        return int(mem)

    def rollout_weight_bytes(self, model, tp):  # noqa: ANN001
        return 0.0

    def slowdown(self, stage, share, **kw):  # noqa: ANN001, ANN003
        return 1.0 if stage.startswith("decode") else 1.0 / share


@pytest.fixture
def fake_cost() -> FakeCost:
    return FakeCost()
