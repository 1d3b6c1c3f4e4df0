"""The single-controller loop (DESIGN.md §3): view → policy.decide → apply → executor.advance.

Reads top to bottom: the driver asks the policy what to do, applies each action (checking the
pool's invariants), lets the executor run until something the policy should react to happens, and
records progress. It emits :class:`~jigsawrl.events.StepFinished` records with verl's stage timings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jigsawrl.driver.protocol import Executor, Notification, RankProgress, TaskDone, TaskFailed
from jigsawrl.driver.state import DriverState, InvariantError, PipelineState
from jigsawrl.events import Event, PipelineFailed, StepFinished
from jigsawrl.scheduler.base import (
    ROLLOUT,
    Action,
    Policy,
    RunningTask,
    SetResident,
    SetShare,
    StartRollout,
    StartStage,
    stage_sequence,
    task_id,
)
from jigsawrl.workload.resolve import Experiment

log = logging.getLogger(__name__)

# verl's timing names for each stage (peers.md): timing_s/{gen,reward,old_log_prob,ref,...}.
VERL_TIMING = {
    ROLLOUT: "gen", "reward": "reward", "old_logprob": "old_log_prob", "ref_logprob": "ref",
    "actor_update": "update_actor", "weight_sync": "update_weights",
}


class SchedulerStalled(RuntimeError):
    """The policy started nothing while nothing runs and pipelines are unfinished."""


@dataclass(slots=True)
class DriverResult:
    events: list[Event]
    decision_times_s: list[float] = field(default_factory=list)
    makespan_s: float = 0.0


class Driver:
    """Runs one experiment with one policy on one executor."""

    def __init__(self, exp: Experiment, policy: Policy, executor: Executor, belief_cost: object,
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        self.exp = exp
        self.policy = policy
        self.executor = executor
        self.cost = belief_cost
        self.state = DriverState(exp)
        self.on_progress = on_progress
        self._events: list[Event] = []
        self._decision_times: list[float] = []

    def run(self) -> DriverResult:
        self.executor.start()
        wants_progress = bool(getattr(self.policy, "wants_rank_progress", False))
        try:
            decide = True
            while not self.state.all_finished:
                started = self._decide_and_apply() if decide else 0
                if not started and not self.executor.busy():
                    raise SchedulerStalled(self._stall_message())
                notes = self.executor.advance()
                for note in notes:
                    self._handle(note)
                # Rank progress alone wakes only policies that asked for it (it is frequent).
                decide = wants_progress or any(not isinstance(n, RankProgress) for n in notes)
                self._events.extend(self.executor.drain_events())
        finally:
            self.executor.close()
        self._events.extend(self.executor.drain_events())
        return DriverResult(self._events, self._decision_times, self.executor.now_s)

    # ------------------------------------------------------------------ decisions
    def _decide_and_apply(self) -> int:
        view = self.state.view(self.executor.now_s, self.cost)
        t0 = time.perf_counter()
        decision = self.policy.decide(view)
        self._decision_times.append(time.perf_counter() - t0)
        launched = 0
        for action in decision.actions:
            launched += self._apply(action)
        return launched

    def _apply(self, a: Action) -> int:
        if isinstance(a, SetResident):
            self.state.set_resident(a.pipeline, a.devices, a.bytes_per_device)
            return 0
        if isinstance(a, SetShare):
            self.state.reshare(a.task_id, a.share)
            self.executor.set_share(a)
            ps = self._pipe_of(a.task_id)
            ps.running[a.task_id] = _with_share(ps.running[a.task_id], a.share)
            ps.touch()
            return 1
        return self._launch(a)

    def _launch(self, a: StartRollout | StartStage) -> int:
        stage = ROLLOUT if isinstance(a, StartRollout) else a.stage
        ps = self.state.pipes[a.pipeline]
        tid = task_id(a.pipeline, a.step, stage)
        if (a.step, stage) not in ps.view().ready():
            raise InvariantError(f"{tid} is not ready (dependencies unmet, running or done)")
        mem = a.mem_bytes if isinstance(a, StartStage) else (
            a.kv_mem_bytes + self.cost.rollout_weight_bytes(ps.res.model, a.tp))
        self.state.acquire(tid, a.devices, a.share, mem)
        ps.touch()
        now = self.executor.now_s
        ps.running[tid] = RunningTask(tid, a.pipeline, a.step, stage, a.devices, a.share, now)
        if stage == ROLLOUT:
            ps.step_start_s[a.step] = now
            ps.unfinished[tid] = [0] * (len(a.devices) // a.tp)
        self.executor.launch(a)
        return 1

    # ------------------------------------------------------------------ notifications
    def _handle(self, note: Notification) -> None:
        if isinstance(note, RankProgress):
            ps = self._pipe_of(note.task_id)
            counts = ps.unfinished.get(note.task_id)
            if counts is not None and note.rank < len(counts):
                counts[note.rank] = note.unfinished
                ps.touch()
        elif isinstance(note, TaskDone):
            self._task_done(note)
        elif isinstance(note, TaskFailed):
            self._task_failed(note)

    def _task_done(self, note: TaskDone) -> None:
        ps = self.state.pipes[note.pipeline]
        ps.touch()
        task = ps.running.pop(note.task_id)
        ps.unfinished.pop(note.task_id, None)
        self.state.release(note.task_id)
        ps.done.setdefault(note.step, set()).add(note.stage)
        timings = ps.stage_s.setdefault(note.step, {})
        timings[VERL_TIMING.get(note.stage, note.stage)] = note.time_s - task.start_s
        if note.stage == ROLLOUT:
            self.state.observe_rollout(note.pipeline, note.step, note.prompt_tokens,
                                       note.response_tokens)
        if ps.done[note.step] >= set(stage_sequence(ps.res.spec)):
            self._step_finished(ps, note.step, note.time_s)

    def _step_finished(self, ps: PipelineState, step: int, now: float) -> None:
        start = ps.step_start_s.pop(step)
        timings = dict(ps.stage_s.pop(step, {}))
        timings["step"] = now - start
        del ps.done[step]
        ps.steps_completed += 1
        self._events.append(StepFinished(ps.res.spec.name, step, start, now, timings))
        if self.on_progress is not None:
            done = sum(p.steps_completed for p in self.state.pipes.values())
            self.on_progress(done, sum(p.res.spec.steps for p in self.state.pipes.values()))

    def _task_failed(self, note: TaskFailed) -> None:
        ps = self.state.pipes[note.pipeline]
        ps.touch()
        for tid in list(ps.running):
            self.state.release(tid)
        ps.running.clear()
        ps.failed = note.error
        log.error("pipeline %s failed at step %d (%s): %s", note.pipeline, note.step, note.stage,
                  note.error)
        self._events.append(PipelineFailed(note.pipeline, note.step, note.time_s, note.error))

    # ------------------------------------------------------------------ helpers
    def _pipe_of(self, tid: str) -> PipelineState:
        return self.state.pipes[tid.split("/", 1)[0]]

    def _stall_message(self) -> str:
        todo = {n: p.view().ready() for n, p in self.state.pipes.items() if p.failed is None}
        return (f"policy {getattr(self.policy, 'name', self.policy)!r} started nothing at "
                f"t={self.executor.now_s:.1f}s while nothing runs; ready work: {todo}")


def _with_share(t: RunningTask, share: float) -> RunningTask:
    return RunningTask(t.task_id, t.pipeline, t.step, t.stage, t.devices, share, t.start_s,
                       t.unfinished_per_rank)
