"""Affine lower bounds ("planes") on what one decode iteration costs, read off a cost model.

The realistic makespan bound (:mod:`jigsawrl.graph.makespan_bound`) needs the cost of a decode
iteration to split into a part paid once per iteration and parts paid per sequence and per KV
token, so that a rank's decode time adds up over its requests. A *plane*
``alpha + beta * batch + gamma * ctx_tokens`` that lies below the cost at every batch and
context does that: summing it over iterations gives ``alpha × iterations + Σ_requests
(beta × tokens + gamma × Σ token contexts)``, a lower bound on the true sum whatever the
batching. Three costs get a plane:

``time``
    the iteration's duration at full share (:meth:`decode_iter_time_s` at share 1).
``compute``
    the compute share-seconds it holds at best: ``inf_s s × T(s)``. In the roofline
    ``T(s) = k + max(c, s_sat m) / s`` below ``s_sat``, so ``s T(s)`` falls to
    ``max(c, s_sat m)`` as ``s → 0``: the limit is read by extrapolating two tiny shares.
``bandwidth``
    the HBM bandwidth-seconds it holds at best, with the simulator's contention model
    (:mod:`jigsawrl.sim.contention`: a decode at share ``s`` holds ``min(1, s / s_sat)`` of the
    bandwidth): ``min(compute / s_sat, T(1))`` — the memory line ``m`` for a memory-bound
    iteration.

Each plane is taken at the corner (batch 1, no context) by finite differences — for the roofline,
a maximum of affine lines, that is exactly the line active there (the memory line), a global
minorant — and then checked on a grid of batches and contexts; if the cost model dips below it
anywhere on the grid (a cost that is not convex, e.g. a profiled table), the plane is scaled down
until it does not. Simplification: between grid points the check is not exhaustive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.workload.models import ModelSpec

# Two tiny shares whose s·T(s) extrapolate to the share → 0 limit (exact for k + X / s).
TINY_SHARE = 1e-9
PROBE_CTX = 1024
GRID_BATCH = (1, 2, 4, 16, 64, 256, 1024)
GRID_CTX = (0, 1_000, 10_000, 100_000, 1_000_000, 4_000_000)


@dataclass(frozen=True, slots=True)
class Plane:
    """``alpha + beta * batch + gamma * ctx_tokens`` (seconds), all coefficients >= 0."""

    alpha: float
    beta: float
    gamma: float

    def at(self, batch: float, ctx_tokens: float) -> float:
        return self.alpha + self.beta * batch + self.gamma * ctx_tokens

    def scaled(self, factor: float) -> Plane:
        return Plane(self.alpha * factor, self.beta * factor, self.gamma * factor)


@dataclass(frozen=True, slots=True)
class DecodePlanes:
    """The three planes of one (model, TP) pair; see the module docstring."""

    time: Plane
    compute: Plane
    bandwidth: Plane


def corner_plane(f: Callable[[int, int], float]) -> Plane:
    """The plane through ``f`` at (1, 0) with its forward slopes, scaled to stay below ``f`` on
    the check grid."""
    f10 = f(1, 0)
    beta = max(0.0, f(2, 0) - f10)
    gamma = max(0.0, (f(1, PROBE_CTX) - f10) / PROBE_CTX)
    plane = Plane(max(0.0, f10 - beta), beta, gamma)
    ratio = 1.0
    for b in GRID_BATCH:
        for c in GRID_CTX:
            lo = plane.at(b, c)
            if lo > 0.0:
                ratio = min(ratio, f(b, c) / lo)
    return plane if ratio >= 1.0 else plane.scaled(max(0.0, ratio) * (1.0 - 1e-9))


def decode_planes(cost: CostModelProtocol, model: ModelSpec, tp: int) -> DecodePlanes:
    """The ``time``, ``compute`` and ``bandwidth`` planes of a decode iteration of ``model`` at
    tensor parallelism ``tp`` (module docstring)."""
    s_sat = cost.params.s_sat

    def time(b: int, c: int) -> float:
        return cost.decode_iter_time_s(model, tp, b, c, 1.0)

    def compute(b: int, c: int) -> float:
        s1, s2 = TINY_SHARE, 2 * TINY_SHARE
        x1 = s1 * cost.decode_iter_time_s(model, tp, b, c, s1)
        x2 = s2 * cost.decode_iter_time_s(model, tp, b, c, s2)
        return max(0.0, 2 * x1 - x2)

    def bandwidth(b: int, c: int) -> float:
        return min(compute(b, c) / s_sat, time(b, c))

    return DecodePlanes(corner_plane(time), corner_plane(compute), corner_plane(bandwidth))
