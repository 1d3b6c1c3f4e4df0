"""Supervised warm start on task demonstrations, cached on disk.

What: a short SFT phase (next-token cross-entropy on ``prompt → demo<eos>``, loss on the response
only) that turns a randomly initialised preset into a policy with non-zero reward, so that GRPO has
a signal from its first step (with all-zero rewards every group has advantage 0).

Why short: the CPU notes measured that a long warm start solves the task outright and leaves RL
nothing to learn; the default 150 steps stops at a low-but-nonzero reward. Multi-turn demos include
the tool calls and the tool results exactly as the tool inserts them; the tool results are masked
out of the loss (found by replaying the demo through the task's own tool), because a model that
learns to write ``<r>..</r>`` itself never waits for the tool.

The trained weights are cached under ``cache_dir`` keyed by model, task, seed, steps, lr and batch
size, so a second run with the same key loads them in milliseconds. Weights trained on a GPU are
cached apart from the CPU's (a ``-cuda`` suffix): float results differ between devices, and a run
on one device must not start from weights another device trained.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from jigsawrl.engine.device import model_device, to_device, to_host
from jigsawrl.engine.trajectory import encode_prompt, encode_text
from jigsawrl.tasks import safe_call_tool

log = logging.getLogger(__name__)

_FORMAT = "v2"  # bump when the training recipe changes, so stale cache entries are not reused


@dataclass(frozen=True)
class WarmStartSpec:
    """What to train and how; every field is part of the cache key."""

    model_key: str
    task_key: str
    seed: int
    steps: int
    lr: float = 1e-3
    batch_size: int = 32

    def cache_name(self) -> str:
        raw = (f"{_FORMAT}|{self.model_key}|{self.task_key}|{self.seed}|{self.steps}|{self.lr}|"
               f"{self.batch_size}")
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.model_key}-{self.task_key}")[-60:]
        digest = hashlib.sha256(raw.encode()).hexdigest()[:12]
        return f"{slug}-s{self.seed}-n{self.steps}-{digest}"


def default_cache_dir() -> Path:
    """``$JIGSAWRL_CACHE/warmstart`` or ``~/.cache/jigsawrl/warmstart``."""
    base = os.environ.get("JIGSAWRL_CACHE") or str(Path.home() / ".cache" / "jigsawrl")
    return Path(base) / "warmstart"


def demo_tool_mask(task: Any, demo: str) -> list[int]:
    """Per-character mask of ``demo``: 0 on the tool results the task's tool would insert.

    The demo is replayed turn by turn: at every tool-call stop string the task's own
    ``call_tool`` is asked for the result, and where the demo continues with exactly that text,
    those characters get 0 (the model never writes them at rollout time, so it must not learn to
    imitate them: a model that writes its own ``<r>..</r>`` skips the tool).
    """
    mask = [1] * len(demo)
    stops = tuple(getattr(task, "stop", ())) if getattr(task, "multi_turn", False) else ()
    pos, turn_start, state = 0, 0, {}
    while stops:
        hits = [(demo.find(s, pos), s) for s in stops if demo.find(s, pos) >= 0]
        if not hits:
            break
        at, stop = min(hits)
        end = at + len(stop)
        result = safe_call_tool(task, demo[turn_start:end], state).text
        if not demo.startswith(result, end):
            pos = end
            continue
        mask[end: end + len(result)] = [0] * len(result)
        pos = turn_start = end + len(result)
    return mask


def sft_examples(tokenizer: Any, examples: list[Any],
                 task: Any = None) -> list[tuple[list[int], list[int], list[int]]]:
    """``(prompt_ids, response_ids + [eos], loss_mask)`` for the examples that carry a demo.

    The character tokenizer gives one token per character, so the character mask of
    :func:`demo_tool_mask` is the token mask; for other tokenizers the whole demo is trained on.
    """
    triples = []
    for ex in examples:
        demo = getattr(ex, "demo", None)
        if not demo:
            continue
        ids = encode_text(tokenizer, demo)
        mask = demo_tool_mask(task, demo) if task is not None else [1] * len(ids)
        if len(mask) != len(ids):
            mask = [1] * len(ids)
        triples.append((encode_prompt(tokenizer, ex.prompt), ids + [tokenizer.eos_token_id],
                        mask + [1]))
    return triples


def _collate(triples: list[tuple[list[int], list[int], list[int]]],
             pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(p) + len(r) for p, r, _ in triples)
    ids = torch.full((len(triples), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (p, r, m) in enumerate(triples):
        seq = p + r
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        labels[i, len(p): len(seq)] = torch.tensor([t if k else -100 for t, k in zip(r, m,
                                                                                   strict=True)])
    return ids, attn, labels


def sft_loss(model: nn.Module, ids: torch.Tensor, attn: torch.Tensor,
             labels: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy of the response tokens."""
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       labels[:, 1:].reshape(-1), ignore_index=-100)


