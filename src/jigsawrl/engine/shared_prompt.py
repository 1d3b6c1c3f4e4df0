"""The shared-prompt forward: each GRPO group's prompt goes through the model once, not G times.

What: the ``G`` responses of a GRPO group share one prompt. The plain forward of a training
micro-batch runs ``[prompt + response]`` for every row, so each prompt token is computed (and
back-propagated) ``G`` times. Here the distinct prompts run once, with a KV cache; the cache's
rows are repeated for the group's members (an index-select, which autograd sums back), and the
responses run on top of it. Every response token sees exactly the keys and values it sees in the
plain forward (same positions, same masks), so log-probs and gradients are the same up to float
summation order (tested against the plain forward).

Why: in GRPO on short-answer tasks the prompt is most of the sequence (arithmetic: ~35 prompt
tokens, ~8 response tokens), so the update's cost is mostly prompt tokens repeated ``G`` times.
This is not a verl or TRL feature (both forward every row in full); it is exact maths, so it is
on by default (``GRPOConfig.share_prompt``), and the plain path stays for batches without prompt
lengths and as the reference the tests compare against.

The result is in *response layout*: ``[n, R]`` with ``R`` the micro-batch's longest response,
column ``j`` the log-prob of response token ``j``; :func:`to_target_index` maps it to the
``[n, T-1]`` target layout of :class:`~jigsawrl.engine.trainer.TrainBatch`.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from jigsawrl.workload.buckets import length_buckets


@dataclass
class PromptGroups:
    """Which rows of a micro-batch share a prompt.

    Attributes:
        heads: ``[g]`` the first row of each group of consecutive rows with one prompt.
        member: ``[n]`` each row's group index (into ``heads``).
    """

    heads: Tensor
    member: Tensor


def prompt_groups(input_ids: Tensor, prompt_lens: Tensor) -> PromptGroups:
    """Runs of consecutive rows with identical prompts (GRPO keeps a group's rows together)."""
    n = int(input_ids.shape[0])
    width = int(prompt_lens.max().item()) if n else 0
    cols = torch.arange(width, device=input_ids.device)
    prompt = torch.where(cols[None, :] < prompt_lens[:, None], input_ids[:, :width],
                         torch.full_like(input_ids[:, :width], -1))
    same = torch.zeros(n, dtype=torch.bool, device=input_ids.device)
    if n > 1:
        same[1:] = (prompt[1:] == prompt[:-1]).all(dim=1) & (prompt_lens[1:] == prompt_lens[:-1])
    new_group = ~same
    member = torch.cumsum(new_group.long(), dim=0) - 1
    heads = torch.nonzero(new_group).flatten()
    return PromptGroups(heads, member)


@functools.cache
def _takes_kv_cache(model_cls: type) -> bool:
    params = inspect.signature(model_cls.forward).parameters
    return "position_ids" in params and ("cache" in params or "past_key_values" in params)


def takes_kv_cache(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes a KV cache and positions (every transformers causal LM
    does; a bare ``nn.Module`` may not, and then the plain forward is used)."""
    return _takes_kv_cache(type(model))


def _new_cache(model: nn.Module) -> object:
    from transformers import DynamicCache

    return DynamicCache(config=getattr(model, "config", None))


@dataclass
class ResponseLogits:
    """The output of :func:`shared_prompt_forward`.

    Attributes:
        logits: ``[n, R, V]`` float logits; column ``j`` predicts response token ``j``.
        tokens: ``[n, R]`` the response tokens (pad beyond each row's length).
        valid: ``[n, R]`` True on real response tokens.
        target_index: ``[n, R]`` the column of each response token in the ``[n, T-1]`` target
            layout (``prompt_len - 1 + j``, clamped into range where not valid).
    """

    logits: Tensor
    tokens: Tensor
    valid: Tensor
    target_index: Tensor


def shared_prompt_forward(model: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                          prompt_lens: Tensor) -> ResponseLogits:
    """Forward a right-padded ``[prompt + response]`` micro-batch with each distinct prompt once.

    Args:
        model: a causal LM taking a KV cache (see :func:`jigsawrl.engine.models.kv_call`).
        input_ids, attention_mask: ``[n, T]`` right-padded rows, as in ``TrainBatch``.
        prompt_lens: ``[n]`` prompt tokens of each row (≥ 1).
    """
    from jigsawrl.engine.models import kv_call

    device = input_ids.device
    groups = prompt_groups(input_ids, prompt_lens)
    lens = attention_mask.sum(dim=1)
    resp_lens = lens - prompt_lens
    width_p = int(prompt_lens.max().item())
    width_r = max(int(resp_lens.max().item()), 1)

    # 1. The distinct prompts, right-padded (positions 0..p-1, exactly as in the plain forward).
    cols_p = torch.arange(width_p, device=device)
    head_lens = prompt_lens[groups.heads]
    prompt_mask = (cols_p[None, :] < head_lens[:, None]).long()
    cache = _new_cache(model)
    prompt_logits = kv_call(model, input_ids[groups.heads, :width_p], prompt_mask, None, cache)
    rows_g = torch.arange(int(groups.heads.numel()), device=device)
    last = prompt_logits[rows_g, head_lens - 1].float()  # predicts each group's first token

    # 2. The responses on top of their prompt's keys and values, in buckets of similar length
    #    (responses vary 2-10x in length; one right-padded pass would be mostly padding).
    cols_r = torch.arange(width_r, device=device)
    valid = cols_r[None, :] < resp_lens[:, None]
    total = input_ids.shape[1]
    src = (prompt_lens[:, None] + cols_r[None, :]).clamp(max=total - 1)
    tokens = torch.where(valid, input_ids.gather(1, src), torch.zeros_like(src))
    positions = prompt_lens[:, None] + cols_r[None, :]
    member_mask = prompt_mask[groups.member]
    layers = [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[attr-defined]
    parts, order = [], []
    for rows in length_buckets(resp_lens.tolist()):
        idx = torch.tensor(rows, device=device)
        width = max(int(resp_lens[idx].max().item()), 1)
        part_cache = _new_cache(model)
        sel = groups.member[idx]
        for i, (k, v) in enumerate(layers):
            part_cache.update(k[sel], v[sel], i)  # type: ignore[attr-defined]
        mask = torch.cat([member_mask[idx], valid[idx, :width].long()], dim=1)
        out = kv_call(model, tokens[idx, :width], mask, positions[idx, :width], part_cache)
        parts.append(nn.functional.pad(out.float(), (0, 0, 0, width_r - width)))
        order.append(idx)
    inverse = torch.empty(input_ids.shape[0], dtype=torch.long, device=device)
    flat = torch.cat(order)
    inverse[flat] = torch.arange(flat.numel(), device=device)
    resp_logits = torch.cat(parts)[inverse]
    logits = torch.cat([last[groups.member][:, None, :], resp_logits[:, :-1, :]], dim=1)
    target_index = (prompt_lens[:, None] - 1 + cols_r[None, :]).clamp(min=0, max=total - 2)
    return ResponseLogits(logits, tokens, valid, target_index)


__all__ = ["PromptGroups", "ResponseLogits", "length_buckets", "prompt_groups",
           "shared_prompt_forward",
           "takes_kv_cache"]
