"""Sample-level batches: finished GRPO groups, and AReaL's first-B training batches.

The step graph batches by step: the training of step k reads the samples of step k's rollout.
Two peers batch finer, and this module is what the rollout runtime uses to model them:

- **Groups.** A GRPO advantage needs every response of its prompt, so the unit a trainer can take
  early is a finished *group* (:class:`GroupTracker`). StreamRL streams finished groups into its
  trainer (:mod:`.stream`); AReaL fills batches with them.
- **First-B batches** (:class:`FirstBatches`, AReaL). A pipeline's finished groups queue up in the
  order they finish, whatever rollout they came from; the oldest rollout still running takes the
  first ``batch_size`` of them as its training batch and is done. Its unfinished requests are
  carried over into the next rollout of the pipeline (they keep their sample ids and finish
  there, on the newer weights, re-prefilled), so a long-tail sample slips into a later batch
  instead of delaying this one. Groups finished beyond a batch wait for the next one. What is
  left when the run ends (unfinished requests, queued groups) is never trained, and its tokens
  are not counted: a finished sample is recorded (``SampleFinished``) when it joins a batch.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from jigsawrl.workload.requests import RequestTruth


def group_key(sample_id: str) -> str:
    """The prompt a sample answers: its id without the last part (``pipe/step/prompt/g``)."""
    return sample_id.rsplit("/", 1)[0]


@dataclass(frozen=True, slots=True)
class Finished:
    """One finished sample: its truth, when it finished, and the step whose rollout ran it last."""

    truth: RequestTruth
    time_s: float
    ran_in_step: int


class GroupTracker:
    """Collects finished samples until every response of their prompt has finished.

    Args:
        reqs: every request whose group is tracked (a group's size is its count here).
    """

    def __init__(self, reqs: Iterable[RequestTruth] = ()) -> None:
        self._size: Counter[str] = Counter()
        self._done: dict[str, list[Finished]] = {}
        self.expect(reqs)

    def expect(self, reqs: Iterable[RequestTruth]) -> None:
        """Track the groups of ``reqs`` too (a new rollout's batch)."""
        for r in reqs:
            self._size[group_key(r.sample_id)] += 1

    def add(self, f: Finished) -> list[Finished] | None:
        """Record ``f``; the whole group when this was its last response, else None."""
        key = group_key(f.truth.sample_id)
        members = self._done.setdefault(key, [])
        members.append(f)
        if len(members) < self._size[key]:
            return None
        del self._done[key], self._size[key]
        return members


@dataclass(slots=True)
class FirstBatches:
    """One pipeline's queue of finished groups, cut into first-B batches (module docstring).

    Args:
        batch_size: groups per training batch (the pipeline's prompts per step).
    """

    batch_size: int
    groups: GroupTracker = field(default_factory=GroupTracker)
    ready: deque[list[Finished]] = field(default_factory=deque)

    def add(self, f: Finished) -> None:
        """A sample finished; its group joins the queue when complete."""
        group = self.groups.add(f)
        if group is not None:
            self.ready.append(group)

    def full(self) -> bool:
        """True when a batch's worth of groups is queued."""
        return len(self.ready) >= self.batch_size

    def take(self) -> list[Finished]:
        """The first ``batch_size`` finished groups, flattened in sample-id order."""
        out = [f for _ in range(self.batch_size) for f in self.ready.popleft()]
        return sorted(out, key=lambda f: f.truth.sample_id)
