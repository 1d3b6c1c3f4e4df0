"""The shared-prompt forward gives the plain forward's log-probs, losses and gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from jigsawrl.engine.models import build_model
from jigsawrl.engine.shared_prompt import prompt_groups
from jigsawrl.engine.trainer import (
    GRPOConfig,
    GRPOTrainer,
    accumulate_grads,
    build_batch,
    compute_logprobs,
)


def _sequences(seed: int = 0) -> list[tuple[list[int], list[int], list[int]]]:
    """Five groups of three: prompts of 3-11 tokens, responses of 0-8 with tool tokens (mask 0);
    group 2 has an empty response."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(5):
        plen = int(torch.randint(3, 12, (1,), generator=g))
        prompt = torch.randint(5, 60, (plen,), generator=g).tolist()
        for j in range(3):
            rlen = 0 if (k, j) == (2, 1) else int(torch.randint(1, 9, (1,), generator=g))
            resp = torch.randint(5, 60, (rlen,), generator=g).tolist()
            out.append((prompt, resp, [0 if i % 4 == 2 else 1 for i in range(rlen)]))
    return out


@pytest.fixture(scope="module", params=["qwen2-1m", "qwen3-1m", "llama-1m"])
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    return build_model(request.param, seed=1)[0]


def _batch(pad_id: int = 0):  # noqa: ANN202 - a TrainBatch
    seqs = _sequences()
    return build_batch(seqs, torch.randn(len(seqs), generator=torch.Generator().manual_seed(1)),
                       pad_id)


def test_groups_are_runs_of_identical_prompts() -> None:
    batch = _batch()
    groups = prompt_groups(batch.input_ids, batch.prompt_lens)
    assert groups.heads.tolist() == [0, 3, 6, 9, 12]
    assert groups.member.tolist() == [i // 3 for i in range(15)]


@pytest.mark.parametrize("micro", [15, 4])  # 4 splits groups across micro-batches
def test_logprobs_match_the_plain_forward(model: torch.nn.Module, micro: int) -> None:
    batch = _batch()
    plain = compute_logprobs(model, batch, micro, share_prompt=False)
    shared = compute_logprobs(model, batch, micro, share_prompt=True)
    # every response target is filled; prompt targets are left 0
    resp = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    for i, (p, r, _) in enumerate(_sequences()):
        resp[i, len(p) - 1: len(p) - 1 + len(r)] = True
    assert torch.allclose(plain[resp], shared[resp], atol=1e-5)
    assert torch.count_nonzero(shared[~resp]) == 0


@pytest.mark.parametrize("micro", [15, 4])
def test_gradients_and_sums_match_the_plain_forward(model: torch.nn.Module, micro: int) -> None:
    batch = _batch()
    batch.old_logprobs = compute_logprobs(model, batch, micro, share_prompt=False) + 0.05 * \
        torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(2))
    batch.ref_logprobs = batch.old_logprobs - 0.1
    total = float(batch.loss_mask.sum())
    grads, sums = [], []
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        cfg = GRPOConfig(micro_batch_size=micro, kl_coef=0.1, share_prompt=share)
        sums.append(accumulate_grads(model, batch, total, cfg))
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    for key in sums[0]:
        assert sums[0][key] == pytest.approx(sums[1][key], rel=1e-4, abs=1e-5)
    assert sums[0]["kl"] > 0  # the KL term took part


def test_an_update_step_lands_on_the_same_weights() -> None:
    base = build_model("qwen2-1m", seed=3)[0]
    batch = _batch()
    after = []
    for share in (False, True):
        m = copy.deepcopy(base)
        tr = GRPOTrainer(m, GRPOConfig(lr=1e-2, micro_batch_size=6, share_prompt=share))
        # SGD, not AdamW: Adam's first step is ~lr·sign(g), so float-order noise on the
        # (many) near-zero gradients would flip whole entries; SGD's step is linear in g
        tr.optimizer = torch.optim.SGD(m.parameters(), lr=1e-2)
        batch.old_logprobs = tr.old_logprobs(batch)
        tr.update(batch)
        after.append([p.detach().clone() for p in m.parameters()])
    moved = max((a - p).abs().max().item() for a, p in zip(after[0], base.parameters(),
                                                          strict=True))
    assert moved > 1e-4  # the step did something
    for a, b in zip(*after, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_batch_without_prompt_lengths_takes_the_plain_forward() -> None:
    model = build_model("qwen2-1m", seed=1)[0]
    batch = _batch()
    plain = compute_logprobs(model, batch, 15, share_prompt=False)
    batch.prompt_lens = None
    assert torch.equal(compute_logprobs(model, batch, 15, share_prompt=True), plain)


def test_slices_keep_their_prompt_lengths() -> None:
    batch = _batch()
    part = batch.slice(3, 9)
    assert part.prompt_lens is not None
    assert part.prompt_lens.tolist() == batch.prompt_lens[3:9].tolist()


def test_length_buckets_cover_every_row_once_and_cut_padding() -> None:
    from jigsawrl.engine.shared_prompt import length_buckets

    lengths = [5, 18, 7, 3, 9, 4, 12, 6] * 8
    buckets = length_buckets(lengths, overhead=32)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    padded = sum(len(b) * max(lengths[i] for i in b) for b in buckets)
    assert 1 < len(buckets) < len(lengths)
    assert padded < len(lengths) * max(lengths)  # fewer positions than one padded pass
    assert length_buckets(lengths, overhead=10**9) == [sorted(range(64), key=lambda i: lengths[i])]
    assert length_buckets([]) == []
