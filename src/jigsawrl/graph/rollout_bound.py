"""A lower bound on one step's rollout time on ``r`` ranks, with batching and KV growth.

The floor (:mod:`jigsawrl.graph.bound`) decodes the longest request alone at batch 1. Real ranks
decode it in a batch: every iteration reads the weights once (``alpha`` of the time plane,
:mod:`jigsawrl.graph.decode_planes`) and every running request adds its own cost
(``beta`` per sequence, ``gamma`` per KV token of its context). Summed over a rank's iterations,
the plane gives

    busy(rank) >= alpha × iterations(rank) + Σ_{requests on it} mass(q),
    mass(q) = beta × tokens(q) + gamma × Σ_{its tokens} context at that token,

whatever the admission order, KV budget or preemptions (a preempted request is re-prefilled,
never re-decoded), and ``iterations(rank) >= `` the longest request on it. A request's mass and
length do not depend on the schedule: they come from the true requests.

The bound is then a *fractional bin packing*: ``r`` bins of capacity ``τ``; a bin whose longest
request ("head") has ``L`` tokens spends ``alpha × L`` of it, and the requests' masses fill the
rest, split between bins at will; a request may only go in a bin whose head is at least as long.
The smallest feasible ``τ`` is found by bisection; for each ``τ`` the greedy that opens bins in
order of decreasing length and fills each to the brim uses the fewest bins of any fractional
packing (its heads are, bin by bin, no longer than any other packing's), so ``τ`` infeasible
for the greedy is infeasible for every dispatch of the requests to ``r`` ranks. The result is
never below the rollout floor given by the caller.

What it relaxes: KV budget and ``max_num_seqs`` (ignored), prefill time on the rank (counted only
in the floor), ranks being whole requests apart (masses split). What it assumes: each request is
decoded on one rank. A migration (jigsaw's tail moves) splits a request over ranks; it trades
device time for nothing faster (the moved request re-prefills and continues in sequence), and the
invariant tests run jigsaw's migrations against the bound, but the packing argument above does
not cover it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from jigsawrl.workload.requests import RequestTruth

# Bisection stops when the bracket is this tight (relative); the lower end is returned.
REL_TOL = 1e-4


def request_arrays(reqs: Sequence[RequestTruth]) -> tuple[np.ndarray, np.ndarray]:
    """Per request: decoded tokens, and the sum over them of the context each is decoded at
    (prompt + tokens before it + earlier tool results)."""
    gen = np.empty(len(reqs))
    ctx = np.empty(len(reqs))
    for i, r in enumerate(reqs):
        c = r.prompt_tokens
        n_all = 0
        s = 0.0
        for t in r.turns:
            n = t.response_tokens
            s += n * c + 0.5 * n * (n - 1)
            n_all += n
            c += n + t.tool_result_tokens
        gen[i] = n_all
        ctx[i] = s
    return gen, ctx


def bins_needed(tau: float, lengths: list[float], prefix: list[float], alpha: float,
                limit: int) -> int:
    """Bins of capacity ``tau`` the greedy fractional packing opens (``limit + 1`` once over).

    ``lengths`` sorted longest first; ``prefix[i]`` the mass of the ``i`` longest requests.
    """
    total = prefix[-1]
    pos = 0.0
    head = 0
    count = 0
    while True:
        cap = tau - alpha * lengths[head]
        if cap <= 0.0:
            return limit + 1
        count += 1
        pos += cap
        if pos >= total * (1.0 - 1e-12):
            return count
        if count >= limit:
            return limit + 1
        head = bisect_right(prefix, pos) - 1  # the request whose mass straddles ``pos``


def rollout_time_lb(gen: np.ndarray, mass: np.ndarray, alpha: float, ranks: int,
                    floor_s: float = 0.0) -> float:
    """The packing bound of the module docstring, at least ``floor_s``.

    Args:
        gen: decoded tokens per request.
        mass: each request's mass (``beta × tokens + gamma × context sum``), seconds.
        alpha: seconds every iteration of a rank costs.
        ranks: data-parallel ranks of the rollout (>= 1).
        floor_s: a lower bound already known (the rollout floor).
    """
    if len(gen) == 0:
        return floor_s
    order = np.argsort(-gen, kind="stable")
    lengths = gen[order].tolist()
    masses = mass[order].tolist()
    prefix = [0.0, *accumulate(masses)]
    total = prefix[-1]
    one_bin = alpha * lengths[0] + total
    lo = max(floor_s, alpha * lengths[0] + masses[0], one_bin / ranks)
    if lo >= one_bin or bins_needed(lo, lengths, prefix, alpha, ranks) <= ranks:
        return lo
    hi = one_bin  # one bin holds everything
    while hi - lo > REL_TOL * hi:
        mid = 0.5 * (lo + hi)
        if bins_needed(mid, lengths, prefix, alpha, ranks) <= ranks:
            hi = mid
        else:
            lo = mid
    return lo
