"""Bookkeeping of real rollouts on device workers: ranks, request ownership, dispatch.

What: a rollout of ``n`` requests runs on ``R`` ranks (one device worker each; a rank of a
``tp > 1`` rollout runs on its first device with ``tp`` devices' threads). The executor tracks,
per request *index* (position in the step's request list, groups contiguous), which rank owns
it until its trajectory comes back, and the latest checkpoint of each unfinished request (a
worker's ``RolloutSession.snapshot``), so that a migration moves ownership, a dead worker's
requests resume elsewhere from their checkpoints (or are regenerated when they have none), and
the finished trajectories are reassembled in index order (GRPO groups in order) with none lost
or duplicated.

Why indices and not ids: a request is rebuilt from ``(seed, step, index)`` on any worker, so
re-dispatching a request that has no checkpoint after a worker death needs only the index (the
regenerated request samples from the same seeded generator).

Plain Python: no ray import (unit-tested on its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def dispatch(n: int, group_size: int, num_ranks: int, how: str,
             prompt_lengths: list[int] | None = None) -> list[list[int]]:
    """Split request indices ``0..n-1`` over ranks, keeping GRPO groups together.

    ``contiguous`` (verl): equal contiguous runs of groups. ``skew_aware`` (StreamRL's
    length-ranked dispatch): groups ordered by predicted length, dealt longest-first to the
    least-loaded rank. SIMPLIFICATION: the real ranker is a trained model; here the predictor is
    the prompt length (longer prompt, longer answer on these tasks), given as
    ``prompt_lengths`` (one per request); without it, groups are dealt round-robin.
    """
    groups = [list(range(i, min(n, i + group_size))) for i in range(0, n, group_size)]
    out: list[list[int]] = [[] for _ in range(num_ranks)]
    if how == "skew_aware":
        if prompt_lengths:
            groups.sort(key=lambda g: -prompt_lengths[g[0]])
        load = [0] * num_ranks
        for g in groups:
            r = min(range(num_ranks), key=lambda k: (load[k], k))
            out[r].extend(g)
            load[r] += (prompt_lengths[g[0]] if prompt_lengths else 1) * len(g)
        return [sorted(x) for x in out]
    per, extra = divmod(len(groups), num_ranks)
    start = 0
    for r in range(num_ranks):
        take = per + (1 if r < extra else 0)
        for g in groups[start:start + take]:
            out[r].extend(g)
        start += take
    return out


@dataclass(eq=False)
class RankRT:
    """One rank of a running rollout."""

    index: int
    devices: tuple[int, ...]
    share: float
    fresh: list[int] = field(default_factory=list)  # indices to start on the next slice
    incoming: list[Any] = field(default_factory=list)  # export refs migrated here
    inflight: Any = None  # ObjectRef of the running slice
    timer_at: float | None = None  # next slice after a tool wait (executor clock)
    done: bool = False
    migrate_to: int | None = None  # a source rank of a migration: stops after this slice
    checkpoint_at: float = 0.0  # executor clock of the last slice asked for a checkpoint
    force_reload: bool = False  # AReaL interrupt: reload weights at the next slice
    unfinished: int = -1  # last reported

    @property
    def device(self) -> int:
        return self.devices[0]


@dataclass(eq=False)
class RolloutRT:
    """A running rollout: its ranks, who owns which request, what came back."""

    tid: str
    pipeline: str
    step: int
    num_requests: int
    ranks: list[RankRT]
    owner: dict[int, int] = field(default_factory=dict)  # request index -> rank index
    results: dict[int, tuple[Any, int]] = field(default_factory=dict)  # index -> (traj, version)
    # index -> (ExportedRequest, weights version): latest checkpoint of an unfinished request
    checkpoints: dict[int, tuple[Any, int]] = field(default_factory=dict)

    def assign(self, rank: int, indices: list[int]) -> None:
        for i in indices:
            self.owner[i] = rank
        self.ranks[rank].fresh.extend(indices)

    def finished(self, index: int, traj: Any, version: int) -> bool:
        """Record a trajectory; False (and ignored) if that index already came back."""
        if index in self.results:
            return False
        self.results[index] = (traj, version)
        self.owner.pop(index, None)
        self.checkpoints.pop(index, None)
        return True

    def keep_checkpoint(self, index: int, item: Any, version: int) -> None:
        """Keep ``item`` (an ``ExportedRequest``) as the request's latest checkpoint.

        A request that already finished keeps none; an older snapshot arriving late (results
        of two ranks read in one batch, after a migration) does not replace a newer one: the
        output of a request only grows, so its length orders its snapshots.
        """
        if index in self.results:
            return
        old = self.checkpoints.get(index)
        if old is None or len(item.state.output_ids) >= len(old[0].state.output_ids):
            self.checkpoints[index] = (item, version)

    def recover(self, dead: int, target: int) -> tuple[list[tuple[Any, int]], list[int]]:
        """Ownership of the unfinished requests of rank ``dead`` (its worker died) goes to
        ``target``. Returns ``(resume, fresh)``: the ``(ExportedRequest, version)`` checkpoints to
        resume there, and the indices that have none (added to ``target``'s fresh requests, to
        be regenerated from their prompts). The checkpoints are kept: if ``target`` dies too
        before taking newer ones, they are still the latest state."""
        lost = self.owned_by(dead)
        resume = [self.checkpoints[i] for i in lost if i in self.checkpoints]
        fresh = [i for i in lost if i not in self.checkpoints]
        for i in lost:
            self.owner[i] = target
        self.ranks[target].fresh.extend(fresh)
        return resume, fresh

    def owned_by(self, rank: int) -> list[int]:
        return sorted(i for i, r in self.owner.items() if r == rank)

    def move(self, src: int, dst: int) -> int:
        """Ownership of ``src``'s unfinished requests goes to ``dst``; how many moved."""
        moved = self.owned_by(src)
        for i in moved:
            self.owner[i] = dst
        return len(moved)

    @property
    def complete(self) -> bool:
        return len(self.results) == self.num_requests and all(r.done for r in self.ranks)

    def ordered(self) -> list[tuple[Any, int]]:
        return [self.results[i] for i in range(self.num_requests)]


def request_index(request_id: str) -> tuple[int, int]:
    """``(prompt, sample)`` of a request id ``"{pipeline}/{step}/{prompt}/{sample}"``."""
    parts = request_id.rsplit("/", 2)
    return int(parts[1]), int(parts[2])


def request_row(request_id: str, group_size: int) -> int:
    """The batch row of a request id (``prompt * group_size + sample``): how the executor
    numbers a rollout's requests."""
    prompt, sample = request_index(request_id)
    return prompt * group_size + sample


def shard_bounds(num_rows: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` row ranges of ``num_shards`` near-equal shards (the rows of
    a data-parallel log-prob or update stage, one shard per worker)."""
    base, extra = divmod(num_rows, num_shards)
    out, start = [], 0
    for i in range(num_shards):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out
