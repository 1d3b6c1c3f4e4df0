"""The batched model work of one rollout-engine iteration: forward passes, sampling, stop checks.

What: `plan_iteration` splits the running requests of a `jigsawrl.engine.rollout.RolloutEngine`
into forward passes: one (or a few, grouped by length so that left padding stays small) over the
rows that extend by several tokens (new prompts, tool results, re-prefills) and one over the rows
that decode a single token. `BatchRunner.advance` runs one such pass through the slot cache of
`jigsawrl.engine.kvcache`, samples one token per row from the row's own generator, and says which
rows end and why (``eos``, a stop string, or ``length``); the engine's queues
(`jigsawrl.engine.admission`) then retire them.

Why apart from the queues: this is the only part that touches the model and the tokenizer; the
queues stay plain bookkeeping.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from jigsawrl.engine.admission import Seq
from jigsawrl.engine.kvcache import SlotKVCache, build_layout, group_by_length
from jigsawrl.engine.models import kv_call
from jigsawrl.engine.sampling import sample_tokens

__all__ = ["BatchRunner", "plan_iteration"]

# (a request, its finish reason, the stop string it matched or None)
Finishing = tuple[Seq, str, str | None]


def plan_iteration(running: list[Seq]) -> tuple[list[list[Seq]], int, int]:
    """The forward passes of one iteration over ``running``, in slot order.

    Returns:
        (groups, prefill tokens, decode tokens): the multi-token groups then the single-token
        group (empty groups left out); the tokens the multi-token rows feed; the rows decoding
        one token.
    """
    rows = sorted(running, key=lambda s: s.slot)
    multi = [s for s in rows if s.cached_len + 1 < s.state.context_len]
    single = [s for s in rows if s.cached_len + 1 >= s.state.context_len]
    pending = [s.state.context_len - s.cached_len for s in multi]
    groups = [[multi[i] for i in g] for g in group_by_length(pending)]
    return [g for g in (*groups, single) if g], sum(pending), len(single)


class BatchRunner:
    """Runs forward passes over groups of requests and samples their next tokens.

    Args:
        model: the causal LM (eval mode).
        tokenizer: its tokenizer (stop strings are matched on its decoded text).
        cache: the engine's slot cache.
        eos_token_id: ends a request with "eos".
        max_positions: a request whose context reaches this ends with "length".
    """

    def __init__(self, model: Any, tokenizer: Any, cache: SlotKVCache, *, eos_token_id: int,
                 max_positions: int) -> None:
        self.model = model
        self.cache = cache
        self.eos_token_id = eos_token_id
        self.max_positions = max_positions
        # The Rust tokenizer decodes ~4x faster than the transformers wrapper (stop checks run
        # every step for every request that has stop strings).
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode = (functools.partial(backend.decode, skip_special_tokens=False)
                        if backend is not None else tokenizer.decode)
        sdpa = getattr(model.config, "_attn_implementation", "sdpa") == "sdpa"
        self._mask_dtype = None if sdpa else next(model.parameters()).dtype

    def advance(self, group: list[Seq]) -> list[Finishing]:
        """Feed each row its pending tokens, sample one token per row and append it; return the
        rows that end with it (the caller retires them)."""
        logits = self._forward(group)
        params = [s.state.params for s in group]
        tokens, logprobs = sample_tokens(
            logits, [p.temperature for p in params], [p.top_p for p in params],
            [s.gen for s in group])
        finishing = []
        for seq, tok, lp in zip(group, tokens, logprobs, strict=True):
            st = seq.state
            st.output_ids.append(tok)
            st.output_logprobs.append(lp)
            st.output_mask.append(1)
            st.num_generated += 1
            matched = None
            if tok == self.eos_token_id:
                reason = "eos"
            elif st.params.stop and (matched := self._match_stop(seq)) is not None:
                reason = "stop"
            elif (st.num_generated >= st.params.max_new_tokens
                  or st.context_len >= self.max_positions):
                reason = "length"
            else:
                continue
            finishing.append((seq, reason, matched))
        return finishing

    def _forward(self, group: list[Seq]) -> torch.Tensor:
        """Feed each row its pending tokens; return the last position's logits, [B, V].

        Fresh rows (nothing cached) with identical tokens — a GRPO group's samples of one
        prompt — are prefilled once: the first such row runs, the others get a copy of its
        cache positions and its logits (the same keys, values and logits they would compute,
        as vLLM's prefix caching gives), and each still samples from its own generator."""
        rep_of = _shared_prefills(group)
        if not rep_of:
            return self._forward_rows(group)
        self.cache.reserve(max(s.slot for s in group) + 1,
                           max(s.cached_len + len(s.pending()) for s in group))
        runs = [s for i, s in enumerate(group) if i not in rep_of]
        where = {id(s): j for j, s in enumerate(runs)}
        logits = self._forward_rows(runs)
        copies = sorted(rep_of.items())
        dst = torch.tensor([group[i].slot for i, _ in copies], device=self.cache.device)
        src = torch.tensor([group[r].slot for _, r in copies], device=self.cache.device)
        self.cache.copy_prefix(src, dst, max(len(group[i].pending()) for i, _ in copies))
        for i, _ in copies:
            group[i].cached_len += len(group[i].pending())
        index = [where[id(group[rep_of.get(i, i)])] for i in range(len(group))]
        return logits[torch.tensor(index, device=logits.device)]

    def _forward_rows(self, group: list[Seq]) -> torch.Tensor:
        segments = [s.pending() for s in group]
        starts = [s.cached_len for s in group]
        self.cache.reserve(max(s.slot for s in group) + 1,
                           max(a + len(b) for a, b in zip(starts, segments, strict=True)))
        layout = build_layout([s.slot for s in group], starts, segments, self.cache.trash_pos,
                              self._mask_dtype, self.cache.device)
        self.cache.begin(layout)
        try:
            logits = kv_call(self.model, layout.input_ids, layout.attention_mask,
                             layout.position_ids, self.cache, logits_to_keep=1)
        finally:
            self.cache.end()
        for seq, seg in zip(group, segments, strict=True):
            seq.cached_len += len(seg)
        return logits[:, -1]

    def _match_stop(self, seq: Seq) -> str | None:
        """The first stop string present in the recent model text (a window covers the longest
        stop string even at 4 tokens per character, e.g. byte-level BPE)."""
        out = seq.state.output_ids
        window = 4 * max(len(s) for s in seq.state.params.stop) + 4
        text = self._decode(out[max(seq.state.stop_from, len(out) - window):])
        hits = [(text.find(s), i) for i, s in enumerate(seq.state.params.stop) if s in text]
        return seq.state.params.stop[min(hits)[1]] if hits else None


def _shared_prefills(group: list[Seq]) -> dict[int, int]:
    """``{row: the earlier row it copies}`` for fresh rows (nothing cached) of more than one
    token whose pending tokens equal an earlier fresh row's."""
    first: dict[tuple[int, ...], int] = {}
    rep_of: dict[int, int] = {}
    for i, seq in enumerate(group):
        if seq.cached_len:
            continue
        key = tuple(seq.pending())
        if len(key) < 2:
            continue
        if key in first:
            rep_of[i] = first[key]
        else:
            first[key] = i
    return rep_of
