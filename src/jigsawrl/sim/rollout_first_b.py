"""AReaL's first-B batches in the rollout runtime: cut a rollout when its pipeline's first
``batch_size`` groups finished, and carry its unfinished requests into the next rollout.

The bookkeeping of the queue is :class:`~.batching.FirstBatches`; this mixin is what the
runtime does with it (see :mod:`.batching` for the model). Cuts run as their own event at the
instant a group completes, never inside a rank's own segment bookkeeping.
"""

from __future__ import annotations

import logging

from jigsawrl.events import Event, SampleFinished
from jigsawrl.sim.batching import Finished, FirstBatches
from jigsawrl.sim.kernel import PRIO_WAKE, EventQueue
from jigsawrl.sim.rollout import ReqRun
from jigsawrl.sim.rollout_state import RankRun, RolloutTask
from jigsawrl.workload.requests import RequestTruth

log = logging.getLogger(__name__)


class FirstBatchMixin:
    """First-B batches for :class:`~.rollout_task.RolloutRuntime` (module docstring)."""

    q: EventQueue
    events: list[Event]
    tasks: dict[str, RolloutTask]
    first_batches: dict[str, FirstBatches]  # per pipeline (first-B rollouts)
    _parked: dict[str, list[RolloutTask]]  # cut first-B rollouts holding leftovers
    _cut_due: set[str]

    def _drain_rank(self, task: RolloutTask, rank: RankRun) -> list[ReqRun]: ...
    def _close_span(self, task: RolloutTask, rank: RankRun, now: float) -> None: ...
    def _set_demand(self, task: RolloutTask, rank: RankRun, demand: float) -> None: ...
    def _replan(self, task: RolloutTask, rank: RankRun) -> None: ...
    def _report_done(self, task: RolloutTask, samples: list[RequestTruth]) -> None: ...
    def _ungate(self, task: RolloutTask, rank: RankRun) -> None: ...

    def _first_b_started(self, task: RolloutTask, reqs: list[RequestTruth]) -> None:
        """A first-B rollout started: track its groups, take over parked leftovers."""
        name = task.pipe.spec.name
        fb = self.first_batches.setdefault(name, FirstBatches(task.pipe.spec.batch_size))
        fb.groups.expect(reqs)
        for old in self._parked.pop(name, []):
            self._hand_over(old, task)
        self._due_cut(name)

    def _first_b_finished(self, task: RolloutTask, f: Finished) -> None:
        """A sample of a first-B rollout finished (it is recorded when it joins a batch)."""
        self.first_batches[task.pipe.spec.name].add(f)
        self._due_cut(task.pipe.spec.name)

    def _due_cut(self, pipeline: str) -> None:
        """Cut a batch after the current event (never inside a rank's own bookkeeping)."""
        if pipeline not in self._cut_due and self.first_batches[pipeline].full():
            self._cut_due.add(pipeline)
            self.q.schedule(self.q.now_s, (self._on_cut, pipeline), PRIO_WAKE)

    def _on_cut(self, pipeline: str) -> None:
        """The oldest first-B rollouts of ``pipeline`` take their batches while there are
        enough finished groups; each one's leftovers go to the next running rollout."""
        self._cut_due.discard(pipeline)
        fb = self.first_batches[pipeline]
        while fb.full():
            running = sorted((t for t in self.tasks.values()
                              if t.first_b and t.pipe.spec.name == pipeline),
                             key=lambda t: t.step)
            if not running:
                return
            task = running[0]
            self._close_first_b(task)
            if len(running) > 1:
                self._hand_over(task, running[1])
            else:
                self._parked.setdefault(pipeline, []).append(task)
            self._finish_batch(task, fb.take())

    def _close_first_b(self, task: RolloutTask) -> None:
        """Stop a cut rollout's ranks; their unfinished requests wait in their queues."""
        task.closed = True
        now = self.q.now_s
        for rank in task.ranks:
            if rank.redirect is not None:
                continue
            rank.inst.add_runs(self._drain_rank(task, rank))
            self._close_span(task, rank, now)
            self._set_demand(task, rank, 0.0)
            self._ungate(task, rank)

    def _hand_over(self, old: RolloutTask, new: RolloutTask) -> None:
        """Move a cut rollout's unfinished requests (and its tool waits) into ``new``."""
        moved = 0
        for rank in old.ranks:
            if rank.redirect is not None:
                continue
            _, runs = rank.inst.export_unfinished(None, self.q.now_s)
            dst = min(new.ranks, key=lambda rk: (rk.inst.unfinished, rk.index))
            dst.inst.add_runs(runs)
            dst.inst.tool_waiting += rank.inst.tool_waiting
            rank.inst.tool_waiting = 0
            rank.redirect = dst
            moved += len(runs)
            self._replan(new, dst)
        log.debug("%s: %d unfinished requests carried into %s", old.tid, moved, new.tid)

    def _finish_batch(self, task: RolloutTask, batch: list[Finished]) -> None:
        """A first-B rollout is done with ``batch``: record its samples and report it."""
        del self.tasks[task.tid]
        for f in batch:
            t = f.truth
            self.events.append(SampleFinished(
                task.pipe.spec.name, task.step, t.sample_id, f.time_s, t.prompt_tokens,
                t.response_tokens, len(t.turns), f.ran_in_step))
        self._report_done(task, [f.truth for f in batch])
