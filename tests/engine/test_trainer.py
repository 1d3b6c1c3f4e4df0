"""GRPO math and the trainer's update on hand-made tensors and a tiny model."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from jigsawrl.engine.trainer import (  # noqa: E402
    GRPOConfig,
    GRPOTrainer,
    build_batch,
    compute_logprobs,
    entropy_from_logits,
    group_advantages,
    kl_k3,
    ppo_clip_token_loss,
)

torch.set_num_threads(1)


def test_group_advantages_normalise_within_groups() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 5.0, 5.0, 5.0])
    adv = group_advantages(r, group_size=4)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std(unbiased=True).item()
    expect = (1.0 - 0.5) / (std + 1e-6)
    assert adv[:4].tolist() == pytest.approx([expect, -expect, -expect, expect], rel=1e-5)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # zero-variance group: no signal, no NaN
    assert torch.isfinite(adv).all()


def test_group_advantages_size_one_and_bad_shape() -> None:
    assert group_advantages(torch.tensor([1.0, 2.0]), 1).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 2.0, 3.0]), 2)


def test_ppo_clip_loss_values() -> None:
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5, 1.1]]))  # ratios 1, 1.5, 0.5, 1.1
    pos, clip_pos = ppo_clip_token_loss(logp, old, torch.tensor([2.0]), clip_eps=0.2)
    # A>0: -min(ρA, clip(ρ)A) = -A*min(ρ, clip(ρ))
    assert pos[0].tolist() == pytest.approx([-2.0, -2.4, -1.0, -2.2], rel=1e-6)
    assert clip_pos[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    neg, clip_neg = ppo_clip_token_loss(logp, old, torch.tensor([-1.0]), clip_eps=0.2)
    # A<0: loss = max(-ρA, -clip(ρ)A) = max(ρ, clip(ρ))
    assert neg[0].tolist() == pytest.approx([1.0, 1.5, 0.8, 1.1], rel=1e-6)
    assert clip_neg[0].tolist() == [0.0, 0.0, 1.0, 0.0]


def test_kl_k3_formula() -> None:
    p = torch.tensor([-1.0, -2.0, -0.5])
    q = torch.tensor([-1.0, -1.0, -2.0])
    d = q - p
    assert kl_k3(p, q).tolist() == pytest.approx((torch.exp(d) - d - 1).tolist())
    assert kl_k3(p, p).tolist() == [0.0, 0.0, 0.0]
    assert (kl_k3(p, q) >= 0).all()


def test_entropy_uniform() -> None:
    ent = entropy_from_logits(torch.zeros(2, 3, 8))
    assert ent.flatten().tolist() == pytest.approx([math.log(8)] * 6, rel=1e-6)


def test_build_batch_masks_prompt_tool_and_padding() -> None:
    seqs = [([1, 2], [3, 4, 5], [1, 0, 1]), ([1], [6], [1])]
    b = build_batch(seqs, torch.tensor([1.0, -1.0]), pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 6, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # target t is token t+1: response of row 0 starts at target index 1; tool token masked out
    assert b.loss_mask.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]


class _TinyLM(nn.Module):
    """A bigram 'language model' returning ``.logits`` like an HF causal LM."""

    def __init__(self, vocab: int = 7, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, 16)
        self.out = nn.Linear(16, vocab)

    def forward(self, input_ids, attention_mask=None, use_cache=False):  # noqa: ANN001
        class _O:
            pass

        o = _O()
        o.logits = self.out(torch.tanh(self.emb(input_ids)))
        return o


def _batch():
    seqs = [([1, 2], [3, 4, 5], [1, 0, 1]), ([1, 2], [6, 3], [1, 1]),
            ([2], [4, 4, 4, 4], [1, 1, 1, 1]), ([2], [5], [1])]
    return build_batch(seqs, group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2), pad_id=0)


def test_token_level_loss_ignores_masked_tokens_and_micro_batching() -> None:
    grads = []
    for mbs in (4, 1):
        model = _TinyLM()
        trainer = GRPOTrainer(model, GRPOConfig(lr=1e-2, micro_batch_size=mbs))
        batch = _batch()
        batch.old_logprobs = trainer.old_logprobs(batch)
        metrics = trainer.update(batch)
        assert metrics["actor/pg_clipfrac"] == 0.0  # on-policy first epoch: ratio 1
        grads.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(grads[0], grads[1], strict=True):
        assert torch.allclose(a, b, atol=1e-6)  # micro-batch size does not change the step


def test_masked_tool_token_has_no_gradient() -> None:
    model = _TinyLM()
    batch = _batch()
    batch.old_logprobs = compute_logprobs(model, batch, 4)
    trainer = GRPOTrainer(model, GRPOConfig(lr=1e-2))
    # perturb the target of the masked tool token (row 0, target idx 2): loss must not change
    trainer.optimizer.zero_grad()
    logits = model(batch.input_ids).logits[:, :-1]
    lp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    loss, _ = ppo_clip_token_loss(lp, batch.old_logprobs, batch.advantages, 0.2)
    total = (loss * batch.loss_mask).sum()
    (g,) = torch.autograd.grad(total, [lp])
    assert g[0, 2].item() == 0.0 and g[0, 1].item() != 0.0


def test_kl_term_uses_reference() -> None:
    model, ref = _TinyLM(seed=0), _TinyLM(seed=1)
    trainer = GRPOTrainer(model, GRPOConfig(kl_coef=0.5), ref_model=ref)
    batch = _batch()
    batch.old_logprobs = trainer.old_logprobs(batch)
    batch.ref_logprobs = trainer.ref_logprobs(batch)
    metrics = trainer.update(batch)
    assert metrics["actor/kl_loss"] > 0.0
    assert math.isfinite(metrics["actor/grad_norm"])
    with pytest.raises(ValueError):
        GRPOTrainer(_TinyLM(), GRPOConfig(kl_coef=0.1))


def test_on_policy_shortcut_gives_the_same_step() -> None:
    params = []
    for recompute in (True, False):
        model = _TinyLM()
        trainer = GRPOTrainer(model, GRPOConfig(lr=1e-2, recompute_old_logprobs=recompute))
        batch = _batch()
        if recompute:
            batch.old_logprobs = trainer.old_logprobs(batch)
        else:
            assert trainer.on_policy_shortcut
        trainer.update(batch)
        params.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*params, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("epochs", [1, 3])
def test_data_parallel_update_equals_the_whole_batch_step(epochs: int) -> None:
    """Shards' gradients (computed on copies, as Ray workers do) summed into one optimizer
    step per epoch give the same parameters and metrics as the whole batch in one process;
    with several PPO epochs each epoch's helper starts from the previous step's weights."""
    import copy

    from jigsawrl.engine.trainer import shard_grads

    cfg = GRPOConfig(lr=1e-2, micro_batch_size=1, ppo_epochs=epochs)
    whole = GRPOTrainer(_TinyLM(), cfg)
    batch = _batch()
    batch.old_logprobs = whole.old_logprobs(batch)
    total = float(batch.loss_mask.sum())
    dp = GRPOTrainer(copy.deepcopy(whole.model), cfg)
    want = whole.update(batch)
    (a0, a1), (b0, b1) = (0, 2), (2, 4)
    helper = copy.deepcopy(dp.model)
    launched: list[int] = []

    def shards(epoch: int):  # noqa: ANN202
        launched.append(epoch)
        helper.load_state_dict(dp.model.state_dict())  # the weights this epoch starts from
        other = shard_grads(helper, batch.slice(b0, b1), total, cfg)
        return lambda: [other]

    got = dp.update_data_parallel(batch.slice(a0, a1), total, shards)
    assert launched == list(range(epochs))
    for p, q in zip(whole.model.parameters(), dp.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_bf16_autocast_is_an_option_close_to_fp32() -> None:
    """``train.autocast: bf16`` runs the forwards in bf16 (weights stay fp32); the log-probs
    are bf16-close to fp32's, and an update still steps."""
    from jigsawrl.config import TrainSpec
    from jigsawrl.engine.models import build_model
    from jigsawrl.engine.trainer import autocast

    assert TrainSpec(autocast="bf16").autocast == "bf16"
    with pytest.raises(ValueError):
        TrainSpec(autocast="fp16")
    model = build_model("qwen2-1m", seed=1)[0]
    seqs = [([3, 4, 5, 6], [7, 8, 9], [1, 1, 1]), ([3, 4, 5, 6], [9, 8], [1, 1]),
            ([10, 11], [12, 13, 14, 15], [1, 0, 1, 1])]
    batch = build_batch(seqs, torch.tensor([1.0, -1.0, 0.5]), 0)
    fp32 = compute_logprobs(model, batch, 8)
    bf16 = compute_logprobs(model, batch, 8, autocast_mode="bf16")
    mask = batch.loss_mask > 0
    assert not torch.equal(fp32[mask], bf16[mask])  # bf16 really ran
    assert torch.allclose(fp32[mask], bf16[mask], atol=0.1)
    with autocast(model, "bf16"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    tr = GRPOTrainer(model, GRPOConfig(lr=1e-2, autocast="bf16"))
    batch.old_logprobs = tr.old_logprobs(batch)
    before = [p.detach().clone() for p in model.parameters()]
    tr.update(batch)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(p.dtype == torch.float32 for p in model.parameters())
