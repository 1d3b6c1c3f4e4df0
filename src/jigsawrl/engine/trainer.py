"""GRPO trainer: advantages, PPO-clip loss, k3 KL, entropy, AdamW with micro-batches.

What: the actor-update half of a GRPO step. The rollout side hands over a :class:`TrainBatch`
(prompt + response token ids, a loss mask that is 1 only on tokens the model generated, one
advantage per sequence); this module recomputes old log-probs, computes reference log-probs with a
frozen copy, and runs the PPO-clip update.

Why these choices (verl's defaults, which users know):

- advantages are group-normalised: ``(r - mean_group) / (std_group + eps)``; a group whose rewards
  are all equal carries no signal and gets advantage 0 (never NaN);
- the loss is aggregated "token-mean" over the *whole* batch: every micro-batch divides its summed
  token loss by the token count of the full batch, so gradient accumulation over micro-batches gives
  exactly the gradient of the full-batch token mean, independent of ``micro_batch_size``;
- tool-result tokens (mask 0) and padding never enter the loss, the KL or the entropy metric;
- the KL to the reference is the low-variance "k3" estimator ``exp(q - p) - (q - p) - 1`` with
  ``p`` the current and ``q`` the reference log-prob; it is off (``kl_coef = 0``) by default, as
  in verl's GRPO recipes, and the reference forward is then skipped by the pipeline.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from jigsawrl.engine.shared_prompt import shared_prompt_forward, takes_kv_cache

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- math


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """GRPO advantages: rewards normalised within consecutive groups of ``group_size``.

    Args:
        rewards: shape ``[num_prompts * group_size]``, groups contiguous.
        group_size: responses per prompt.
        eps: added to the group standard deviation.

    Returns:
        Advantages of the same shape; 0 for every member of a zero-variance group (and for
        groups of size 1).

    Raises:
        ValueError: the length is not a multiple of ``group_size``.
    """
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.reshape(-1, group_size).to(torch.float64)
    if group_size == 1:
        return torch.zeros_like(rewards, dtype=torch.float32)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True, unbiased=True)
    adv = (r - mean) / (std + eps)
    adv = torch.where(std > 1e-8, adv, torch.zeros_like(adv))
    return adv.reshape(-1).to(torch.float32)


def masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    """Sum of ``values`` where ``mask`` is 1."""
    return (values * mask).sum()


def ppo_clip_token_loss(logp: Tensor, old_logp: Tensor, adv: Tensor,
                        clip_eps: float) -> tuple[Tensor, Tensor]:
    """Per-token PPO-clip loss ``-min(ρA, clip(ρ, 1±ε)A)`` and the per-token "was clipped" flag.

    Args:
        logp, old_logp: ``[N, T]`` log-probs of the taken tokens under the current / old policy.
        adv: ``[N]`` sequence advantages (broadcast over tokens) or ``[N, T]``.
        clip_eps: ε.
    """
    if adv.dim() == 1:
        adv = adv[:, None]
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).to(logp.dtype)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token low-variance KL estimate (Schulman's k3): ``exp(q-p) - (q-p) - 1`` ≥ 0."""
    delta = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.exp(delta) - delta - 1.0


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy of the categorical distribution given by ``logits`` (last dim)."""
    logz = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return logz - (probs * logits).sum(dim=-1)


# --------------------------------------------------------------------------- batches


@dataclass
class TrainBatch:
    """Sequences for one update. Index ``t`` of the ``[N, T-1]`` tensors is the token ``t+1``.

    Attributes:
        input_ids: ``[N, T]`` prompt + response ids, right-padded.
        attention_mask: ``[N, T]`` 1 on real tokens.
        loss_mask: ``[N, T-1]`` 1 on model-generated response tokens (targets), else 0.
        advantages: ``[N]``.
        old_logprobs, ref_logprobs: ``[N, T-1]`` once computed.
        prompt_lens: ``[N]`` prompt tokens of each row; with it, rows that share a prompt
            forward it once (:mod:`jigsawrl.engine.shared_prompt`).
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    advantages: Tensor
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    prompt_lens: Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.input_ids.shape[0])

    def slice(self, start: int, stop: int) -> TrainBatch:
        """Rows ``start:stop``, trimmed to the longest real sequence among them."""
        length = int(self.attention_mask[start:stop].sum(dim=1).max().item())
        length = max(length, 2)

        def cut(t: Tensor | None, cols: int) -> Tensor | None:
            return None if t is None else t[start:stop, :cols]

        return replace(self, input_ids=self.input_ids[start:stop, :length],
                       attention_mask=self.attention_mask[start:stop, :length],
                       loss_mask=self.loss_mask[start:stop, : length - 1],
                       advantages=self.advantages[start:stop],
                       old_logprobs=cut(self.old_logprobs, length - 1),
                       ref_logprobs=cut(self.ref_logprobs, length - 1),
                       prompt_lens=None if self.prompt_lens is None
                       else self.prompt_lens[start:stop])

    def micro_batches(self, size: int) -> Iterator[TrainBatch]:
        for start in range(0, self.num_seqs, size):
            yield self.slice(start, min(start + size, self.num_seqs))


