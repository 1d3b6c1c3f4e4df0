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

On Ray (issue 14 item 2) a drained rank's worker computes the finished groups' rows with
:func:`rows_logprobs` (``executors/raycluster/worker_tail.py``) and the train state's holder
writes them into the batch with :func:`fill_rows`, computing only the rows left.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from jigsawrl.engine.trainer import GRPOConfig, TrainBatch, build_batch, compute_logprobs

Sequence = tuple[list[int], list[int], list[int]]  # (prompt ids, response ids, response mask)
Options = tuple[int, bool, str]  # the log-prob pass's (micro_batch_size, share_prompt, autocast)


def pass_options(cfg: GRPOConfig) -> Options:
    """The log-prob pass's options of a trainer config (as ``GRPOTrainer.old_logprobs``)."""
    return cfg.micro_batch_size, cfg.share_prompt, cfg.autocast


def rows_logprobs(model: nn.Module, sequences: list[Sequence], pad_id: int,
                  opts: Options) -> list[Tensor]:
    """The log-probs of ``sequences`` computed on a batch of their own (right-padded to their
    own longest row): one ``[len - 1]`` tensor per sequence, cut at its own end."""
    from jigsawrl.engine.device import model_device, to_device

    batch = to_device(build_batch(sequences, torch.zeros(len(sequences)), pad_id),
                      model_device(model))
    out = compute_logprobs(model, batch, *opts)
    return [out[i, : max(0, len(p) + len(r) - 1)].clone() for i, (p, r, _) in enumerate(sequences)]


def fill_rows(model: nn.Module, batch: TrainBatch, kept: Mapping[int, Tensor],
              opts: Options) -> tuple[Tensor, list[int]]:
    """The whole batch's ``[N, T-1]`` log-probs: the ``kept`` rows (computed earlier, each cut
    at its own end) written in, the rows not kept computed now by the ordinary pass on a batch
    of their own. Returns the tensor and the rows computed now."""
    n, width = batch.num_seqs, batch.input_ids.shape[1] - 1
    left = [r for r in range(n) if r not in kept]
    out = torch.zeros((n, width), dtype=torch.float32, device=batch.input_ids.device)
    for r, lp in kept.items():
        lp = lp[:width].to(out.device)
        out[r, : lp.shape[0]] = lp
    if left:
        idx = torch.tensor(left, dtype=torch.long)
        sub = TrainBatch(batch.input_ids[idx], batch.attention_mask[idx], batch.loss_mask[idx],
                         batch.advantages[idx],
                         prompt_lens=None if batch.prompt_lens is None else batch.prompt_lens[idx])
        out[idx] = compute_logprobs(model, sub, *opts)
    return out, left


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
        old = rows_logprobs(self.actor, sequences, self.pad_id, self._opts)
        ref = rows_logprobs(self.ref, sequences, self.pad_id, self._opts) \
            if self.ref is not None else None
        for i, r in enumerate(rows):
            self.rows[r] = (old[i], None if ref is None else ref[i])

    def fill(self, batch: TrainBatch) -> list[int]:
        """Write the kept rows into ``batch.old_logprobs`` (and ``ref_logprobs``), computing the
        rows not kept with the ordinary pass on their own; returns those rows."""
        batch.old_logprobs, left = fill_rows(
            self.actor, batch, {r: o for r, (o, _) in self.rows.items()}, self._opts)
        if self.ref is not None:
            batch.ref_logprobs, _ = fill_rows(
                self.ref, batch, {r: f for r, (_, f) in self.rows.items() if f is not None},
                self._opts)
        return left
