"""The realistic makespan bound of an experiment (``bound_s``; ``efficiency = bound_s /
makespan_s``).

``bound_s`` is the largest of these lower bounds, each a relaxation of what every schedule must
do (all from the noise-free cost model and the run's *true* requests, as the floor). A schedule
may run a pipeline's rollout at another TP than the config's (jigsaw's TP search, the
baselines' TP variants: half the config's TP to a whole node, :func:`~.bound.rollout_tps`), so
each pipeline's share of each term is taken at its fastest of those TPs — separately per term,
so the bound holds however a schedule mixes them. (Until 2026-12-07 the terms were taken at the
config's TP only, which runs at a searched TP beat by up to 1.6×: docs/BENCHMARKS.md.) An
executor that runs the config's TPs only passes those (``tps_of``; the Ray replay does):

``floor``
    the floor of :mod:`jigsawrl.graph.bound` (so ``floor_s <= bound_s`` by construction).
``dependency/<pipeline>``
    the pipeline's critical path over its steps: each rollout lasts at least the packing bound of
    :mod:`jigsawrl.graph.rollout_bound` on *all* the pool's ranks (``num_devices // rollout_tp``:
    the fewer ranks, the longer it takes, so the widest rollout bounds every width) and at least
    its longest request alone; each step's post-rollout chain (reward, old / ref log-prob,
    update, weight sync) runs at full share on its fastest device count of the whole pool. Sync:
    the steps in sequence. Async with staleness η: rollout ``k`` after the weight sync of
    ``k - 1 - η``, training in sequence (the longest path of that graph).
``pool/bandwidth``
    HBM bandwidth-seconds of all decodes over ``num_devices``: a device's decodes together hold
    at most its whole bandwidth (the simulator's contention model, :mod:`jigsawrl.sim.contention`)
    and each decode iteration holds at least the ``bandwidth`` plane of
    :mod:`jigsawrl.graph.decode_planes` on each of its ``tp`` devices. Iterations: a step's
    requests all decoded in one batch on one rank (its longest request's tokens), the fewest any
    schedule can have — migration can consolidate a tail onto one rank, so no larger count holds
    for every schedule.
``pool/compute``
    compute share-seconds over ``num_devices``: decodes at their ``compute`` plane (the least
    share-seconds an iteration can hold, at a vanishing share), plus every log-prob and update
    pass's FLOPs at the training efficiency (as the floor).
``pool/serial``
    only when no pipeline's rollout can share a device with another pipeline's model pass
    (rollout weights + one token of KV + the pass's weights sharded over the whole pool exceed a
    device's memory): then a device runs decodes or passes, never both, and their bandwidth- and
    share-seconds add.

*Widths.* The issue asked for the bound minimised over each pipeline's rollout width. Under
relaxations that hold for every schedule that minimum is attained at the widest rollout: a
narrower rollout is never faster (``dependency``), and a wider one costs no more device time in
any term that holds under migration and co-location (ranks that drain give their devices back;
jigsaw consolidates tails; a decode co-located with a pass keeps most of its speed). So there is
no trade-off left to search, and the bound records the width it assumed (``ranks``).

What it does not cover: a policy that changes a pipeline's TP mid-rollout (jigsaw's tail
regroup, ``Regroup`` in :mod:`jigsawrl.scheduler.base`: a tail re-prefilled on a wider TP group)
decodes its body and its tail at two TPs' speeds and may beat the bound — the summary then says
so (the floor allows for it: its longest request may decode at any TP a regroup reaches);
so may one that streams finished groups through the trainer during the rollout (StreamRL,
``sim/stream.py``), since ``dependency`` puts the whole post-rollout chain after the rollout
(the floor does not: it keeps only what must follow, so no schedule beats the floor); so may
an async pipeline whose batches are the first ``batch_size`` groups to finish from any running
rollout (AReaL's first-B, ``sim/batching.py``): its step ``k`` is not trained on step ``k``'s
rollout, which ``dependency`` assumes (the floor allows for it);
truth noise (σ = 0.05) can land a run a few percent under it by luck. The bound measures from
time 0 of the executor's clock, as the floor: a run where every pipeline arrives late should be
read against ``bound_s - min(start_s)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.graph.bound import (
    StepFacts,
    floor_from_facts,
    pipeline_facts,
    rollout_tps,
    staleness,
)
from jigsawrl.graph.decode_planes import DecodePlanes, decode_planes
from jigsawrl.graph.rollout_bound import request_arrays, rollout_time_lb

# A pipeline -> the rollout TPs it may run at.
TPsOf = Callable[[object], Sequence[int]]


@dataclass(frozen=True, slots=True)
class BoundReport:
    """``bound_s`` and what it is made of (module docstring).

    Attributes:
        bound_s: the bound (the largest term).
        floor_s: the floor.
        terms: each term's value, keyed ``floor``, ``dependency/<pipeline>``, ``pool/bandwidth``,
            ``pool/compute`` and, where it applies, ``pool/serial``.
        binding: the key of the largest term.
        ranks: the rollout ranks each pipeline's dependency term assumed.
        rollout_s: the rollout lower bound used for each step of each pipeline.
    """

    bound_s: float
    floor_s: float
    terms: dict[str, float]
    binding: str
    ranks: dict[str, int] = field(default_factory=dict)
    rollout_s: dict[str, list[float]] = field(default_factory=dict)


def critical_path_s(rollouts: Sequence[float], posts: Sequence[float], eta: int,
                    start_s: float = 0.0) -> float:
    """Longest path of a pipeline's steps: rollout ``k`` after the weight sync of
    ``k - 1 - eta`` (``start_s`` for the first ``eta + 1``), post-rollout chain ``k`` after
    rollout ``k`` and after chain ``k - 1``."""
    end_post: list[float] = []
    for k, (roll, post) in enumerate(zip(rollouts, posts, strict=True)):
        dep = k - 1 - eta
        roll_end = (end_post[dep] if dep >= 0 else start_s) + roll
        prev = end_post[k - 1] if k else start_s
        end_post.append(max(roll_end, prev) + post)
    return end_post[-1] if end_post else start_s


@dataclass(slots=True)
class _PoolWork:
    bandwidth_s: float = 0.0
    decode_compute_s: float = 0.0


def _step_rollout(planes: DecodePlanes, facts: StepFacts, ranks: int, tp: int,
                  work: _PoolWork) -> float:
    """The step's rollout lower bound; adds its decode work (one-batch iterations) to ``work``."""
    gen, ctx = request_arrays(facts.requests)
    if len(gen) == 0:
        return facts.rollout_floor_s
    tokens, ctx_sum, longest = float(gen.sum()), float(ctx.sum()), float(gen.max())
    for plane, attr in ((planes.bandwidth, "bandwidth_s"), (planes.compute, "decode_compute_s")):
        add = tp * (plane.alpha * longest + plane.beta * tokens + plane.gamma * ctx_sum)
        setattr(work, attr, getattr(work, attr) + add)
    t = planes.time
    mass = t.beta * gen + t.gamma * ctx
    return rollout_time_lb(gen, mass, t.alpha, ranks, facts.rollout_floor_s)