def build_batch(sequences: list[tuple[list[int], list[int], list[int]]], advantages: Tensor,
                pad_id: int) -> TrainBatch:
    """Pad ``(prompt_ids, response_ids, response_mask)`` triples into a :class:`TrainBatch`.

    ``response_mask`` is the engine's output mask: 1 for model tokens, 0 for tool tokens.
    """
    n = len(sequences)
    width = max(max(len(p) + len(r) for p, r, _ in sequences), 2)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width - 1), dtype=torch.float32)
    has_prompts = all(len(p) > 0 for p, _, _ in sequences)
    prompt_lens = torch.tensor([len(p) for p, _, _ in sequences], dtype=torch.long)
    for i, (prompt, resp, mask) in enumerate(sequences):
        seq = list(prompt) + list(resp)
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[i, : len(seq)] = 1
        if resp:
            start = len(prompt) - 1  # target index of the first response token
            loss_mask[i, start: start + len(resp)] = torch.tensor(mask, dtype=torch.float32)
    return TrainBatch(ids, attn, loss_mask, advantages.to(torch.float32),
                      prompt_lens=prompt_lens if has_prompts else None)


def _forward_logits(model: nn.Module, batch: TrainBatch) -> Tensor:
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    return out.logits[:, :-1, :].float()


def token_logprobs_from_logits(logits: Tensor, input_ids: Tensor) -> Tensor:
    """Log-prob of each next token: ``[N, T-1]`` from ``[N, T-1, V]`` logits and ``[N, T]`` ids."""
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


@dataclass
class TokenView:
    """One micro-batch's target tokens as the loss sees them, in either layout: the batch's
    ``[n, T-1]`` target layout (plain forward) or the response layout of
    :mod:`jigsawrl.engine.shared_prompt`. Only positions where ``loss_mask`` is 1 matter."""

    logits: Tensor
    logp: Tensor
    loss_mask: Tensor
    old: Tensor | None
    ref: Tensor | None
    valid: Tensor | None = None  # response layout: True on real response tokens
    target_index: Tensor | None = None  # response layout: each token's target-layout column


