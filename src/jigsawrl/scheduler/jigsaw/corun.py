"""How fast a rollout runs when another pipeline's rollout engine shares its devices (issue 11:
pipeline multiplexing, the paper's co-located rollouts), predicted by the simulator's own
rollout runtime on the belief cost model.

Two rollout engines on one device split its compute (half each, as the policy's equal split
does) and its memory bandwidth (:mod:`jigsawrl.sim.contention`): while both decode, each runs
at a fraction of its speed alone; while one waits for tools, prefills or has drained, the other
runs nearly alone. So co-location pays where a rollout leaves its devices idle or overhead-bound
much of the time (multi-turn tool waits, long tails of a few requests, per-iteration overheads
that do not contend) and costs where both run large, bandwidth-bound batches.

:func:`corun_rate` replays one rank of ``pv``'s rollout (a contiguous chunk of a batch drawn
from the task preset, :mod:`~jigsawrl.scheduler.batch_replay`) alone and beside a twin (a chunk
of another draw of the same pipeline, so that the two do not decode in lock-step), on a
:class:`~jigsawrl.sim.cluster.SimCluster` of one TP group under the belief cost model, the
survivor's share raised to the whole device when the other ends; the rate is the time alone
÷ the time co-run. Simplification, said here: a pipeline's rate is measured against a twin of
itself, not against the pipeline it will actually share with (the plan forecast does not know
which that will be), and on one rank, not the slowest of several.
"""

from __future__ import annotations

from jigsawrl.scheduler.base import PipelineView, View
from jigsawrl.scheduler.batch_replay import memo, prior_batches, prior_key
from jigsawrl.scheduler.verl_placements import prior_requests
from jigsawrl.sim.cluster import SimCluster
from jigsawrl.sim.dispatch import dispatch_requests
from jigsawrl.workload.experiment import ResolvedPipeline
from jigsawrl.workload.requests import RequestTruth
from jigsawrl.workload.task_presets import TASKS

# A co-run replay stops after this many events (a guard: a rank replays a few thousand).
MAX_EVENTS = 200_000


class _Ends:
    """A :class:`~jigsawrl.sim.listener.SimListener` that records when each rollout ends."""

    def __init__(self) -> None:
        self.ends: dict[str, float] = {}

    def rank_progress(self, task_id: str, rank: int, unfinished: int, band: str, time_s: float,
                      ctx_tokens: int) -> None:
        return None

    def task_done(self, task_id: str, pipeline: str, step: int, stage: str, time_s: float,
                  prompt_tokens: tuple[int, ...] = (),
                  response_tokens: tuple[int, ...] = ()) -> None:
        self.ends[task_id] = time_s


def corun_rate(view: View, pv: PipelineView, ranks: int, kv_mem: float,
               beside: PipelineView | None = None) -> float:
    """``pv``'s rollout progress rate beside another engine on its devices ÷ alone (≤ 1): one
    rank of a rollout on ``ranks`` ranks with ``kv_mem`` bytes of KV per device (the memory
    plan's, which already counts two engines per device), beside a rank of ``beside``'s rollout
    (default: a twin of ``pv``, another draw of its batch)."""
    other = pv if beside is None else beside
    keys = (prior_key(pv), prior_key(other))

    def rate() -> float:  # worked out once per key (drawing the chunks is not free either)
        mine, theirs = _chunk(pv, ranks, 0), _chunk(other, ranks, 1)
        if not mine or not theirs:
            return 1.0
        alone = _replay(view, [(pv, mine)], kv_mem)[0]
        both = _replay(view, [(pv, mine), (other, theirs)], kv_mem)[0]
        return min(1.0, alone / both) if both > 0 else 1.0
    return memo(None if None in keys else (
        "corun", pv.model, pv.spec.rollout_tp, other.model, other.spec.rollout_tp, kv_mem,
        ranks, keys), view.cost, rate)


def _chunk(pv: PipelineView, ranks: int, draw: int) -> list[RequestTruth]:
    """Rank 0's contiguous chunk of batch draw ``draw`` (of one batch halved, for a pipeline
    whose prior is a single batch)."""
    batches = prior_batches(pv, prior_requests(pv) if prior_key(pv) is None else [],
                            draws=2)
    if len(batches) >= 2:
        return dispatch_requests(batches[draw], max(1, ranks), "contiguous")[0]
    return dispatch_requests(batches[0], 2 * max(1, ranks), "contiguous")[draw]


def _replay(view: View, engines: list[tuple[PipelineView, list[RequestTruth]]],
            kv_mem: float) -> list[float]:
    """When each engine ends, all started together on the first devices of the pool (each
    its own TP group), at an equal share, a survivor's share raised to the whole device."""
    ends = _Ends()
    sim = SimCluster(max(pv.spec.rollout_tp for pv, _ in engines), view.cost, ends)
    share = 1.0 / len(engines)
    tids = [f"corun/{i}" for i in range(len(engines))]
    for i, (pv, chunk) in enumerate(engines):
        tp = pv.spec.rollout_tp
        pipe = ResolvedPipeline(i, pv.spec, pv.model, TASKS.get(pv.spec.task),
                                None)  # type: ignore[arg-type]  # the sampler is not read
        sim.start_rollout(tids[i], pipe, 0, tuple(range(tp)), tp, share, kv_mem, [chunk])
    raised = False
    for _ in range(MAX_EVENTS):
        if not sim.step():
            break
        if not raised and ends.ends and len(tids) > 1:
            raised = True
            for tid in tids:
                if tid not in ends.ends and tid in sim.rollouts.tasks:
                    sim.set_share(tid, 1.0)
    return [ends.ends.get(tid, 0.0) for tid in tids]
