"""What a real run does when a worker call fails: a remote error fails only its pipeline; a dead
device worker is replaced on the same bundle and what it held is recovered or failed.

What happens when a device worker dies (:meth:`Recovery.device_died`):

- a new worker starts on the dead one's bundle;
- each pipeline whose train state was on it (or was being offloaded from it) has it rebuilt on
  the new worker: its restore point — the host copy in the object store from its start or its
  last offload that returned — is onloaded and every model pass run on it since is replayed
  with the same inputs (driver-owned refs), then the tasks that died with the worker, and every
  task of that pipeline that took the lost state as input, are launched again (a call
  submitted before the rebuild that fails later is relaunched too: ``Pipe.epoch``);
  ``recovered`` counts the states restored, the passes replayed and the tasks relaunched;
- the other rollout slices that were queued or running on it died with it; the requests of every
  rank it ran go to a live rank of the same rollout (or the same rank, on the new worker):
  resumed from their latest checkpoints, or regenerated from their prompts
  (:meth:`~jigsawrl.executors.raycluster.slices.Rollouts.redispatch`).

Every rank of a failed call is no longer in flight (``RunState.untrack``), so a rollout whose
only rank was the failed slice's is resubmitted rather than left waiting on a dead call — a
rollout that neither finishes nor fails would stall the driver.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from jigsawrl.driver.protocol import TaskFailed
from jigsawrl.executors.raycluster.fleet import Fleet, first_line
from jigsawrl.executors.raycluster.records import Call, CallKind, Pipe, RunState
from jigsawrl.executors.raycluster.residency import Residency
from jigsawrl.executors.raycluster.slices import Rollouts
from jigsawrl.scheduler.base import task_id
from jigsawrl.stages import Stage

log = logging.getLogger(__name__)


class Recovery:
    """Failed calls and dead workers (see the module docstring).

    ``relaunch`` launches a driver action again (the executor's ``launch``): the tasks a dead
    worker took with it run again once their pipeline's train state is rebuilt."""

    def __init__(self, state: RunState, fleet: Fleet, rollouts: Rollouts, residency: Residency,
                 relaunch: Callable[[Any], None]) -> None:
        self.state = state
        self.fleet = fleet
        self.rollouts = rollouts
        self.residency = residency
        self.relaunch = relaunch
        rollouts.recovered.update(train_states_restored=0, passes_replayed=0,
                                  tasks_relaunched=0)

    def failed(self, call: Call, exc: BaseException) -> None:
        """``call`` raised ``exc`` (a remote error, or its worker died)."""
        died = call.worker is not None and not self.fleet.alive(call.worker)
        if call.kind == CallKind.TAIL:  # in-tail log-probs: the pass after computes its rows
            log.warning("%s/%d: in-tail log-probs on device %s failed (%s: %s)", call.pipeline,
                        call.step, call.worker, type(exc).__name__, first_line(exc))
            self.rollouts.tail.lost(call)
            if died:
                assert call.worker is not None
                self.device_died(call.worker, None)
            return
        if died:
            assert call.worker is not None
            self.device_died(call.worker, call)
            return  # its requests were re-dispatched, its task relaunched or its pipeline failed
        sources = self.rollouts.retry_lost_exports(call) if call.kind == CallKind.CHUNK else None
        if sources is not None:
            # a migration's source died: its requests resume from their snapshots, and its
            # worker is replaced now (the source rank may have no call left to notice it).
            # The cause is logged: an export can also fail on a live worker (until 2026-12-07
            # every one did — an AttributeError in the worker's export — and each migration's
            # requests were regenerated from their prompts unnoticed), and only the error says
            # why.
            log.warning("%s/%d/%s: a slice took in a migration's export that failed (%s: %s); "
                        "source device(s) %s", call.pipeline, call.step, call.stage,
                        type(exc).__name__, first_line(exc), list(sources))
            for index in sources:
                if not self.fleet.alive(index):
                    self.device_died(index, None)
            return
        pipe = self.state.pipes[call.pipeline]
        if call.epoch < pipe.epoch and call.action is not None and pipe.lost is None:
            # submitted before its train state was rebuilt (it took the lost state as input)
            self._relaunch([call])
            return
        error = f"{type(exc).__name__}: {first_line(exc)}"
        log.error("%s/%d/%s failed: %s", call.pipeline, call.step, call.stage, error)
        self.fail_pipeline(call.pipeline, call.step, call.stage, error)

    def fail_pipeline(self, name: str, step: int, stage: str, error: str) -> None:
        """Stop pipeline ``name``: forget its calls and rollouts and tell the driver (once)."""
        pipe = self.state.pipes[name]
        pipe.lost = pipe.lost or error
        self.state.drop(lambda c: c.pipeline == name)
        self.rollouts.drop(name)
        if pipe.reported:
            return
        pipe.reported = True
        self.state.notes.append(TaskFailed(task_id(name, step, stage), name, step, stage,
                                           self.state.now_s, error))

    def device_died(self, index: int, failing: Call | None) -> None:
        """Device ``index``'s worker died while running ``failing`` (None: found dead by a call
        that took its output) (see the module docstring).

        Its other calls are dropped; every train state it held, or was offloading, is rebuilt
        on the new worker (:meth:`Residency.rebuild`) and the tasks it ran (and every other
        task of those pipelines that took the lost state) are launched again, in submission
        order; its rollout slices' requests go on elsewhere."""
        old = self.fleet.replace(index)
        lost = [*([failing] if failing is not None else []),
                *self.state.drop(lambda c: c.worker == index and c.kind != CallKind.CHUNK)]
        hit = set(old.resident) | {c.pipeline for c in lost
                                   if c.host is not None and c.epoch == self._epoch(c)}
        for name in sorted(hit):
            pipe = self.state.pipes[name]
            if pipe.lost is not None or pipe.restore_ref is None:
                self._lose(pipe, index, failing)
                continue
            lost += self.state.drop(lambda c, n=name: c.pipeline == n
                                    and c.kind != CallKind.CHUNK and c.worker is not None)
            replayed = self.residency.rebuild(pipe, index)
            self.rollouts.recovered["train_states_restored"] += 1
            self.rollouts.recovered["passes_replayed"] += replayed
            log.warning("%s: train state rebuilt on device %d's new worker from its host copy "
                        "and %d replayed passes", name, index, replayed)
        self.state.drop(lambda c: c.kind == CallKind.CHUNK and c.worker == index)
        self._relaunch([c for c in lost if c.kind != CallKind.CHUNK])
        self.rollouts.redispatch_device(index)

    def _epoch(self, call: Call) -> int:
        return self.state.pipes[call.pipeline].epoch

    def _relaunch(self, calls: list[Call]) -> None:
        """Launch the tasks of ``calls`` again (each once, in submission order)."""
        seen: set[str] = set()
        for call in sorted(calls, key=lambda c: c.seq):
            if call.tid is None or call.action is None or call.tid in seen:
                continue
            seen.add(call.tid)
            if self.state.pipes[call.pipeline].lost is not None:
                continue
            self.rollouts.recovered["tasks_relaunched"] += 1
            log.warning("%s relaunched after a worker died", call.tid)
            self.relaunch(call.action)

    def _lose(self, pipe: Pipe, index: int, failing: Call | None) -> None:
        """``pipe``'s train state died with device ``index``'s worker and cannot be rebuilt."""
        pipe.loc = None
        pipe.lost = pipe.lost or (f"its train state was on device {index}, whose worker died; "
                                  "rerun with --resume to continue from the last checkpoint")
        task = self._task_in_flight(pipe.name, failing)
        if task is not None:
            self.fail_pipeline(pipe.name, *task, pipe.lost)

    def _task_in_flight(self, name: str, failing: Call | None) -> tuple[int, str] | None:
        """``(step, stage)`` of pipeline ``name``'s earliest task in flight, if any."""
        calls = [*([failing] if failing is not None else []), *self.state.calls.values()]
        tasks = [(c.step, c.stage) for c in calls if c.pipeline == name and c.tid is not None]
        tasks += [(ro.step, Stage.ROLLOUT) for ro in self.rollouts.running(name)]
        return min(tasks, key=lambda t: t[0]) if tasks else None