def token_view(model: nn.Module, mb: TrainBatch, share_prompt: bool) -> TokenView:
    """Forward ``mb`` and return its tokens' logits and log-probs with the matching masks."""
    if not share_prompt or mb.prompt_lens is None or not takes_kv_cache(model):
        logits = _forward_logits(model, mb)
        return TokenView(logits, token_logprobs_from_logits(logits, mb.input_ids), mb.loss_mask,
                         mb.old_logprobs, mb.ref_logprobs)
    out = shared_prompt_forward(model, mb.input_ids, mb.attention_mask, mb.prompt_lens)
    logp = torch.log_softmax(out.logits, dim=-1).gather(-1, out.tokens[..., None]).squeeze(-1)
    idx, valid = out.target_index, out.valid.to(mb.loss_mask.dtype)

    def pick(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.gather(1, idx)

    return TokenView(out.logits, logp, mb.loss_mask.gather(1, idx) * valid,
                     pick(mb.old_logprobs), pick(mb.ref_logprobs), out.valid, idx)


def autocast(model: nn.Module, mode: str = "off") -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on the model's device for ``mode == "bf16"``; a no-op for ``"off"``."""
    if mode == "off":
        return contextlib.nullcontext()
    if mode != "bf16":
        raise ValueError(f"autocast {mode!r}: use 'off' or 'bf16'")
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


@torch.no_grad()
def compute_logprobs(model: nn.Module, batch: TrainBatch, micro_batch_size: int,
                     share_prompt: bool = True, autocast_mode: str = "off") -> Tensor:
    """Log-probs ``[N, T-1]`` of the batch's tokens under ``model`` (no grad, micro-batched).

    With ``share_prompt`` (and prompt lengths in the batch) only response targets are filled
    (prompt targets are 0): those are the only ones any loss reads."""
    width = batch.input_ids.shape[1] - 1
    out = torch.zeros((batch.num_seqs, width), dtype=torch.float32,
                      device=batch.input_ids.device)
    was_training = model.training
    model.eval()
    row = 0
    for mb in batch.micro_batches(micro_batch_size):
        with autocast(model, autocast_mode):
            view = token_view(model, mb, share_prompt)
        if view.valid is None or view.target_index is None:
            out[row: row + mb.num_seqs, : view.logp.shape[1]] = view.logp
        else:
            rows, j = torch.nonzero(view.valid, as_tuple=True)
            out[row + rows, view.target_index[rows, j]] = view.logp[rows, j]
        row += mb.num_seqs
    model.train(was_training)
    return out


@dataclass
class ShardGrads:
    """The gradients (one per trainable parameter, in ``parameters()`` order; None where a
    parameter got none) and the loss sums of one data-parallel shard of an update."""

    grads: list[Tensor | None]
    sums: dict[str, float]


def accumulate_grads(model: nn.Module, batch: TrainBatch, total_tokens: float,
                     cfg: GRPOConfig) -> dict[str, float]:
    """Forward/backward ``batch`` in micro-batches, adding to ``.grad``; the loss is a token mean
    over ``total_tokens`` (the whole step's, so shards add up to the full batch's gradient)."""
    sums = {"pg": 0.0, "kl": 0.0, "ent": 0.0, "clip": 0.0, "ppo_kl": 0.0}
    for mb in batch.micro_batches(cfg.micro_batch_size):
        with autocast(model, cfg.autocast):
            view = token_view(model, mb, cfg.share_prompt)
        logits, logp, mask = view.logits, view.logp, view.loss_mask
        old = view.old if view.old is not None else logp.detach()
        pg_tok, clipped = ppo_clip_token_loss(logp, old, mb.advantages, cfg.clip_eps)
        pg = masked_sum(pg_tok, mask) / total_tokens
        loss = pg
        if cfg.kl_coef > 0 and view.ref is not None:
            kl = masked_sum(kl_k3(logp, view.ref), mask) / total_tokens
            loss = loss + cfg.kl_coef * kl
            sums["kl"] += float(kl.item())
        loss.backward()
        with torch.no_grad():
            sums["pg"] += float(pg.item())
            sums["ent"] += float(masked_sum(entropy_from_logits(logits), mask))
            sums["clip"] += float(masked_sum(clipped, mask))
            sums["ppo_kl"] += float(masked_sum(old - logp, mask))
    return sums


def shard_grads(model: nn.Module, batch: TrainBatch, total_tokens: float,
                cfg: GRPOConfig) -> ShardGrads:
    """The gradients of one shard of an update (a data-parallel helper's part)."""
    model.train()
    model.zero_grad(set_to_none=True)
    sums = accumulate_grads(model, batch, total_tokens, cfg)
    grads = [None if p.grad is None else p.grad.detach().clone()
             for p in model.parameters() if p.requires_grad]
    return ShardGrads(grads, sums)


# --------------------------------------------------------------------------- trainer


@dataclass(frozen=True)
class GRPOConfig:
    """Trainer hyper-parameters (mirrors :class:`jigsawrl.config.TrainSpec`)."""

    lr: float = 5e-5
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    grad_clip: float = 1.0
    micro_batch_size: int = 64
    ppo_epochs: int = 1
    weight_decay: float = 0.0
    recompute_old_logprobs: bool = True
    share_prompt: bool = True  # forward each group's prompt once (exact; engine.shared_prompt)
    autocast: str = "off"  # "bf16": bf16 autocast of the forward passes (TrainSpec.autocast)


class GRPOTrainer:
    """Owns the actor, its AdamW optimizer and the optional frozen reference model.

    Args:
        model: the actor (a causal LM returning ``.logits``); trained in place.
        config: hyper-parameters.
        ref_model: frozen reference for the KL term; needed only when ``config.kl_coef > 0``.
    """

    def __init__(self, model: nn.Module, config: GRPOConfig,
                 ref_model: nn.Module | None = None) -> None:
        if config.kl_coef > 0 and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.model = model
        self.config = config
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.requires_grad_(False)
            ref_model.eval()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                           weight_decay=config.weight_decay)

    @property
    def on_policy_shortcut(self) -> bool:
        """True when the old log-probs are the update's own (detached) log-probs.

        With one PPO epoch and one optimizer step per batch, the behaviour policy *is* the
        current policy, so a separate pass would recompute the very same numbers (ratio 1).
        """
        return not self.config.recompute_old_logprobs and self.config.ppo_epochs == 1

    def old_logprobs(self, batch: TrainBatch) -> Tensor:
        """Recompute the behaviour policy's log-probs with the current actor (before updating)."""
        return compute_logprobs(self.model, batch, self.config.micro_batch_size,
                                self.config.share_prompt, self.config.autocast)

    def ref_logprobs(self, batch: TrainBatch) -> Tensor:
        if self.ref_model is None:
            raise ValueError("no reference model")
        return compute_logprobs(self.ref_model, batch, self.config.micro_batch_size,
                                self.config.share_prompt, self.config.autocast)

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """Run ``ppo_epochs`` optimizer steps over the batch; return verl-named metrics.

        Raises:
            ValueError: ``old_logprobs`` (or ``ref_logprobs`` with KL on) were not computed.
        """
        self._check_ready(batch)
        total_tokens = float(batch.loss_mask.sum().item())
        if total_tokens == 0:
            log.warning("update skipped: the batch has no response tokens")
            return {"actor/pg_loss": 0.0, "actor/kl_loss": 0.0, "actor/entropy": 0.0,
                    "actor/grad_norm": 0.0, "actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.0}
        self.model.train()
        metrics: dict[str, float] = {}
        for _ in range(self.config.ppo_epochs):
            metrics = self._one_epoch(batch, total_tokens)
        return metrics

    def _check_ready(self, batch: TrainBatch) -> None:
        if batch.old_logprobs is None and not self.on_policy_shortcut:
            raise ValueError("compute old_logprobs before update()")
        if self.config.kl_coef > 0 and batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0: compute ref_logprobs before update()")

    def _one_epoch(self, batch: TrainBatch, total_tokens: float,
                   more: Callable[[], list[ShardGrads]] | None = None) -> dict[str, float]:
        """One optimizer step over ``batch``; ``more`` returns the gradients of the other
        data-parallel shards of the same step (computed elsewhere, same ``total_tokens``),
        called after this shard's backward so both overlap."""
        cfg = self.config
        self.optimizer.zero_grad(set_to_none=True)
        sums = accumulate_grads(self.model, batch, total_tokens, cfg)
        params = [p for p in self.model.parameters() if p.requires_grad]
        for other in (more() if more is not None else []):
            for p, g in zip(params, other.grads, strict=True):
                if g is not None:
                    g = g.to(p.device)
                    p.grad = g.clone() if p.grad is None else p.grad.add_(g)
            for k, v in other.sums.items():
                sums[k] += v
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        if math.isfinite(float(grad_norm)):
            self.optimizer.step()
        else:
            log.warning("non-finite grad norm %s: optimizer step skipped", float(grad_norm))
        return {"actor/pg_loss": sums["pg"], "actor/kl_loss": sums["kl"],
                "actor/entropy": sums["ent"] / total_tokens,
                "actor/grad_norm": float(grad_norm),
                "actor/pg_clipfrac": sums["clip"] / total_tokens,
                "actor/ppo_kl": sums["ppo_kl"] / total_tokens}

    def update_data_parallel(self, batch: TrainBatch, total_tokens: float,
                             shards: Callable[[int], Callable[[], list[ShardGrads]]]
                             ) -> dict[str, float]:
        """``ppo_epochs`` optimizer steps over this shard plus the other data-parallel shards:
        the same steps as :meth:`update` on the whole batch, up to float summation order.

        ``shards(epoch)`` is called as each epoch starts, with this trainer's weights as they
        are for that epoch (the caller launches the other shards' :func:`shard_grads` on them),
        and returns a function that fetches their gradients; it is called after this shard's
        backward, so the shards run side by side. A later epoch needs the weights of the
        previous step, so each epoch is one round trip."""
        self._check_ready(batch)
        self.model.train()
        metrics: dict[str, float] = {}
        for epoch in range(self.config.ppo_epochs):
            metrics = self._one_epoch(batch, total_tokens, shards(epoch))
        return metrics

    def state_dict(self) -> dict[str, object]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.model.load_state_dict(state["model"])  # type: ignore[arg-type]
        self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]


__all__ = ["GRPOConfig", "GRPOTrainer", "ShardGrads", "TrainBatch", "accumulate_grads",
           "build_batch", "compute_logprobs", "shard_grads",
           "entropy_from_logits", "group_advantages", "kl_k3", "ppo_clip_token_loss",
           "token_logprobs_from_logits"]
