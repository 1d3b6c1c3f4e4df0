"""What a real run does when a worker call fails: a remote error fails only its pipeline; a dead
device worker is replaced on the same bundle and what it held is recovered or failed.

What happens when a device worker dies (:meth:`Recovery.device_died`):

- a new worker starts on the dead one's bundle;
- each pipeline whose train state was on it fails now (the run summary names it; ``--resume``
  restarts it from its last checkpoint), with its calls and rollouts dropped; a pipeline with no
  task in flight fails at its next task instead;
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

from jigsawrl.driver.protocol import TaskFailed
from jigsawrl.executors.raycluster.fleet import Fleet, first_line
from jigsawrl.executors.raycluster.records import Call, CallKind, Pipe, RunState
from jigsawrl.executors.raycluster.slices import Rollouts
from jigsawrl.scheduler.base import task_id
from jigsawrl.stages import Stage

log = logging.getLogger(__name__)


class Recovery:
    """Failed calls and dead workers (see the module docstring)."""

    def __init__(self, state: RunState, fleet: Fleet, rollouts: Rollouts) -> None:
        self.state = state
        self.fleet = fleet
        self.rollouts = rollouts

    def failed(self, call: Call, exc: BaseException) -> None:
        """``call`` raised ``exc`` (a remote error, or its worker died)."""
        died = call.worker is not None and not self.fleet.alive(call.worker)
        if died:
            assert call.worker is not None
            self.device_died(call.worker, call)
            if call.kind == CallKind.CHUNK:
                return  # its requests were re-dispatched
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

    def device_died(self, index: int, failing: Call) -> None:
        """Device ``index``'s worker died while running ``failing`` (see the module docstring)."""
        old = self.fleet.replace(index)
        for name in old.resident:
            self._lose(self.state.pipes[name], index, failing)
        self.state.drop(lambda c: c.kind == CallKind.CHUNK and c.worker == index)
        self.rollouts.redispatch_device(index)

    def _lose(self, pipe: Pipe, index: int, failing: Call) -> None:
        """``pipe``'s train state died with device ``index``'s worker."""
        pipe.loc = None
        pipe.lost = pipe.lost or (f"its train state was on device {index}, whose worker died; "
                                  "rerun with --resume to continue from the last checkpoint")
        task = self._task_in_flight(pipe.name, failing)
        if task is not None:
            self.fail_pipeline(pipe.name, *task, pipe.lost)

    def _task_in_flight(self, name: str, failing: Call) -> tuple[int, str] | None:
        """``(step, stage)`` of pipeline ``name``'s earliest task in flight, if any."""
        calls = [failing, *self.state.calls.values()]
        tasks = [(c.step, c.stage) for c in calls if c.pipeline == name and c.tid is not None]
        tasks += [(ro.step, Stage.ROLLOUT) for ro in self.rollouts.running(name)]
        return min(tasks, key=lambda t: t[0]) if tasks else None
