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

What it reads (DESIGN.md §6): predicted batches only, never a sampled length of a step to come:
batches drawn from the task preset's generative model under seeds of this module's own
(:func:`prior_batches`). After a pipeline's first step the width timer carries the bias this
measures on the prior over to the history's cheaper one-rank replay (``jigsaw/widths.py``): the
history changes every step and a replan asks for many widths, so a resampling of the observed
groups replayed on every rank (tried) would multiply what each replan costs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.graph.build import rank_segments
from jigsawrl.scheduler.base import PipelineView
from jigsawrl.sim.dispatch import dispatch_requests
from jigsawrl.sim.rollout import RolloutInstance, engine_limits
from jigsawrl.workload.requests import RequestTruth
from jigsawrl.workload.task_presets import TASKS, RequestSampler

# Batches drawn from a task preset's prior, averaged: the slowest of R ranks is a noisy
# statistic of one batch (two-gsm8k's GSM8K and MATH priors, TP 1-4 on 2-8 ranks, about a
# 64-draw mean: one draw's standard deviation 6-14%, two draws' 4.5-11%, four 2.5-8%). Every
# plan and every verl placement of a run is timed on the same draws, so their comparisons share
# the noise; still, at two draws jigsaw's plan for scale-14b-32 was forecast 4.0% sooner than
# verl-sized (past the fallback's 3% margin) and measured 0.96x on seed 0 (at four: 2.8%, it
# runs verl-sized). At most this many, and fewer for larger batches (:func:`draws_for`).
DRAWS = 4
# Requests replayed per predicted rollout, a budget: DRAWS batches of 256 requests (64 prompts
# x 4, every example config but scale-512) or two of 512. A trade of precision for speed, not a
# free one: a larger batch is not less noisy (one draw's slowest rank, sd/mean over 12 draws at
# 2-8 ranks: MATH 7.3-7.8% at 256 requests, 8.5-9.0% at 512; GSM8K 7.1-11.2% and 6.9-7.9%), so
# scale-512's predictions average two draws' noise; they buy its 512-GPU simulation under 30 s
# (its plan choice unchanged; docs/BENCHMARKS.md).
DRAW_REQUESTS = 1024
# Ranks replayed per batch: a node's worth at TP 1 (wider rollouts sample this many,
# rollout_s).
MAX_RANKS = 8
# Seeds of the prior's draws: a stream of their own (the simulator's truth is seeded by
# ``[seed, pipeline index, step]``), the same in every run.
PRIOR_SEED = 0x5EEDBA7C

# A fresh rollout instance of one rank (its name), empty.
NewInstance = Callable[[str], RolloutInstance]
# (pipeline, each rank's requests, a fresh instance per rank, KV bytes per device) -> seconds
# the rollout's generation takes
RanksReplay = Callable[[PipelineView, list[list[RequestTruth]], NewInstance, float], float]


def prior_batches(pv: PipelineView, fallback: list[RequestTruth],
                  draws: int | None = None) -> list[list[RequestTruth]]:
    """``draws`` (default :func:`draws_for`) batches of one step from the task preset's
    generative model (per-prompt difficulty, per-sample spread, turns and tool calls; no drift:
    a policy does not know it), each in sample order. A task without a preset gets ``fallback``
    (its prior), once. The same objects for every pipeline of one task and shape
    (:func:`prior_key`), which lets their replays be shared (:func:`memo`)."""
    key = prior_key(pv)
    if key is None:
        return [fallback]
    if draws is None:
        draws = draws_for(pv.spec.batch_size * pv.spec.group_size)
    return list(_prior(key, draws))


def draws_for(requests: int) -> int:
    """Batches of ``requests`` requests drawn per prediction: enough for
    :data:`DRAW_REQUESTS` replayed requests, between 1 and :data:`DRAWS`."""
    return max(1, min(DRAWS, -(-DRAW_REQUESTS // max(1, requests))))


def prior_key(pv: PipelineView) -> tuple[str, int, int, int] | None:
    """What a pipeline's prior batches depend on: its task and step shape (None: a task
    without a preset, whose prior is its own)."""
    s = pv.spec
    if TASKS.get(s.task) is None:
        return None
    return (s.task, s.group_size, s.max_response_tokens, s.batch_size)


@functools.lru_cache(maxsize=256)
def _prior(key: tuple[str, int, int, int], draws: int) -> tuple[list[RequestTruth], ...]:
    task, group_size, max_response, batch_size = key
    sampler = RequestSampler(TASKS[task], group_size=group_size,
                             max_response_tokens=max_response)
    return tuple(sampler.sample_step(np.random.default_rng([PRIOR_SEED, d]), f"prior/{d}", 0,
                                     batch_size) for d in range(draws))


def memo(key: Hashable | None, cost: object, compute: Callable[[], float]) -> float:
    """``compute()``, remembered by ``key`` for the cost model ``cost`` (replays are pure
    functions of their requests, model, TP, KV budget and cost model: a TP candidate, a verl
    timer and a pipeline alike ask for the same ones); a key of None is not remembered.
    Bounded: cleared past 8,192 entries."""
    if key is None:
        return compute()
    got = _MEMO.get(key)
    if got is not None and got[0] is cost:
        return got[1]
    if len(_MEMO) >= 8192:
        _MEMO.clear()
    value = compute()
    _MEMO[key] = (cost, value)
    return value


_MEMO: dict[Hashable, tuple[object, float]] = {}


def instances(cost: CostModelProtocol, pv: PipelineView, kv_mem: float,
              prefix: str) -> tuple[NewInstance, int]:
    """A maker of ``pv``'s empty rollout instances at its rollout TP with the KV budget of
    ``kv_mem`` bytes per device (named ``prefix/name``), and that budget in tokens."""
    tp = pv.spec.rollout_tp
    limits = engine_limits(cost, pv.spec, cost.kv_budget_tokens(pv.model, tp, max(kv_mem, 1.0)))

    def instance(name: str) -> RolloutInstance:
        return RolloutInstance(f"{prefix}/{name}", pv.model, tp, cost, **limits)
    return instance, limits["kv_budget_tokens"]


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
    batch split contiguously, each rank on a fresh ``instance``, the ranks replayed together by
    ``replay`` (default: :func:`plain_s`).

    Beyond :data:`MAX_RANKS` ranks only that many chunks of each batch are replayed, each
    alone, and the slowest of ``ranks`` is the expected maximum of ``ranks`` draws from the
    rank times seen (:func:`expected_max`): the cost stays that of a node's ranks however wide
    the rollout. Simplification: a tail regroup is not credited there (it forms within one
    node; the prediction of a rollout wider than a node's ranks is the plain one)."""
    if not batches:
        return 0.0
    total = 0.0
    seen: list[float] = []
    for b, batch in enumerate(batches):
        chunks = dispatch_requests(batch, ranks, "contiguous")

        def fresh(name: str, b: int = b) -> RolloutInstance:
            return instance(f"{b}/{name}")
        if ranks > MAX_RANKS:
            step = ranks / MAX_RANKS
            seen += [plain_s([chunks[int(k * step)]], fresh) for k in range(MAX_RANKS)]
            continue
        total += replay(pv, chunks, fresh, kv_mem) if replay is not None else plain_s(
            chunks, fresh)
    return expected_max(seen, ranks) if seen else total / len(batches)


def expected_max(samples: Sequence[float], k: int) -> float:
    """The expected maximum of ``k`` draws (with replacement) from ``samples``."""
    xs = sorted(samples)
    m = len(xs)
    return sum(x * ((i / m) ** k - ((i - 1) / m) ** k) for i, x in enumerate(xs, start=1))
