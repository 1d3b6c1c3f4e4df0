"""The makespan *floor* of an experiment (``floor_s``, ``efficiency_floor``), and the per-step
facts both bounds read.

The floor is the weakest, simplest lower bound on the makespan; the realistic bound
(``bound_s``, :mod:`jigsawrl.graph.makespan_bound`) is never below it. No policy can finish
sooner than the floor, because it relaxes everything a policy controls:

- *per pipeline* (dependency floor): every step's rollout lasts at least as long as its single
  longest request decoded alone (batch 1, whole device, no contention: the fastest an iteration
  can be in the cost model, at the rollout's TP or any wider degree a regroup of its ranks can
  reach on the pool) plus its prefills and tool waits; the post-rollout stages run at
  full share on their fastest device count of the pool. A schedule may stream finished groups'
  log-probs, rewards and a one-epoch update during the rollout (StreamRL), so only the weight
  sync and a several-epoch update must follow it: a step lasts at least the larger of rollout +
  that tail and the whole post-rollout chain. Steps are sequential for sync pipelines. For async
  pipelines only training is sequential: the floor is the larger of the sum of training stages
  and the first training batch plus every step's tail (the first batch: the first rollout, or
  the ``batch_size`` fastest groups of the rollouts before the first update, which is what a
  first-B batcher such as AReaL's trains on).
- *whole pool* (work floor): the compute-bound FLOPs of every log-prob and update pass, spread
  over all devices at the cost model's training efficiency.

``floor_s`` is the larger of the two (before schema 2 of the summary it was called
``lower_bound_s`` and its ratio ``efficiency``). It counts no decode work and no batching, which
is why a good schedule sits far above it; it stays as the invariant every run is tested against.
It uses the noise-free cost model, so a run with truth noise can land a few percent under it by
luck; tests check it with noise off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.workload.models import ModelSpec
from jigsawrl.workload.requests import RequestTruth


def regroup_tps(tp: int, num_heads: int, n_devices: int) -> tuple[int, ...]:
    """The TP degrees a rollout's ranks of ``tp`` devices can be regrouped into on a pool of
    ``n_devices`` (powers of two above ``tp`` dividing the heads; ``Regroup`` in
    :mod:`jigsawrl.scheduler.base`): what the floor must allow a tail to run at."""
    out, k = [], 2
    while k <= n_devices:
        if k > tp and num_heads % k == 0:
            out.append(k)
        k *= 2
    return tuple(out)


def rollout_tps(tp: int, num_heads: int, n_devices: int) -> tuple[int, ...]:
    """The rollout TPs a schedule may run a pipeline configured at ``tp`` at: ``tp`` itself, half
    of it (the baselines' TP variants go down to half, ``scheduler/rollout_tp.py``) and every
    wider degree a regroup or a TP search can reach (:func:`regroup_tps`). Both bounds take the
    fastest of them, so that they bound the runs at a searched TP too."""
    return (tp, *((tp // 2,) if tp > 1 else ()), *regroup_tps(tp, num_heads, n_devices))


def request_floor_s(cost: CostModelProtocol, model: ModelSpec, tp: int,
                    req: RequestTruth, wider: Sequence[int] = ()) -> float:
    """The fastest one request can complete: alone, whole devices, no contention; each prefill
    and decode at the fastest of ``tp`` and the ``wider`` degrees a regroup can reach."""
    tps = (tp, *wider)
    t = min(cost.prefill_time_s(model, k, req.prompt_tokens, 0, 1.0) for k in tps)
    ctx = req.prompt_tokens
    for turn in req.turns:
        t += min(cost.decode_span_time_s(model, k, 1, ctx, turn.response_tokens, 1.0)
                 for k in tps)
        ctx += turn.response_tokens
        if turn.tool_result_tokens:
            t += turn.tool_latency_s
            t += min(cost.prefill_time_s(model, k, turn.tool_result_tokens, ctx, 1.0)
                     for k in tps)
            ctx += turn.tool_result_tokens
    return t


def rollout_floor_s(cost: CostModelProtocol, model: ModelSpec, tp: int,
                    reqs: Sequence[RequestTruth], wider: Sequence[int] = ()) -> float:
    """``max`` of :func:`request_floor_s` over a step's requests (0 for none).

    A single-turn request's floor grows with its prompt and its response (prefill and decode
    times are monotone in both in every cost model here), so only the single-turn requests on
    the Pareto front of (prompt, response) are evaluated; multi-turn ones are all evaluated.
    """
    single = [r for r in reqs if len(r.turns) == 1]
    multi = [r for r in reqs if len(r.turns) != 1]
    cands = multi + pareto_front(single)
    return max((request_floor_s(cost, model, tp, r, wider) for r in cands), default=0.0)


def pareto_front(reqs: Sequence[RequestTruth]) -> list[RequestTruth]:
    """Single-turn requests not dominated in (prompt tokens, response tokens)."""
    if not reqs:
        return []
    p = np.fromiter((r.prompt_tokens for r in reqs), float, len(reqs))
    n = np.fromiter((r.turns[0].response_tokens for r in reqs), float, len(reqs))
    order = np.lexsort((-p, -n))  # longest response first, then longest prompt
    best = np.maximum.accumulate(p[order])
    keep = np.empty(len(order), dtype=bool)
    keep[0] = True
    keep[1:] = p[order][1:] > best[:-1]
    return [reqs[i] for i in order[keep]]


def post_chain_floor_s(cost: CostModelProtocol, model: ModelSpec, n: int, tokens: int,
                       samples: int, use_ref: bool, epochs: int, tp: int) -> float:
    """Post-rollout stages (reward, old / ref log-probs, update, weight sync) at full share,
    each on its fastest device count in 1..n (communication makes more devices not always
    faster, so the minimum over counts is what bounds every policy)."""
    best = _fastest(n)
    t = cost.reward_time_s(samples) + best(lambda k: cost.logprob_time_s(model, k, tokens))
    if use_ref:
        t += best(lambda k: cost.logprob_time_s(model, k, tokens))
    t += epochs * best(lambda k: cost.train_time_s(model, k, tokens))
    return t + best(lambda k: cost.weight_sync_time_s(model, k, tp))


def post_tail_floor_s(cost: CostModelProtocol, model: ModelSpec, n: int, tokens: int,
                      epochs: int, tp: int) -> float:
    """What of the post-rollout chain no schedule can start before its rollout ends, even one
    that streams finished groups through the trainer during the rollout (StreamRL,
    ``sim/stream.py``): the weight sync, and a several-epoch update (its later epochs need the
    whole batch). Log-probs, rewards and a one-epoch update may all overlap the rollout."""
    best = _fastest(n)
    t = best(lambda k: cost.weight_sync_time_s(model, k, tp))
    return t + (epochs * best(lambda k: cost.train_time_s(model, k, tokens)) if epochs > 1
                else 0.0)


def _fastest(n: int) -> Callable[[Callable[[int], float]], float]:
    """The minimum of a stage's time over device counts 1, 2, 4, ... and ``n``."""
    counts = sorted({n, *(2 ** i for i in range(n.bit_length()) if 2 ** i <= n)})
    return lambda fn: min(fn(k) for k in counts)


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What both bounds need to know about one step of one pipeline.

    ``rollout_floor_s``: :func:`rollout_floor_s`; ``post_s``: :func:`post_chain_floor_s` on the
    whole pool; ``pass_flops``: FLOPs of its log-prob and update passes; ``post_tail_s``:
    :func:`post_tail_floor_s` (the part of ``post_s`` that must follow the rollout);
    ``group_floors_s``: the floor of each of its GRPO groups (its slowest request), sorted —
    kept only for the steps an async pipeline's first training batch can draw from.
    """

    requests: tuple[RequestTruth, ...]
    rollout_floor_s: float
    post_s: float
    pass_flops: float
    post_tail_s: float = 0.0
    group_floors_s: tuple[float, ...] = ()


def step_facts(cost: CostModelProtocol, pipe, reqs: Sequence[RequestTruth],  # noqa: ANN001
               num_devices: int, groups: bool = False) -> StepFacts:
    """:class:`StepFacts` of one step of ``pipe`` (``.spec``, ``.model``) with requests ``reqs``
    (``groups``: with its group floors)."""
    spec, m = pipe.spec, pipe.model
    tokens = sum(r.total_tokens for r in reqs)
    # a policy may run the rollout at half the config's TP (scheduler/rollout_tp.py) or wider
    # (that, or a regroup of its tail): the floor takes the fastest of them
    tps = rollout_tps(spec.rollout_tp, m.num_heads, num_devices)
    wider = tps[1:]
    post = min(post_chain_floor_s(cost, m, num_devices, tokens, len(reqs), spec.use_ref,
                                  spec.train.ppo_epochs, tp) for tp in tps)
    passes = 2 if spec.use_ref else 1
    flops = passes * cost.logprob_flops(m, tokens) + \
        spec.train.ppo_epochs * cost.train_flops(m, tokens)
    tail = min(post_tail_floor_s(cost, m, num_devices, tokens, spec.train.ppo_epochs, tp)
               for tp in tps)
    floors: dict[str, float] = {}
    for r in reqs if groups else ():
        key = r.sample_id.rsplit("/", 1)[0]  # the prompt a sample answers (its group)
        floors[key] = max(floors.get(key, 0.0),
                          request_floor_s(cost, m, spec.rollout_tp, r, wider))
    return StepFacts(tuple(reqs), rollout_floor_s(cost, m, spec.rollout_tp, reqs, wider), post,
                     flops, tail, tuple(sorted(floors.values())))


def staleness(spec) -> int:  # noqa: ANN001
    """Steps a rollout may run ahead of training (0 = sync; AReaL's η for async)."""
    return spec.max_staleness if spec.mode == "async" and spec.max_staleness > 0 else 0


def pipeline_facts(pipes: Sequence, steps_requests: Callable[[object, int], list],  # noqa: ANN001
                   cost: CostModelProtocol, num_devices: int) -> dict[str, list[StepFacts]]:
    """:class:`StepFacts` of every step of every pipeline, keyed by pipeline name."""
    return {p.spec.name: [step_facts(cost, p, steps_requests(p, k), num_devices,
                                     groups=k <= staleness(p.spec) and staleness(p.spec) > 0)
                          for k in range(p.spec.steps)] for p in pipes}


def first_batch_floor_s(spec, steps: Sequence[StepFacts]) -> float:  # noqa: ANN001
    """The earliest an async pipeline's first training batch can be complete: its first
    rollout's floor, or — since a first-B batcher (AReaL, ``sim/batching.py``) takes the first
    ``batch_size`` groups to finish from any rollout running before the first update — the
    ``batch_size``-th fastest group floor of those rollouts, if lower."""
    first = steps[0].rollout_floor_s if steps else 0.0
    pooled = sorted(f for s in steps[:staleness(spec) + 1] for f in s.group_floors_s)
    if len(pooled) >= spec.batch_size > 0:
        first = min(first, pooled[spec.batch_size - 1])
    return first


def floor_from_facts(pipes: Sequence, facts: dict[str, list[StepFacts]],  # noqa: ANN001
                     cost: CostModelProtocol, num_devices: int) -> float:
    """The floor (module docstring) from precomputed :class:`StepFacts`."""
    dep = 0.0
    work_flops = 0.0
    for p in pipes:
        steps = facts[p.spec.name]
        rolls = [s.rollout_floor_s for s in steps]
        trains = [s.post_s for s in steps]
        tails = [s.post_tail_s for s in steps]
        work_flops += sum(s.pass_flops for s in steps)
        # a schedule may stream a step's passes during its rollout: only the tail must follow
        if staleness(p.spec):  # training in sequence; every update after the first batch
            chain = max(sum(trains), first_batch_floor_s(p.spec, steps) + sum(tails))
        else:
            chain = sum(max(r + t, post) for r, t, post in zip(rolls, tails, trains,
                                                                strict=True))
        dep = max(dep, p.spec.start_s + chain)
    rate = cost.accel.peak_flops * cost.params.train_eff * num_devices
    return max(dep, work_flops / rate)


def makespan_floor(pipes: Sequence, steps_requests: Callable[[object, int], list],  # noqa: ANN001
                   cost: CostModelProtocol, num_devices: int) -> float:
    """max(dependency floor over pipelines, work floor over the pool); see the module doc.

    Args:
        pipes: resolved pipelines (``.spec``, ``.model``).
        steps_requests: ``(pipe, step) -> list[RequestTruth]`` — the true requests.
        cost: a noise-free cost model.
        num_devices: devices in the pool.
    """
    return floor_from_facts(pipes, pipeline_facts(pipes, steps_requests, cost, num_devices),
                            cost, num_devices)


# The name before schema 2 (``lower_bound_s``); kept for callers that predate the split.
makespan_lower_bound = makespan_floor
