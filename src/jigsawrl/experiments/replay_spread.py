"""The prediction's own spread: replays of a real run under the run's measured call-time noise.

Why: on a pool whose calls cannot be preempted (a Ray CPU worker runs one call at a time), a
short pipeline's mean step depends on whether its calls find a free device or wait behind a
neighbour's long update, and that flips with a few milliseconds either way. One noise-free
replay is one draw of such a schedule: on three demo runs (`make demo`'s recipe, 2026-12-07)
`countdown`'s noise-free replay missed by -25, -28 and -32% with one profile and by +15, +11 and
+4% with another taken 25 minutes later, while sixteen replays whose calls carried each run's
own scatter (6.5-8.5%) spread over 0.5-1.6 s a step around the measured 0.84-0.93 s. Their
median was no better a point prediction (mean error 19% against the noise-free replay's 19%
over the six), so the prediction stays the noise-free replay; the replays give it a range: a
wide one says the quantity is timing-sensitive, whatever the cost model's accuracy, and a
measurement outside the range is a miss the scatter does not explain.

How the noise is measured, from the run itself (never picked): each model pass (old / ref
log-prob, update) of a (pipeline, step) is timed on both sides — its first span's start to its
last span's end, measured and in the noise-free replay of the same requests — and
``log(measured / predicted)`` is centred on its (pipeline, stage) median, so that a stage the
profile prices 10% off moves nothing: what remains is the call-to-call scatter. Its robust
standard deviation (1.4826 × the median absolute deviation) is the noise. Fewer than
:data:`MIN_PASSES` matched passes: no noise measured, and the noise-free replay alone predicts.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jigsawrl.costmodel import CostModel
from jigsawrl.events import Event, Span
from jigsawrl.stages import Stage

# Replays under noise per calibration (~1 s each for the demo's run): with eight as with
# sixteen, the range held `countdown`'s measured step in each of the six demo predictions above.
REPLAYS = 8
# Matched passes below which the run's scatter is not trusted (two pipelines of a few steps).
MIN_PASSES = 12
# 1.4826 × MAD estimates a normal's standard deviation.
_MAD_TO_SD = 1.4826
_PASSES = (Stage.OLD_LOGPROB, Stage.REF_LOGPROB, Stage.ACTOR_UPDATE)


def pass_windows(events: Iterable[Event]) -> dict[tuple[str, int, str], float]:
    """(pipeline, step, stage) -> seconds from the first span's start to the last span's end,
    for every model pass of ``events`` (data-parallel helpers and PPO-epoch rounds included)."""
    spans: dict[tuple[str, int, str], list[float]] = {}
    for e in events:
        if isinstance(e, Span) and e.stage in _PASSES:
            got = spans.setdefault((e.pipeline, e.step, str(e.stage)), [e.start_s, e.end_s])
            got[0], got[1] = min(got[0], e.start_s), max(got[1], e.end_s)
    return {k: end - start for k, (start, end) in spans.items()}


def call_noise_sigma(measured: Iterable[Event], predicted: Iterable[Event]) -> float | None:
    """The run's call-time scatter (module docstring); None below :data:`MIN_PASSES` passes."""
    got, want = pass_windows(measured), pass_windows(predicted)
    by_group: dict[tuple[str, str], list[float]] = defaultdict(list)
    for key, seconds in got.items():
        pred = want.get(key)
        if pred and pred > 0 and seconds > 0:
            by_group[(key[0], key[2])].append(math.log(seconds / pred))
    centred = [x - statistics.median(xs) for xs in by_group.values() for x in xs]
    if len(centred) < MIN_PASSES:
        return None
    return _MAD_TO_SD * statistics.median(abs(x) for x in centred)


def noisy(truth: CostModel, sigma: float, seed: int) -> CostModel:
    """``truth`` with lognormal(0, ``sigma``) noise on every duration, from ``seed``."""
    return CostModel(truth.accel, noise_sigma=sigma, seed=seed, params=truth.params,
                     deployment=truth.deployment)


def replays(simulate: Callable[[CostModel], Mapping[str, Any]], truth: CostModel, sigma: float,
            count: int = REPLAYS) -> list[Mapping[str, Any]]:
    """The summaries of ``count`` replays, ``simulate(truth with noise seeded 0..count-1)``."""
    return [simulate(noisy(truth, sigma, seed)) for seed in range(count)]
