"""Rollout ranks on devices that run one call at a time (:mod:`.gates`): time slices.

A rank with something to run holds its devices' gates; it runs at the whole device (a CPU
worker's call gets the device's threads whatever its share) in slices of ``slice_s``, as the
Ray executor's ranks run in ``chunk_s`` slices, each a call of its own: every slice after the
first stretches the running segment by one stage gap (``CostParams.stage_gap_s``), and a resume
after tool waits or after yielding waits one before its next segment. When a slice ends and
another call waits on its
device, the rank stops after its current iteration (a prefill runs to its end first), gives the
gate back and queues behind that call; while nobody waits it goes on. A rank whose requests all
wait for tools gives its gate back until one is ready. While it waits for a gate its span is
closed: a waiting rank is not busy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jigsawrl.sim.gates import DeviceGates
from jigsawrl.sim.kernel import PRIO_FINISH, EventQueue
from jigsawrl.sim.rollout_state import RankRun, RolloutTask


class GatedRanksMixin:
    """Time slices of rollout ranks on gated devices (mixed into ``RolloutRuntime``)."""

    q: EventQueue
    gates: DeviceGates | None
    tasks: dict[str, RolloutTask]
    gap_s: float  # the wait for each call on a worker (CostParams.stage_gap_s)

    if TYPE_CHECKING:  # provided by RolloutRuntime (stubs only for the type checker: a stub
        # defined here would shadow the real method of a mixin later in the bases)
        def _plan_rank(self, task: RolloutTask, rank: RankRun) -> None: ...
        def _interrupt(self, task: RolloutTask, rank: RankRun) -> None: ...
        def _close_span(self, task: RolloutTask, rank: RankRun, now: float) -> None: ...
        def _set_demand(self, task: RolloutTask, rank: RankRun, demand: float) -> None: ...
        def _report_progress(self, task: RolloutTask, rank: RankRun) -> None: ...
        def _stretch(self, task: RolloutTask, rank: RankRun, seconds: float) -> None: ...

    def _rate(self, rank: RankRun) -> float:
        """The share a rank's segments run at: its own, or the whole device when gated."""
        return 1.0 if self.gates is not None else rank.share

    def _gated(self, task: RolloutTask, rank: RankRun) -> bool:
        """Whether the rank may plan a segment now (gated devices only). A rank with nothing to
        run may (it ends, waits for tools, and gives its gate back); one that holds its gate may
        unless its slice ended in a prefill and someone waits; else it asks for the gate and
        waits, its span closed."""
        gates = self.gates
        assert gates is not None
        key = (task.tid, rank.index)
        if not rank.inst.runnable:
            return True
        if gates.holds(key):
            if not rank.yield_due:
                return True
            rank.yield_due = False
            if not gates.waited_on(key):
                self._arm_slice(task, rank)
                return True
            self._ungate(task, rank)
        if self._ask(task, rank):  # free: run now (the grant delivered later finds it running)
            self._arm_slice(task, rank)
            return True
        return False

    def _ask(self, task: RolloutTask, rank: RankRun) -> bool:
        """Queue for the rank's gates; True when they are held at once, else the rank waits
        (its span closed: a waiting rank is not busy)."""
        assert self.gates is not None
        key = (task.tid, rank.index)
        self.gates.request(key, rank.devices, lambda: self._on_grant(task, rank))
        if self.gates.holds(key):
            return True
        self._close_span(task, rank, self.q.now_s)
        self._set_demand(task, rank, 0.0)
        self._report_progress(task, rank)
        return False

    def _on_grant(self, task: RolloutTask, rank: RankRun) -> None:
        if task.tid not in self.tasks or task.closed or rank.redirect is not None:
            self._ungate(task, rank)
            return
        if rank.seg is None:
            self._arm_slice(task, rank)
            self._plan_rank(task, rank)

    def _arm_slice(self, task: RolloutTask, rank: RankRun) -> None:
        assert self.gates is not None
        self.q.cancel(rank.slice_end)
        rank.slice_end = self.q.schedule(self.q.now_s + self.gates.slice_s,
                                         (self._on_slice_end, task, rank), PRIO_FINISH)

    def _on_slice_end(self, task: RolloutTask, rank: RankRun) -> None:
        """A slice ended: go on while nobody waits; else stop decoding (after a prefill) and
        queue behind the waiter."""
        rank.slice_end = None
        gates = self.gates
        assert gates is not None
        key = (task.tid, rank.index)
        if not gates.holds(key):
            return
        if not gates.waited_on(key):
            if self.gap_s > 0 and rank.seg is not None:  # the next slice is a call of its own
                self._stretch(task, rank, self.gap_s)
            self._arm_slice(task, rank)
            return
        if self.gap_s > 0:  # it yields: its resume after the waiter is a call of its own
            rank.calls_due += 1
        seg = rank.seg
        if seg is not None and not seg.iters:  # a prefill: it runs to its end first
            rank.yield_due = True
            return
        if seg is not None:
            self._interrupt(task, rank)  # keeps what the iterations so far produced
        self._ungate(task, rank)
        if rank.inst.runnable:
            self._ask(task, rank)  # behind the waiter
        else:
            self._plan_rank(task, rank)  # tool waits or done

    def _ungate(self, task: RolloutTask, rank: RankRun) -> None:
        """Give back the rank's gates (or stop waiting for them) and its slice timer."""
        if self.gates is None:
            return
        self.q.cancel(rank.slice_end)
        rank.slice_end = None
        rank.yield_due = False
        self.gates.release((task.tid, rank.index))
