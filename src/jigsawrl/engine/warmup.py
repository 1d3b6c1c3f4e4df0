"""A train pass at a pipeline's largest batch, run once before the run clock starts.

Why: a pass that needs more memory than the process has touched so far pays a page fault per
new page (:mod:`jigsawrl.engine.allocator`: ~15-20 µs each in a Ray worker). Without this, the
bench's first steps took their updates 1.5-2.2× as long as later steps, an effect no profile
taken at a repeated shape sees. One scratch pass at the largest batch a step can build grows the
heap to that peak; with the allocator keeping freed memory, later passes reuse it.

What "largest" means here (an approximation, said so): every row of the step
(``batch_size × group_size``), the pool's longest prompt (by characters, then tokenized) and
``max_new_tokens`` response tokens. A multi-turn response also carries tool results, so a step
can still outgrow it by those tokens; the few faults that leaves are not worth a second guess.
The pass runs on a throw-away copy of the rollout model with a learning rate of 0: the
pipeline's own weights and optimizer are untouched.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from typing import Any

import torch

from jigsawrl.engine.device import to_device
from jigsawrl.engine.pipeline import grpo_config
from jigsawrl.engine.trainer import GRPOTrainer, TrainBatch, build_batch
from jigsawrl.engine.trajectory import encode_prompt

log = logging.getLogger(__name__)


def peak_shape(pipe: Any) -> tuple[int, int, int]:
    """``(rows, prompt_tokens, response_tokens)`` of the largest batch a step of the started
    pipeline ``pipe`` (a :class:`~jigsawrl.engine.pipeline.RealPipeline`) builds."""
    spec = pipe.spec
    longest = max(pipe.pool, key=lambda ex: len(ex.prompt)) if pipe.pool else None
    prompt = len(encode_prompt(pipe.tokenizer, longest.prompt)) if longest is not None else 1
    return spec.batch_size * spec.group_size, max(1, prompt), max(1, int(pipe.max_new_tokens))


def peak_batch(rows: int, group_size: int, prompt_tokens: int, response_tokens: int,
               tokens: tuple[int, int], pad_id: int) -> TrainBatch:
    """A batch of ``rows`` sequences at that shape, in groups of ``group_size`` rows sharing
    their prompt as a step's do (neighbouring groups' prompts differ: ``tokens`` alternate), every
    response token trained on."""
    seqs = []
    for row in range(rows):
        prompt = [tokens[(row // group_size) % 2]] * prompt_tokens
        seqs.append((prompt, [tokens[0]] * response_tokens, [1] * response_tokens))
    return build_batch(seqs, torch.ones(rows), pad_id)


def warm_train_peak(pipe: Any) -> float:
    """Run an old-log-prob pass and one update at ``pipe``'s peak shape on a scratch copy of its
    rollout model; returns the seconds it took."""
    t0 = time.perf_counter()
    rows, prompt, response = peak_shape(pipe)
    model = copy.deepcopy(pipe.engine.model)
    device = next(model.parameters()).device
    # no KL term: the scratch trainer has no reference (a pipeline with kl_coef > 0 failed
    # every Ray worker's start-up here until 2026-12-07); the peak is the update's either way
    config = dataclasses.replace(grpo_config(pipe.spec.train), lr=0.0, ppo_epochs=1,
                                 kl_coef=0.0)
    trainer = GRPOTrainer(model, config)
    pad = pipe.tokenizer.pad_token_id
    a, b = [t for t in range(3) if t != pad][:2]  # any two ids but the pad
    batch = to_device(peak_batch(rows, pipe.spec.group_size, prompt, response, (a, b), pad),
                      device)
    batch.old_logprobs = trainer.old_logprobs(batch)
    trainer.update(batch)
    seconds = time.perf_counter() - t0
    log.debug("%s: warm-up pass at %d rows x (%d + %d) tokens in %.2f s",
              pipe.spec.name, rows, prompt, response, seconds)
    return seconds