def _tps(pipe, num_devices: int, tps_of: TPsOf | None) -> Sequence[int]:  # noqa: ANN001
    """The rollout TPs ``pipe`` may run at: ``tps_of``'s, else :func:`~.bound.rollout_tps`."""
    if tps_of is not None:
        return tps_of(pipe)
    return rollout_tps(pipe.spec.rollout_tp, pipe.model.num_heads, num_devices)


def never_co_resident(cost: CostModelProtocol, pipes: Sequence,  # noqa: ANN001
                      num_devices: int, tps_of: TPsOf | None = None) -> bool:
    """True when no rollout can share a device with a model pass it could overlap in time
    (another pipeline's, or its own for an async pipeline): rollout weights + one KV token +
    the pass's weights sharded over the whole pool exceed a device's memory at every rollout
    TP the pipeline may run at (``tps_of``; :func:`~.bound.rollout_tps` by default)."""
    hbm = cost.accel.hbm_bytes
    for a in pipes:
        roll = min(cost.rollout_weight_bytes(a.model, tp) + cost.kv_bytes(a.model, 1, tp)
                   for tp in _tps(a, num_devices, tps_of))
        for b in pipes:
            if b is a and not staleness(a.spec):
                continue  # a sync pipeline's own rollout and passes never overlap
            if roll + cost.rollout_weight_bytes(b.model, num_devices) <= hbm:
                return False
    return True


