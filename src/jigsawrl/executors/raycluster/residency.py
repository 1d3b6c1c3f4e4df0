"""Where each pipeline's train state lives in a real run: on one device's worker, or in host
memory (the Ray object store).

What: :class:`Residency` moves a train state for real — ``offload`` (device -> host) and
``onload`` (host -> device), as the scheduler's memory moves or on the executor's own when a
stage runs on a device that does not hold its state (through host memory) — keeps each device
within its memory budget (a device over it first offloads its least recently used other train
states, each a real, measured move) and records every move's bytes and seconds (``moves``, the
run summary's ``memory_moves``).
"""

from __future__ import annotations

import logging
from typing import Any

from jigsawrl.driver.protocol import TaskDone
from jigsawrl.executors.raycluster.messages import MoveResult, StageRequest
from jigsawrl.executors.raycluster.records import Call, CallKind, Pipe, RunState
from jigsawrl.scheduler.base import StartStage
from jigsawrl.stages import Stage

log = logging.getLogger(__name__)


class Residency:
    """The train states' placement (see the module docstring)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.moves: list[dict[str, Any]] = []  # measured offload/onload: bytes, seconds

    def holder(self, pipeline: str) -> int | None:
        """The device holding ``pipeline``'s train state (None: host memory)."""
        return self.state.pipes[pipeline].loc

    # ------------------------------------------------------------------ the scheduler's moves
    def launch_offload(self, pipe: Pipe, a: StartStage, tid: str) -> None:
        if pipe.loc is None:
            self.state.instant.append(TaskDone(tid, pipe.name, a.step, a.stage,
                                               self.state.now_s))
            return
        self.offload(pipe, step=a.step, stage=a.stage, tid=tid)

    def launch_onload(self, pipe: Pipe, a: StartStage, tid: str) -> None:
        """Onload onto the listed device holding the fewest train states (a stage on several
        devices later runs where the state is, data-parallel over the others)."""
        devs = self.state.devs
        target = min(a.devices or (0,), key=lambda d: (sum(devs[d].resident.values()), d))
        if pipe.loc is not None:
            self.state.instant.append(TaskDone(tid, pipe.name, a.step, a.stage,
                                               self.state.now_s))
            return
        host = self.move_to(pipe, target)
        info = devs[target].actor.onload.remote(pipe.name, host)
        self.state.track(info, Call(CallKind.STAGE, pipe.name, a.step, a.stage, (target,), 0.0,
                                    tid, worker=target))

    # ------------------------------------------------------------------ moves
    def offload(self, pipe: Pipe, *, step: int = -1, stage: str = Stage.OFFLOAD,
                tid: str | None = None) -> None:
        """Submit the offload of ``pipe``'s train state from its device: a task's call when
        ``tid`` is given, else a move of the executor's own."""
        assert pipe.loc is not None
        where = pipe.loc
        dev = self.state.devs[where]
        # Nothing of this pipeline queued or running there: the offload runs in the worker's
        # "control" group, beside whatever another pipeline runs there, instead of behind it
        # (a log-prob moving to an idle device waited 0.5 s for another pipeline's update).
        group = "control" if not self.busy_on(pipe.name, where) else None
        info, host = dev.actor.offload.options(num_returns=2,
                                               concurrency_group=group).remote(pipe.name)
        dev.resident.pop(pipe.name, None)
        pipe.loc, pipe.host_ref = None, host
        kind = CallKind.MOVE if tid is None else CallKind.STAGE
        self.state.track(info, Call(kind, pipe.name, step, stage, (), 0.0, tid, worker=where,
                                    host=host, mark=len(pipe.replay)))

    def rebuild(self, pipe: Pipe, device: int) -> int:
        """Rebuild ``pipe``'s train state, lost with a dead worker, on ``device``'s (new)
        worker: its restore point (the host copy of its start or last offload) onloaded, then
        every model pass run on it since replayed with the same inputs. Returns the passes
        replayed."""
        pipe.loc, pipe.host_ref = None, pipe.restore_ref
        pipe.replay = [e for e in pipe.replay if e.done]
        pipe.epoch += 1
        host = self.move_to(pipe, device)
        passes = [(StageRequest(pipe.name, e.stage, e.step, 1), e.trajs, e.rewards)
                  for e in pipe.replay]
        synced = tuple(sorted({e.step for e in pipe.replay if e.step not in pipe.trajs}))
        info = self.state.devs[device].actor.rebuild.remote(pipe.name, host, passes, synced)
        self.state.track(info, Call(CallKind.MOVE, pipe.name, -1, Stage.ONLOAD, (device,), 0.0,
                                    worker=device))
        return len(passes)

    def busy_on(self, name: str, device: int) -> bool:
        """Whether a call of pipeline ``name`` is queued or running on ``device``'s worker."""
        return any(c.pipeline == name and (device in c.devices or device in c.helpers)
                   for c in self.state.calls.values())

    def move_to(self, pipe: Pipe, target: int) -> Any:
        """Make ``target`` the train state's device; the host state to onload there, or None
        when it is already there. A device over its memory budget first offloads its least
        recently used other train states (each a real, measured move)."""
        dev = self.state.devs[target]
        if pipe.loc == target:
            dev.resident[pipe.name] = dev.resident.pop(pipe.name)  # most recently used
            return None
        if pipe.loc is not None:  # on another device: through host memory
            self.offload(pipe)
        budget = self.state.settings.mem_budget
        while dev.resident and sum(dev.resident.values()) + pipe.state_bytes > budget:
            victim = self.state.pipes[next(iter(dev.resident))]
            log.info("device %d over its %.2f GB budget: offloading %s", target, budget / 1e9,
                     victim.name)
            self.offload(victim)
        dev.resident[pipe.name] = pipe.state_bytes
        pipe.loc = target
        return pipe.host_ref

    # ------------------------------------------------------------------ results
    def move_done(self, call: Call, res: MoveResult) -> None:
        """A move of the executor's own returned."""
        self.state.span(call, call.stage, res, share=0.0)
        self.record(call, res)

    def record(self, call: Call, res: MoveResult) -> None:
        pipe = self.state.pipes[call.pipeline]
        pipe.state_bytes = res.state_bytes
        if call.host is not None and call.epoch == pipe.epoch:  # an offload: the restore point
            pipe.restore_ref = call.host
            del pipe.replay[:call.mark]
        self.moves.append({"pipeline": call.pipeline, "stage": str(call.stage),
                           "bytes": res.state_bytes, "seconds": res.seconds})
