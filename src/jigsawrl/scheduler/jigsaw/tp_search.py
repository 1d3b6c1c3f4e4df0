"""jigsaw's rollout TP, searched by prediction (issue 11 item 6, the paper's hand-picked knob).

At the first decision each candidate — every pipeline's configured rollout TP scaled by one of
:data:`~jigsawrl.scheduler.rollout_tp.TP_FACTORS` — is planned by a fresh jigsaw on the view
with those TPs (:func:`~jigsawrl.scheduler.rollout_tp.retp_view`): its width plan's forecast, or
the verl placement it would fall back to, whichever it would run. The candidate predicted
soonest is kept for the run (the config's own on a tie) — among those whose predicted step
latencies exceed the pipelines' latency bounds least, where any sets one (:mod:`.latency`).
No margin favours the config's TP: at
the fallback's 3% the search kept TP 1 on the paper's AIME pair (TP 4 predicted 2.6% sooner,
measured 5.5% faster) and lost to verl at TP 4 (0.97-0.98x); with none it lost nowhere in the
twelve example and paper groups at seeds 0-1 (docs/BENCHMARKS.md). Only the view and the belief cost model are read: no measured run picks it.
Only where the executor forms TP groups of any width (``View.can_regroup``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import View
from jigsawrl.scheduler.rollout_tp import (
    TP_FACTORS,
    check_rollout_tp,
    is_configured,
    label,
    retp_view,
    scaled_tps,
)


@dataclass(frozen=True, slots=True)
class TPChoice:
    """The rollout TPs jigsaw runs (empty: the config's) and each candidate's predicted makespan
    (seconds, by :func:`~jigsawrl.scheduler.rollout_tp.label`) and, where a pipeline sets a
    latency bound, how far its predicted latencies exceed them (:mod:`.latency`)."""

    tps: dict[str, int]
    predicted_s: dict[str, float]
    excess: dict[str, float] = field(default_factory=dict)
    # the chosen candidate's (latency bounds' excess, predicted makespan)
    chosen: tuple[float, float] = (0.0, 0.0)


def search_tp(view: View, plan: Callable[[View], tuple[float, float]]) -> TPChoice:
    """The candidate TPs predicted soonest among those that exceed the latency bounds least
    (module docstring); ``plan``: the bounds' excess and the makespan a fresh jigsaw predicts
    for what it would run on a view (inf: nothing fits)."""
    seen: list[dict[str, int]] = []
    predicted: dict[str, tuple[float, float]] = {}
    for factor in TP_FACTORS:
        tps = scaled_tps(view, factor)
        if tps in seen:
            continue
        seen.append(tps)
        try:
            for pv in view.pipelines:
                check_rollout_tp(view, pv, tps[pv.name])
            predicted[label(tps)] = plan(retp_view(view, tps))
        except ConfigError:
            continue
    own = label(seen[0])
    best = min(predicted, key=predicted.__getitem__, default=own)
    if own in predicted and predicted[best] >= predicted[own]:
        best = own
    tps = next(t for t in seen if label(t) == best)
    return TPChoice({} if is_configured(view, tps) else tps,
                    {k: s for k, (_, s) in predicted.items()},
                    {k: x for k, (x, _) in predicted.items() if x},
                    predicted.get(best, (math.inf, math.inf)))
