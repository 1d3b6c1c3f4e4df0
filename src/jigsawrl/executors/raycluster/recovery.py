"""What a real run does when a worker call fails: a remote error fails only its pipeline; a dead
device worker is replaced on the same bundle and what it held is recovered or lost.

What happens when a device worker dies (:meth:`Recovery.device_died`):

- a new worker starts on the dead one's bundle;
- each pipeline whose train state was on it is lost: its next task fails with a clear error
  (``--resume`` restarts it from its last checkpoint);
- the other rollout slices that were queued or running on it died with it; the requests of every
  rank it ran go to a live rank of the same rollout (or the same rank, on the new worker):
  resumed from their latest checkpoints, or regenerated from their prompts
  (:meth:`~jigsawrl.executors.raycluster.slices.Rollouts.redispatch`).
"""

from __future__ import annotations

import logging

from jigsawrl.driver.protocol import TaskFailed
from jigsawrl.executors.raycluster.fleet import Fleet, first_line
from jigsawrl.executors.raycluster.records import Call, CallKind, RunState
from jigsawrl.executors.raycluster.slices import Rollouts
from jigsawrl.scheduler.base import task_id

log = logging.getLogger(__name__)


class Recovery:
    """Failed calls and dead workers (see the module docstring)."""

    def __init__(self, state: RunState, fleet: Fleet, rollouts: Rollouts) -> None:
        self.state = state
        self.fleet = fleet
        self.rollouts = rollouts

    def failed(self, call: Call, exc: BaseException) -> None:
        """``call`` raised ``exc`` (a remote error, or its worker died)."""
        died = bool(call.devices) and not self.fleet.alive(call.devices[0])
        if died:
            self.device_died(call.devices[0])
            if call.kind == CallKind.CHUNK:
                return  # its requests were re-dispatched
        error = f"{type(exc).__name__}: {first_line(exc)}"
        log.error("%s/%d/%s failed: %s", call.pipeline, call.step, call.stage, error)
        self.fail_pipeline(call.pipeline, call.step, call.stage, error)

    def fail_pipeline(self, name: str, step: int, stage: str, error: str) -> None:
        """Stop pipeline ``name``: forget its calls and rollouts and tell the driver."""
        pipe = self.state.pipes[name]
        pipe.lost = pipe.lost or error
        self.state.drop(lambda c: c.pipeline == name)
        self.rollouts.drop(name)
        self.state.notes.append(TaskFailed(task_id(name, step, stage), name, step, stage,
                                           self.state.now_s, error))

    def device_died(self, index: int) -> None:
        """Device ``index``'s worker died (see the module docstring)."""
        old = self.fleet.replace(index)
        for name in old.resident:
            pipe = self.state.pipes[name]
            pipe.loc = None
            pipe.lost = (f"its train state was on device {index}, whose worker died; rerun "
                         "with --resume to continue from the last checkpoint")
        self.state.drop(lambda c: c.kind == CallKind.CHUNK and c.worker == index)
        self.rollouts.redispatch_device(index)
