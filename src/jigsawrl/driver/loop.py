"""The single-controller loop (DESIGN.md §3): view → policy.decide → apply → executor.advance.

Reads top to bottom: the driver asks the policy what to do, applies each action (checking the
pool's invariants), lets the executor run until something the policy should react to happens, and
records progress. It emits :class:`~jigsawrl.events.StepFinished` records with verl's stage timings.

Background work: a decision is on the critical path of every event, so a policy keeps it short
and hands its expensive planning (a replan, a rollout replay) over as work
(``Policy.background``) that the driver runs after the decision's actions are applied; the
policy waits for the result where it needs one, and the driver asks it again, at the same
instant, once the work has run. The work's wall time is recorded apart
(``DriverResult.background_times_s``). Simplification, said where the numbers are reported: the
work runs in the driver's thread, after the actions went out (real workers run meanwhile); an
event that arrives during it waits for it, as it waited for a slow decision before. The
simulated clock does not move while it runs (nor did it during a decision).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from jigsawrl.driver.protocol import Executor, Notification, RankProgress, TaskDone, TaskFailed
from jigsawrl.driver.state import DriverState, InvariantError, PipelineState
from jigsawrl.events import Event, PipelineFailed, StepFinished
from jigsawrl.scheduler.base import (
    NOT_REPORTED,
    Action,
    Interrupt,
    Migrate,
    Policy,
    Regroup,
    RunningTask,
    SetResident,
    SetShare,
    Spread,
    StartRollout,
    StartStage,
    stage_sequence,
    task_id,
)
from jigsawrl.stages import HOST_STAGES, MEMORY_MOVES, ROLLOUT_BANDS, VERL_TIMING, Stage
from jigsawrl.workload.experiment import Experiment

log = logging.getLogger(__name__)

# verl's timing name of each task's stage (peers.md): timing_s/{gen,reward,old_log_prob,ref,...};
# stages.VERL_TIMING names the spans each one measures, and a rollout task's spans are its bands.
TIMING_KEY: dict[str, str] = {
    (Stage.ROLLOUT if stages == ROLLOUT_BANDS else stages[0]): key
    for key, stages in VERL_TIMING.items()}

# HOST_STAGES (stages.py) may hold devices at compute share 0. MEMORY_MOVES a policy may launch for
# a pipeline at any time: they are no stage of a step (not in ``stage_sequence``), so they skip the
# readiness check and mark nothing done.


class SchedulerStalled(RuntimeError):
    """The policy started nothing while nothing runs and pipelines are unfinished."""


# Background rounds in a row (work run, then a decision) before the driver advances the clock
# regardless: a policy that asks for work again and again at one instant has a bug.
MAX_BACKGROUND_ROUNDS = 16


@dataclass(slots=True)
class DriverResult:
    events: list[Event]
    decision_times_s: list[float] = field(default_factory=list)
    makespan_s: float = 0.0
    # wall seconds of each piece of background work the policy handed over (planning off the
    # decision path: ``Policy.background``), not counted in ``decision_times_s``
    background_times_s: list[float] = field(default_factory=list)


class Driver:
    """Runs one experiment with one policy on one executor."""

    def __init__(self, exp: Experiment, policy: Policy, executor: Executor, belief_cost: object,
                 on_progress: Callable[[int, int], None] | None = None) -> None:
        self.exp = exp
        self.policy = policy
        self.executor = executor
        self.cost = belief_cost
        self.state = DriverState(exp)
        self.state.can_regroup = bool(getattr(executor, "can_regroup", False))
        self.state.can_spread = bool(getattr(executor, "can_spread", False))
        self.on_progress = on_progress
        self._events: list[Event] = []
        self._decision_times: list[float] = []
        self._background_times: list[float] = []
        self._per_node = exp.config.cluster.accelerators_per_node

    def run(self) -> DriverResult:
        self.executor.start()
        wants_progress = self.policy.wants_rank_progress
        end_s: float | None = None  # the clock when the last pipeline finished
        try:
            decide, rounds = True, 0  # rounds: background work run at this instant
            while not self.state.all_finished:
                started = self._decide_and_apply() if decide else 0
                if decide and rounds < MAX_BACKGROUND_ROUNDS and self._background():
                    rounds += 1
                    continue  # decide again, on what the work prepared, before the clock moves
                rounds = 0
                if not started and not self.executor.busy():
                    raise SchedulerStalled(self._stall_message())
                notes = self.executor.advance()
                for note in notes:
                    self._handle(note)
                # Rank progress alone wakes only policies that asked for it, and only when the
                # policy says the new counts matter (reports are frequent).
                decide = any(not isinstance(n, RankProgress) for n in notes) or (
                    wants_progress and self._progress_wakes(notes))
                self._events.extend(self.executor.drain_events())
            end_s = self.executor.now_s
            self.executor.finish()  # after the clock: e.g. the Ray workers' end-of-run probes
        finally:
            self.executor.close()
        self._events.extend(self.executor.drain_events())
        return DriverResult(self._events, self._decision_times,
                            self.executor.now_s if end_s is None else end_s,
                            self._background_times)

    def _background(self) -> bool:
        """Run the work the last decision left off its path (module docstring); True if any."""
        work = self.policy.background()
        if work is None:
            return False
        t0 = time.perf_counter()
        work()
        self._background_times.append(time.perf_counter() - t0)
        return True

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
            return self._set_share(a)
        if isinstance(a, Migrate):
            return self._migrate(a)
        if isinstance(a, Regroup):
            return self._regroup(a)
        if isinstance(a, Spread):
            return self._spread(a)
        if isinstance(a, Interrupt):
            self._running(a.task_id)
            self.executor.interrupt(a)
            return 1
        return self._launch(a)

    def _running(self, tid: str) -> RunningTask:
        task = self._pipe_of(tid).running.get(tid)
        if task is None:
            raise InvariantError(f"{tid} is not running")
        return task

    def _set_share(self, a: SetShare) -> int:
        task = self._running(a.task_id)
        ps = self._pipe_of(a.task_id)
        if a.rank is None:
            devices = task.devices if not task.rank_devices else tuple(
                d for r, devs in enumerate(task.rank_devices) if task.rank_shares[r] > 0
                for d in devs)
            shares = tuple(a.share if s > 0 else 0.0 for s in task.rank_shares)
        else:
            if not task.rank_devices or not 0 <= a.rank < len(task.rank_devices):
                raise InvariantError(f"{a.task_id} has no rank {a.rank}")
            if task.rank_shares[a.rank] == 0:
                raise InvariantError(f"{a.task_id} rank {a.rank} was released by a migration")
            devices = task.rank_devices[a.rank]
            shares = tuple(a.share if r == a.rank else s for r, s in enumerate(task.rank_shares))
        self.state.reshare(a.task_id, a.share, devices)
        self.executor.set_share(a)
        share = a.share if a.rank is None else task.share
        ps.running[a.task_id] = replace(task, share=share, rank_shares=shares)
        ps.touch()
        return 1

    def _migrate(self, a: Migrate) -> int:
        task = self._running(a.task_id)
        n = len(task.rank_devices)
        live = [r for r in range(n) if task.rank_shares[r] > 0]
        if a.dst_rank not in live or not a.src_ranks or a.dst_rank in a.src_ranks or any(
                r not in live for r in a.src_ranks):
            raise InvariantError(f"{a.task_id}: bad migration {a.src_ranks} -> {a.dst_rank} "
                                 f"(live ranks {live})")
        released = tuple(d for r in a.src_ranks for d in task.rank_devices[r])
        self.executor.migrate(a)
        self.state.release_devices(a.task_id, released)
        ps = self._pipe_of(a.task_id)
        shares = tuple(0.0 if r in a.src_ranks else s for r, s in enumerate(task.rank_shares))
        ps.running[a.task_id] = replace(task, rank_shares=shares)
        ps.touch()
        return 1

    def _regroup(self, a: Regroup) -> int:
        """Re-form ranks of a rollout into one TP group on their devices (none is released)."""
        task = self._running(a.task_id)
        live = [r for r in range(len(task.rank_devices)) if task.rank_shares[r] > 0]
        if not self.state.can_regroup:
            raise InvariantError(f"{a.task_id}: this executor cannot regroup ranks")
        if a.dst_rank not in live or not a.src_ranks or a.dst_rank in a.src_ranks or any(
                r not in live for r in a.src_ranks):
            raise InvariantError(f"{a.task_id}: bad regroup {a.src_ranks} -> {a.dst_rank} "
                                 f"(live ranks {live})")
        ranks = (a.dst_rank, *a.src_ranks)
        devices = tuple(d for r in ranks for d in task.rank_devices[r])
        model = self._pipe_of(a.task_id).res.model
        per = self.exp.config.cluster.accelerators_per_node
        if len({d // per for d in devices}) > 1 or model.num_heads % len(devices):
            raise InvariantError(f"{a.task_id}: ranks {ranks} cannot form one TP group of "
                                 f"{len(devices)} devices (one node, dividing the heads)")
        self.executor.regroup(a)
        ps = self._pipe_of(a.task_id)
        rank_devices = tuple(devices if r == a.dst_rank else devs
                             for r, devs in enumerate(task.rank_devices))
        shares = tuple(0.0 if r in a.src_ranks else s for r, s in enumerate(task.rank_shares))
        ps.running[a.task_id] = replace(task, rank_devices=rank_devices, rank_shares=shares)
        ps.touch()
        return 1

    def _spread(self, a: Spread) -> int:
        """Grow a running rollout by ranks on ``a.devices`` (whole groups of its TP, each within
        a node), each holding the rollout's engine memory, as its start did."""
        task = self._running(a.task_id)
        if not self.state.can_spread:
            raise InvariantError(f"{a.task_id}: this executor cannot spread a rollout")
        if task.stage != Stage.ROLLOUT or not task.rank_devices:
            raise InvariantError(f"{a.task_id}: only a running rollout can spread")
        tp = len(task.devices) // len(task.rank_devices)  # whole groups, kept by every action
        groups = tp_groups(self._per_node, a.devices, tp)
        held = {d for r, devs in enumerate(task.rank_devices) if task.rank_shares[r] > 0
                for d in devs}  # a device a migration released may be taken again
        if groups is None or len(set(a.devices)) != len(a.devices) or set(a.devices) & held:
            raise InvariantError(f"{a.task_id}: cannot spread onto {a.devices} (devices it does "
                                 f"not hold, in whole groups of TP {tp}, each within a node)")
        share = task.live_share
        self.state.acquire(a.task_id, a.devices, share, self.state.task_mem(a.task_id))
        ps = self._pipe_of(a.task_id)
        ps.running[a.task_id] = replace(
            task, devices=task.devices + a.devices,
            rank_devices=task.rank_devices + tuple(groups),
            rank_shares=task.rank_shares + (share,) * len(groups))
        ps.unfinished[a.task_id].extend([NOT_REPORTED] * len(groups))
        ps.ctx_tokens[a.task_id].extend([0] * len(groups))
        ps.touch()
        self.executor.spread(a)
        return 1

    def _check_tp(self, a: StartRollout, heads: int) -> None:
        """A rollout's devices are whole TP groups, each within a node, the TP dividing the
        model's heads (a policy may choose another TP than the config's)."""
        if a.tp < 1 or heads % a.tp or tp_groups(self._per_node, a.devices, a.tp) is None:
            raise InvariantError(f"{a.pipeline}/{a.step}/rollout: {len(a.devices)} device(s) "
                                 f"cannot form TP groups of {a.tp} (whole groups, each within "
                                 f"a node, dividing the model's {heads} heads)")

    def _launch(self, a: StartRollout | StartStage) -> int:
        stage = Stage.ROLLOUT if isinstance(a, StartRollout) else a.stage
        ps = self.state.pipes[a.pipeline]
        tid = task_id(a.pipeline, a.step, stage)
        if stage in MEMORY_MOVES:
            if tid in ps.running:
                raise InvariantError(f"{tid} is already running")
        elif (a.step, stage) not in ps.view().ready():
            raise InvariantError(f"{tid} is not ready (dependencies unmet, running or done)")
        mem = a.mem_bytes if isinstance(a, StartStage) else (
            a.kv_mem_bytes + self.cost.rollout_weight_bytes(ps.res.model, a.tp))
        self.state.acquire(tid, a.devices, a.share, mem, host_stage=stage in HOST_STAGES)
        ps.touch()
        now = self.executor.now_s
        ps.running[tid] = RunningTask(tid, a.pipeline, a.step, stage, a.devices, a.share, now)
        if isinstance(a, StartRollout):
            self._check_tp(a, ps.res.model.num_heads)
            ranks = tuple(a.devices[r * a.tp:(r + 1) * a.tp] for r in range(len(a.devices) // a.tp))
            ps.running[tid] = replace(ps.running[tid], rank_devices=ranks,
                                      rank_shares=(a.share,) * len(ranks))
            ps.step_start_s[a.step] = now
            ps.unfinished[tid] = [NOT_REPORTED] * (len(a.devices) // a.tp)
            ps.ctx_tokens[tid] = [0] * (len(a.devices) // a.tp)
        self.executor.launch(a)
        return 1

    # ------------------------------------------------------------------ notifications
    def _handle(self, note: Notification) -> None:
        if isinstance(note, RankProgress):
            ps = self._pipe_of(note.task_id)
            counts = ps.unfinished.get(note.task_id)
            if counts is not None and note.rank < len(counts):
                counts[note.rank] = note.unfinished
                ps.ctx_tokens[note.task_id][note.rank] = note.ctx_tokens
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
        ps.ctx_tokens.pop(note.task_id, None)
        self.state.release(note.task_id)
        if note.stage in MEMORY_MOVES:
            return
        ps.done.setdefault(note.step, set()).add(note.stage)
        timings = ps.stage_s.setdefault(note.step, {})
        timings[TIMING_KEY.get(note.stage, note.stage)] = note.time_s - task.start_s
        if note.stage == Stage.ROLLOUT:
            self.state.observe_rollout(note.pipeline, note.step, note.prompt_tokens,
                                       note.response_tokens)
        if ps.done[note.step] >= set(stage_sequence(ps.res.spec)):
            self._step_finished(ps, note.step, note.time_s)

    def _step_finished(self, ps: PipelineState, step: int, now: float) -> None:
        start = ps.step_start_s.pop(step)
        ps.sync_end_s[step] = now
        ps.sync_end_s.pop(step - 8, None)
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

    def _progress_wakes(self, notes: list[Notification]) -> bool:
        """Does any rollout that reported progress, with its counts now, wake the policy?"""
        for tid in dict.fromkeys(n.task_id for n in notes if isinstance(n, RankProgress)):
            ps = self._pipe_of(tid)
            task, counts = ps.running.get(tid), ps.unfinished.get(tid)
            if task is not None and counts is not None and self.policy.wakes_on_progress(
                    task, counts):
                return True
        return False

    # ------------------------------------------------------------------ helpers
    def _pipe_of(self, tid: str) -> PipelineState:
        return self.state.pipes[tid.split("/", 1)[0]]

    def _stall_message(self) -> str:
        live = {n: p for n, p in self.state.pipes.items() if p.failed is None}
        todo = {n: p.view().ready() for n, p in live.items()}
        waiting = sorted(t for p in live.values() for t in p.running)
        # Tasks still running here while the executor runs nothing: it lost them (neither done
        # nor failed), which is the executor's bug, not the policy's.
        lost = f"; tasks the executor no longer runs: {waiting}" if waiting else ""
        return (f"policy {self.policy.name!r} started nothing at "
                f"t={self.executor.now_s:.1f}s while nothing runs; ready work: {todo}{lost}")


def tp_groups(per_node: int, devices: tuple[int, ...], tp: int) -> list[tuple[int, ...]] | None:
    """``devices`` cut into groups of ``tp``; None unless they are whole groups (at least one),
    each within a node of ``per_node`` devices."""
    groups = [devices[i:i + tp] for i in range(0, len(devices), tp)]
    if not devices or len(devices) % tp or any(len({d // per_node for d in g}) > 1
                                                for g in groups):
        return None
    return groups