def train_sft(model: nn.Module, tokenizer: Any,
              pairs: list[tuple[list[int], list[int], list[int]]],
              spec: WarmStartSpec) -> dict[str, float]:
    """Run ``spec.steps`` AdamW steps on random mini-batches of ``pairs`` (seeded)."""
    if not pairs:
        raise ValueError("no demonstrations to warm start on")
    gen = torch.Generator().manual_seed(spec.seed)  # CPU draws: the same batches on any device
    device = model_device(model)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    model.train()
    first = last = float("nan")
    for step in range(spec.steps):
        idx = torch.randint(len(pairs), (min(spec.batch_size, len(pairs)),), generator=gen)
        ids, attn, labels = to_device(
            _collate([pairs[i] for i in idx.tolist()], tokenizer.pad_token_id), device)
        loss = sft_loss(model, ids, attn, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step in (0, spec.steps - 1):  # one device sync at each end, not one per step
            last = float(loss.item())
            first = last if step == 0 else first
    return {"loss_first": first, "loss_last": last}


def warm_start(model: nn.Module, tokenizer: Any, examples: list[Any], spec: WarmStartSpec,
               cache_dir: Path | None = None, task: Any = None) -> dict[str, Any]:
    """Warm-start ``model`` in place from the cache, or train it and fill the cache.

    Args:
        model: the freshly built model (its initial weights must depend only on ``spec``).
        tokenizer: the model's tokenizer.
        examples: task examples with ``prompt`` and ``demo``.
        task: the task, to mask its tool results out of the loss (multi-turn demos).
        spec: the key and hyper-parameters.
        cache_dir: where cached weights live; None means :func:`default_cache_dir`.

    Returns:
        ``{"cached": bool, "duration_s": float, "path": str, ...losses}``.
    """
    if spec.steps <= 0:
        return {"cached": False, "duration_s": 0.0, "path": ""}
    kind = model_device(model).type
    suffix = "" if kind == "cpu" else f"-{kind}"  # the CPU's names are unchanged
    path = (cache_dir or default_cache_dir()) / f"{spec.cache_name()}{suffix}.safetensors"
    t0 = time.perf_counter()
    if path.is_file():
        try:
            model.load_state_dict(load_file(str(path)))
            log.info("warm start loaded from cache %s", path)
            return {"cached": True, "duration_s": time.perf_counter() - t0, "path": str(path)}
        except (OSError, RuntimeError) as exc:
            log.warning("warm-start cache %s unreadable (%s); retraining", path, exc)
    info: dict[str, Any] = dict(train_sft(model, tokenizer, sft_examples(tokenizer, examples, task),
                                          spec))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    state = {k: v.contiguous() for k, v in to_host(model.state_dict(), copy=True).items()}
    save_file(state, str(tmp))
    tmp.replace(path)
    info.update(cached=False, duration_s=time.perf_counter() - t0, path=str(path))
    log.info("warm start: %d steps in %.1f s, loss %.3f -> %.3f", spec.steps, info["duration_s"],
             info["loss_first"], info["loss_last"])
    return info
