"""In-tail log-probs: the old (and reference) log-probs of GRPO groups computed as each group
finishes, while the rollout's tail still runs (issue 11 item 4; the simulator's counterpart is
``sim/stream.py``'s tail mode).

Why this is exact: during a step's rollout no weight changes — the actor is updated only after
every group finished, the reference never — so a group's log-probs computed early are the ones
the post-rollout pass would compute. :class:`TailLogprobs` keeps each finished group's rows
(computed on a batch of that group alone, right-padded to its own longest row) and
:meth:`TailLogprobs.fill` writes them into the whole batch's ``[N, T-1]`` tensors, where the
rows left are computed by the ordinary pass; on every target a loss reads (the response tokens)
the result equals the pass over the whole batch up to float summation order (padding changes
the shapes of the matrix products; tested to 1e-5). Positions past a row's end differ (the
whole batch's pass fills them from pad tokens without ``share_prompt``) and are read by none.

Not wired into the Ray executor yet (issue 14 item 2): it runs a rollout plain and computes the
log-probs after it, as before.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from jigsawrl.engine.trainer import TrainBatch, build_batch, compute_logprobs

Sequence = tuple[list[int], list[int], list[int]]  # (prompt ids, response ids, response mask)


class TailLogprobs:
    """Log-probs of finished groups, kept until the whole batch is built.

    Args:
        actor: the policy whose weights the rollout ran with (not updated before :meth:`fill`).
        ref: the frozen reference model (None: no reference log-probs).
        pad_id: the tokenizer's pad id (as the whole batch is built with).
        micro_batch_size, share_prompt, autocast_mode: as the trainer's log-prob pass.
    """

    def __init__(self, actor: nn.Module, ref: nn.Module | None, pad_id: int, *,
                 micro_batch_size: int = 64, share_prompt: bool = True,
                 autocast_mode: str = "off") -> None:
        self.actor = actor
        self.ref = ref
        self.pad_id = pad_id
        self._opts = (micro_batch_size, share_prompt, autocast_mode)
        self.rows: dict[int, tuple[Tensor, Tensor | None]] = {}  # batch row -> (old, ref)

    def add_group(self, first_row: int, sequences: list[Sequence]) -> None:
        """Compute the log-probs of one finished group, whose rows in the whole batch are
        ``first_row`` onwards, in order.

        Raises:
            ValueError: a row already computed.
        """
        rows = range(first_row, first_row + len(sequences))
        if any(r in self.rows for r in rows):
            raise ValueError(f"rows {first_row}..{rows[-1]}: a group's log-probs were added twice")
        batch = build_batch(sequences, torch.zeros(len(sequences)), self.pad_id)
        old = compute_logprobs(self.actor, batch, *self._opts)
        ref = compute_logprobs(self.ref, batch, *self._opts) if self.ref is not None else None
        for i, r in enumerate(rows):
            self.rows[r] = (old[i], None if ref is None else ref[i])

    def fill(self, batch: TrainBatch) -> list[int]:
        """Write the kept rows into ``batch.old_logprobs`` (and ``ref_logprobs``), computing the
        rows not kept with the ordinary pass on their own; returns those rows."""
        n, width = batch.num_seqs, batch.input_ids.shape[1] - 1
        left = [r for r in range(n) if r not in self.rows]
        old = torch.zeros((n, width), dtype=torch.float32, device=batch.input_ids.device)
        ref = old.clone() if self.ref is not None else None
        for r, (o, f) in self.rows.items():
            old[r, : o.shape[0]] = o[:width]
            if ref is not None and f is not None:
                ref[r, : f.shape[0]] = f[:width]
        if left:
            idx = torch.tensor(left, dtype=torch.long)
            sub = TrainBatch(batch.input_ids[idx], batch.attention_mask[idx],
                             batch.loss_mask[idx], batch.advantages[idx],
                             prompt_lens=None if batch.prompt_lens is None
                             else batch.prompt_lens[idx])
            old[idx] = compute_logprobs(self.actor, sub, *self._opts)
            if ref is not None:
                ref[idx] = compute_logprobs(self.ref, sub, *self._opts)
        batch.old_logprobs = old
        if ref is not None:
            batch.ref_logprobs = ref
        return left
