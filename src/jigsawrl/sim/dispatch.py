"""The simulator's workload side: each step's true requests, and how a batch is dealt to ranks.

The simulator alone knows the truth it sampled (DESIGN.md §6): :class:`TruthSampler` draws a
step's requests once, from a seed derived from structure ``(seed, pipeline index, step)``, so a
run is reproducible and every policy sees the same workload. :func:`dispatch_requests` splits a
step's batch over the data-parallel ranks of its rollout as the peers do; its skew-aware order
comes from the policy's predictions, never from the sampled lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jigsawrl.workload.experiment import ResolvedPipeline
from jigsawrl.workload.requests import RequestTruth


class TruthSampler:
    """The true requests of every (pipeline, step), sampled once each and kept.

    Args:
        seed: the run's seed.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._samples: dict[tuple[str, int], list[RequestTruth]] = {}

    def step_requests(self, pipe: ResolvedPipeline, step: int) -> list[RequestTruth]:
        """The true requests of a step, sampled once from a seed derived from structure."""
        key = (pipe.spec.name, step)
        if key not in self._samples:
            rng = np.random.default_rng([self.seed, pipe.index, step])
            self._samples[key] = pipe.sampler.sample_step(
                rng, pipe.spec.name, step, pipe.spec.batch_size)
        return self._samples[key]


def dispatch_requests(reqs: list[RequestTruth], n: int, how: str, *,
                      predicted: Sequence[float] | None = None) -> list[list[RequestTruth]]:
    """Split a step's batch over ``n`` ranks.

    ``contiguous``: verl's equal contiguous chunks. ``skew_aware``: StreamRL's ranker — requests
    dealt longest-``predicted`` first (ties in request order) to the rank with the least
    predicted load. ``predicted`` (one per request) comes from the policy's ranker
    (:class:`~jigsawrl.scheduler.ranker.LengthRanker`, fed history and prompt lengths): this
    function never reads a sampled response length.

    Raises:
        ValueError: on another mode, or ``skew_aware`` without one prediction per request.
    """
    if how == "contiguous":
        return [reqs[len(reqs) * r // n: len(reqs) * (r + 1) // n] for r in range(n)]
    if how != "skew_aware":
        raise ValueError(f"unknown dispatch {how!r}")
    if predicted is None or len(predicted) != len(reqs):
        raise ValueError("skew_aware dispatch needs one predicted length per request")
    pred = [float(p) for p in predicted]
    out: list[list[RequestTruth]] = [[] for _ in range(n)]
    load = [0.0] * n
    for i in sorted(range(len(reqs)), key=lambda i: -pred[i]):
        k = min(range(n), key=lambda j: (load[j], len(out[j])))
        out[k].append(reqs[i])
        load[k] += pred[i]
    return out
