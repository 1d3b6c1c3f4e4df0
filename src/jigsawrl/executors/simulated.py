"""The simulated executor: :class:`~jigsawrl.driver.protocol.Executor` over the simulator.

It owns the *truth*: request lengths sampled per step (seeded) and a cost model with seeded noise.
The driver and the policy never see either; they get :mod:`jigsawrl.driver.protocol`
notifications (task done with observed token counts, rank progress) and the executor writes
metric records (:mod:`jigsawrl.events`).

This module is only the adapter: it turns the scheduler's actions into calls on
:class:`~jigsawrl.sim.cluster.SimCluster` (the event clock, rollout ranks, compute works and
bandwidth contention, each in its own ``sim/`` module) and the simulator's messages into the
driver's notifications. The true requests and their dispatch to ranks are
:mod:`jigsawrl.sim.dispatch`; :meth:`SimulatedExecutor.step_requests` is the one place a run
asks for them, so a test can fix the workload by overriding it.
"""

from __future__ import annotations

import logging

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.driver.protocol import Notification, RankProgress, TaskDone
from jigsawrl.events import Event
from jigsawrl.scheduler.base import (
    Interrupt,
    Migrate,
    Regroup,
    SetShare,
    Spread,
    StartRollout,
    StartStage,
    task_id,
)
from jigsawrl.scheduler.ranker import LengthRanker
from jigsawrl.sim.cluster import SimCluster
from jigsawrl.sim.dispatch import TruthSampler, dispatch_requests
from jigsawrl.stages import Stage
from jigsawrl.workload.experiment import Experiment, ResolvedPipeline
from jigsawrl.workload.requests import RequestTruth

log = logging.getLogger(__name__)


class DriverNotes:
    """The simulator's listener: its messages as driver notifications, in order."""

    def __init__(self) -> None:
        self.notes: list[Notification] = []

    def rank_progress(self, task_id: str, rank: int, unfinished: int, band: str, time_s: float,
                      ctx_tokens: int) -> None:
        self.notes.append(RankProgress(task_id, rank, unfinished, band, time_s, ctx_tokens))

    def task_done(self, task_id: str, pipeline: str, step: int, stage: str, time_s: float,
                  prompt_tokens: tuple[int, ...] = (),
                  response_tokens: tuple[int, ...] = ()) -> None:
        self.notes.append(TaskDone(task_id, pipeline, step, stage, time_s, prompt_tokens,
                                   response_tokens))

    def take(self) -> list[Notification]:
        out, self.notes = self.notes, []
        return out


class SimulatedExecutor:
    """Event-driven executor over the truth model; see the module docstring.

    Args:
        exp: the resolved experiment (pool, pipelines).
        truth_cost: the truth cost model.
        seed: seeds the sampled requests.
    """

    def __init__(self, exp: Experiment, *, truth_cost: CostModelProtocol, seed: int) -> None:
        self.exp = exp
        self.cost = truth_cost
        self.seed = seed
        self._notes = DriverNotes()
        self._sampler = TruthSampler(seed)
        self.sim = SimCluster(exp.num_devices, truth_cost, self._notes)
        # Regroup needs whole-device ranks that can re-form: not on devices that run one call
        # at a time (the model of the Ray CPU workers, which cannot regroup either).
        self.can_regroup = self.sim.gates is None
        self.can_spread = True  # new ranks of a rollout (the Ray executor runs them too)

    # ------------------------------------------------------------------ protocol
    @property
    def now_s(self) -> float:
        return self.sim.now_s

    def start(self) -> None:
        log.debug("simulated executor started (seed %d)", self.seed)

    def close(self) -> None:
        pass

    def finish(self) -> None:
        pass  # nothing is measured after a simulated run

    def busy(self) -> bool:
        return self.sim.busy()

    def drain_events(self) -> list[Event]:
        return self.sim.drain_events()

    def launch(self, action: StartRollout | StartStage) -> None:
        pipe = self.exp.pipeline(action.pipeline)
        if isinstance(action, StartRollout):
            self._launch_rollout(pipe, action)
        else:
            tid = task_id(action.pipeline, action.step, action.stage)
            self.sim.start_work(tid, pipe, action.step, action.stage, action.devices,
                                action.share)

    def set_share(self, action: SetShare) -> None:
        self.sim.set_share(action.task_id, action.share, action.rank)

    def migrate(self, action: Migrate) -> None:
        """Move the unfinished requests of ``src_ranks`` onto ``dst_rank`` (re-prefill there)."""
        self.sim.migrate(action.task_id, action.src_ranks, action.dst_rank)

    def regroup(self, action: Regroup) -> None:
        """Re-form ranks into one TP group (sim/rollout_regroup.py)."""
        self.sim.regroup(action.task_id, action.src_ranks, action.dst_rank)

    def spread(self, action: Spread) -> None:
        """Grow a rollout onto new ranks (sim/rollout_spread.py)."""
        self.sim.spread(action.task_id, action.devices)

    def interrupt(self, action: Interrupt) -> None:
        """Abort and resume in place every in-flight request of a rollout (AReaL on new weights)."""
        self.sim.interrupt(action.task_id)

    def advance(self) -> list[Notification]:
        while not self._notes.notes and self.sim.step():
            pass
        return self._notes.take()

    # ------------------------------------------------------------------ truth
    def step_requests(self, pipe: ResolvedPipeline, step: int) -> list[RequestTruth]:
        """The true requests of a step, sampled once from a seed derived from structure."""
        return self._sampler.step_requests(pipe, step)

    def _dispatch(self, reqs: list[RequestTruth], n: int, how: str, step: int,
                  ranker: LengthRanker | None = None) -> list[list[RequestTruth]]:
        """Split a step's batch over ``n`` ranks (:func:`~jigsawrl.sim.dispatch.dispatch_requests`).

        ``skew_aware`` ranks by the policy's ``ranker`` evaluated on each request's *prompt*
        tokens (what a real system sees before generating), never on its sampled response.
        """
        if how != "skew_aware":
            return dispatch_requests(reqs, n, how)
        rk = ranker or LengthRanker()
        return dispatch_requests(reqs, n, how, predicted=[rk.predict(r.prompt_tokens)
                                                          for r in reqs])

    def _launch_rollout(self, pipe: ResolvedPipeline, a: StartRollout) -> None:
        tid = task_id(a.pipeline, a.step, Stage.ROLLOUT)
        n_ranks = len(a.devices) // a.tp
        if n_ranks < 1:
            raise ValueError(f"{tid}: {len(a.devices)} devices cannot host TP={a.tp}")
        chunks = self._dispatch(self.step_requests(pipe, a.step), n_ranks, a.dispatch, a.step,
                                a.ranker)
        self.sim.start_rollout(tid, pipe, a.step, a.devices, a.tp, a.share, a.kv_mem_bytes,
                               chunks, first_b=a.first_b, stream_devices=a.stream_devices,
                               tail_logprobs=a.tail_logprobs)
