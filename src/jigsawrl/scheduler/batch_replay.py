"""A rollout's generation time on ``R`` ranks, predicted as the executor runs it: the step's batch
split into ``R`` contiguous chunks (verl's dispatch, which ``jigsaw``'s rollouts use too), every
rank replayed, the rollout ending with its slowest rank.

Why not one representative rank (the rank holding the longest request and a fair mix of the
rest, as the width planner and the verl job timer predicted before): contiguous chunks of a
batch in sample order are a random partition, and a GRPO group's samples share a prompt and so
a difficulty, so one rank's chunk is heavier and longer-tailed than a fair mix. Replaying the
true requests of ``configs/two-gsm8k.yaml``'s MATH pipeline (seed 0, 8 steps), the fair mix ran
7% short of the slowest rank on 2 ranks, 11% on 4 and 13% on 8 (0% on one rank) — a bias that
grew with the rank count, so the planner favoured plans of many narrow engines (the TP search
picked TP 2 on the GSM8K + MATH pairs, forecast 5-7% short of its measured makespan, where TP 4
forecast within 2% ran 4-6% faster). Averaging the slowest rank over ``DRAWS`` predicted batches
removes most of it (docs/BENCHMARKS.md).

What it reads (DESIGN.md §6): predicted batches only, never a sampled length of a step to come.
Before a pipeline's first step, batches drawn from its task preset's generative model under
seeds of this module's own (:func:`prior_batches`); after it, groups resampled from the
observed steps, without replacement (:func:`history_batches`: a block bootstrap — a group's
samples stay together, as they are dispatched).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from jigsawrl.graph.build import rank_segments
from jigsawrl.graph.predict import StepObservation
from jigsawrl.scheduler.base import PipelineView
from jigsawrl.sim.dispatch import dispatch_requests
from jigsawrl.sim.rollout import RolloutInstance
from jigsawrl.workload.requests import RequestTruth, TurnTruth
from jigsawrl.workload.task_presets import TASKS, RequestSampler

# Batches drawn from a task preset's prior, averaged: the slowest of R ranks is a noisy
# statistic of one batch (two-gsm8k's GSM8K and MATH priors, TP 1-4 on 2-8 ranks: one draw's
# standard deviation about a 64-draw mean 6-14%, four draws' 2.5-8%).
DRAWS = 4
# Seeds of the prior's draws: a stream of their own (the simulator's truth is seeded by
# ``[seed, pipeline index, step]``), the same in every run.
PRIOR_SEED = 0x5EEDBA7C

# A fresh rollout instance of one rank (its name), empty.
NewInstance = Callable[[str], RolloutInstance]
# (pipeline, each rank's requests, a fresh instance per rank, KV bytes per device) -> seconds
# the rollout's generation takes
RanksReplay = Callable[[PipelineView, list[list[RequestTruth]], NewInstance, float], float]


def prior_batches(pv: PipelineView, fallback: list[RequestTruth],
                  draws: int = DRAWS) -> list[list[RequestTruth]]:
    """``draws`` batches of one step from the task preset's generative model (per-prompt
    difficulty, per-sample spread, turns and tool calls; no drift: a policy does not know it),
    each in sample order. A task without a preset gets ``fallback`` (its prior), once."""
    spec = pv.spec
    task = TASKS.get(spec.task)
    if task is None:
        return [fallback]
    sampler = RequestSampler(task, group_size=spec.group_size,
                             max_response_tokens=spec.max_response_tokens)
    return [sampler.sample_step(np.random.default_rng([PRIOR_SEED, d]), f"{pv.name}/prior/{d}",
                                0, spec.batch_size) for d in range(draws)]


def history_batches(pv: PipelineView, recent: Sequence[StepObservation],
                    turns: Callable[[int], tuple[TurnTruth, ...]],
                    source: int) -> list[list[RequestTruth]]:
    """Batches of ``batch_size`` groups resampled from the groups of the ``recent`` observed
    steps (each group ``group_size`` consecutive samples, as the executor reports them): the
    pooled groups in one shuffled order, cut into as many whole batches as they make (at least
    one, topped up by drawing with replacement) — a balanced bootstrap: every group seen,
    the longest included, counts once. ``turns`` splits an observed total into turns; the
    shuffle is seeded by ``source`` (the newest step seen), so a prediction is the same however
    often it is asked."""
    spec = pv.spec
    size = max(1, spec.group_size)
    groups: list[list[tuple[int, int]]] = []
    for obs in recent:
        pairs = list(zip(obs.prompt_tokens, obs.response_tokens, strict=False))
        groups += [pairs[i:i + size] for i in range(0, len(pairs), size)]
    if not groups:
        return []
    rng = np.random.default_rng([PRIOR_SEED, source])
    order = [int(i) for i in rng.permutation(len(groups))]
    per = max(1, spec.batch_size)
    if len(order) < per:
        order += [int(i) for i in rng.choice(len(groups), size=per - len(order))]
    out: list[list[RequestTruth]] = []
    for d in range(len(order) // per):
        picks = order[d * per:(d + 1) * per]
        out.append([RequestTruth(f"{pv.name}/{source}/pred/{d}/{k}/{j}", max(1, p), turns(r))
                    for k, g in enumerate(picks) for j, (p, r) in enumerate(groups[g])])
    return out


def plain_s(chunks: list[list[RequestTruth]], instance: NewInstance) -> float:
    """When the slowest rank of a rollout ends, each rank replayed alone to completion."""
    end = 0.0
    for r, chunk in enumerate(chunks):
        inst = instance(str(r))
        inst.add(chunk)
        segs = rank_segments(inst)
        if segs:
            end = max(end, segs[-1][2])
    return end


def rollout_s(pv: PipelineView, batches: Sequence[list[RequestTruth]], ranks: int,
              instance: NewInstance, kv_mem: float, replay: RanksReplay | None = None) -> float:
    """The mean over ``batches`` of the rollout's generation seconds on ``ranks`` ranks: each
    batch split contiguously, each rank on a fresh ``instance``, the ranks replayed by
    ``replay`` (default: :func:`plain_s`)."""
    if not batches:
        return 0.0
    total = 0.0
    for b, batch in enumerate(batches):
        chunks = dispatch_requests(batch, ranks, "contiguous")

        def fresh(name: str, b: int = b) -> RolloutInstance:
            return instance(f"{b}/{name}")
        total += replay(pv, chunks, fresh, kv_mem) if replay is not None else plain_s(
            chunks, fresh)
    return total / len(batches)