def makespan_bound(pipes: Sequence, steps_requests: Callable[[object, int], list],  # noqa: ANN001
                   cost: CostModelProtocol, num_devices: int, *,
                   facts: dict[str, list[StepFacts]] | None = None,
                   tps_of: TPsOf | None = None) -> BoundReport:
    """``bound_s`` of an experiment and its terms (module docstring).

    Args:
        pipes: resolved pipelines (``.spec``, ``.model``).
        steps_requests: ``(pipe, step) -> list[RequestTruth]`` — the true requests.
        cost: a noise-free cost model.
        num_devices: devices in the pool.
        facts: the per-step facts when already computed (:func:`~.bound.pipeline_facts`).
        tps_of: the rollout TPs a pipeline may run at (None: :func:`~.bound.rollout_tps`, what
            the simulator's policies may choose; an executor that runs the config's TPs only
            passes those).
    """
    if facts is None:
        facts = pipeline_facts(pipes, steps_requests, cost, num_devices)
    floor = floor_from_facts(pipes, facts, cost, num_devices)
    terms: dict[str, float] = {"floor": floor}
    work = _PoolWork()
    planes: dict[tuple[str, int], DecodePlanes] = {}
    ranks_of: dict[str, int] = {}
    rollout_s: dict[str, list[float]] = {}
    for p in pipes:
        spec = p.spec
        steps = facts[spec.name]
        posts = [s.post_s for s in steps]
        dep, least = math.inf, _PoolWork(math.inf, math.inf)
        for tp in _tps(p, num_devices, tps_of):
            key = (p.model.name, tp)
            if key not in planes:
                planes[key] = decode_planes(cost, p.model, tp)
            ranks = max(1, num_devices // tp)
            at = _PoolWork()
            rolls = [_step_rollout(planes[key], s, ranks, tp, at) for s in steps]
            path = critical_path_s(rolls, posts, staleness(spec), spec.start_s)
            if path < dep:
                dep, ranks_of[spec.name], rollout_s[spec.name] = path, ranks, rolls
            # each term at its own fastest TP: a bound on every choice, however they mix
            least = _PoolWork(min(least.bandwidth_s, at.bandwidth_s),
                              min(least.decode_compute_s, at.decode_compute_s))
        terms[f"dependency/{spec.name}"] = dep
        work.bandwidth_s += least.bandwidth_s
        work.decode_compute_s += least.decode_compute_s
    pass_s = sum(s.pass_flops for steps in facts.values() for s in steps) / (
        cost.accel.peak_flops * cost.params.train_eff)
    terms["pool/bandwidth"] = work.bandwidth_s / num_devices
    terms["pool/compute"] = (work.decode_compute_s + pass_s) / num_devices
    if never_co_resident(cost, pipes, num_devices, tps_of):
        terms["pool/serial"] = (work.bandwidth_s + pass_s) / num_devices
    binding = max(terms, key=lambda k: (terms[k], k == "floor"))
    return BoundReport(float(np.float64(terms[binding])), floor, terms, binding, ranks_of,
                       rollout_s)
