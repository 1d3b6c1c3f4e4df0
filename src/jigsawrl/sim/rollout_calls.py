"""What a rollout rank waits for its calls on a worker pool (mixed into ``RolloutRuntime``).

On the Ray executor a rank's work is a series of calls on its device's worker: the first slice
also builds a fresh engine with the step's weights (``CostParams.rollout_setup_s``), and every
call waits for the driver's round trip (``stage_gap_s``, :mod:`jigsawrl.experiments.stage_gap`):
the first slice, each later slice (:mod:`.rollout_gates`), and each resume after tool waits or
after yielding to another call. Here those waits are added to the rank's segments; with both
parameters 0 (the GPU presets) nothing changes. The worker computes on a host it shares with
the pool's other workers and the rest of the run: a segment runs at the host's slowdown
(:mod:`.hostload`), re-timed when it changes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.sim.gates import DeviceGates
from jigsawrl.sim.hostload import HostLoad
from jigsawrl.sim.kernel import PRIO_FINISH, EventQueue
from jigsawrl.sim.residency import worker_param
from jigsawrl.sim.rollout import Segment
from jigsawrl.sim.rollout_state import RankRun, RolloutTask
from jigsawrl.stages import Stage


class WorkerCallsMixin:
    """The waits of a rank's worker calls (module docstring)."""

    q: EventQueue
    gates: DeviceGates | None
    host: HostLoad | None
    tasks: dict[str, RolloutTask]
    gap_s: float
    setup_s: float

    if TYPE_CHECKING:  # provided by RolloutRuntime (see rollout_gates.py on stubs in mixins)
        def _on_segment_end(self, task: RolloutTask, rank: RankRun) -> None: ...

    def _init_calls(self, cost: CostModelProtocol, host: HostLoad | None) -> None:
        """The wait for each call on a worker, a rank's set-up after its first one, and the
        host's load (None: not modelled)."""
        self.host = host
        self.gap_s = worker_param(cost, "stage_gap_s")
        self.setup_s = worker_param(cost, "rollout_setup_s") + self.gap_s

    def _with_call_waits(self, rank: RankRun, seg: Segment, rate: float) -> Segment:
        """``seg``, later by the set-up of its rank's first slice and the waits of the calls
        it resumes in."""
        extra = 0.0
        if rank.setup_due:  # a worker's fresh engine and requests first
            rank.setup_due = False
            extra += self.setup_s / rate
        if rank.wake_s:  # a regrouped rank's new engine (sim/rollout_regroup.py)
            extra += rank.wake_s
            rank.wake_s = 0.0
        if rank.calls_due:  # it resumes in a new call (after tools, after a yield)
            extra += rank.calls_due * self.gap_s
            rank.calls_due = 0
        return dataclasses.replace(seg, duration_s=seg.duration_s + extra) if extra else seg

    def _note_idle(self, rank: RankRun) -> None:
        """The rank has nothing to run but tool waits: on serial devices its call returns, and
        its resume is a call of its own (counted once per idle spell)."""
        if self.gates is not None and self.gap_s > 0 and (
                rank.open is None or rank.open.stage != Stage.TOOL_WAIT):
            rank.calls_due += 1

    def _host_timed(self, rank: RankRun, seg: Segment) -> Segment:
        """``seg`` at the host's slowdown on the rank's devices (recorded on the rank)."""
        rank.host_factor = 1.0 if self.host is None else self.host.factor(rank.devices)
        if rank.host_factor == 1.0:
            return seg
        return dataclasses.replace(seg, duration_s=seg.duration_s * rank.host_factor)

    def retime_host(self, nodes: set[int]) -> None:
        """Re-time the running segments on ``nodes``, whose busy devices changed: what is left
        of each runs at the host's new slowdown."""
        assert self.host is not None
        now = self.q.now_s
        for task in self.tasks.values():
            for rank in task.ranks:
                seg = rank.seg
                if seg is None or not self.host.on_nodes(rank.devices, nodes):
                    continue
                factor = self.host.factor(rank.devices)
                if abs(factor - rank.host_factor) <= 1e-12:
                    continue
                left = max(0.0, seg.start_s + seg.duration_s - now)
                self._stretch(task, rank, left * (factor / rank.host_factor - 1.0))
                rank.host_factor = factor

    def _stretch(self, task: RolloutTask, rank: RankRun, seconds: float) -> None:
        """The running segment ends ``seconds`` later, its work unchanged (a wait inside it:
        the executor's next slice call)."""
        seg = rank.seg
        assert seg is not None
        self.q.cancel(rank.entry)
        rank.seg = dataclasses.replace(seg, duration_s=seg.duration_s + seconds)
        rank.entry = self.q.schedule(seg.start_s + rank.seg.duration_s,
                                     (self._on_segment_end, task, rank), PRIO_FINISH)
