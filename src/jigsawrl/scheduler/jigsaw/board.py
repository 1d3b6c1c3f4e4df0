"""The ``jigsaw`` policy's board: this decision's model of the pool.

Built from the view at every decision (:func:`build_board`) and updated as the decision
claims devices (rollout and compute starts, migrations), so that each choice sees the ones made
before it in the same decision; never kept between decisions. (:class:`BoardCache` builds it
once per placement of the running tasks and hands each decision a copy-on-write copy: many
decisions follow a progress report that moved no task, and the copy costs no scan of the pool.)
Only tasks that hold compute are on it: a rollout (kind ``memory``: memory-bound decode) on the
devices of its live ranks, a model pass (kind ``compute``) on its devices. Reward, weight sync and memory moves
(:data:`~jigsawrl.stages.HOST_STAGES`) hold no compute share and are left off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jigsawrl.scheduler.base import Migrate, Regroup, RunningTask, View
from jigsawrl.stages import HOST_STAGES, Stage

MEM_HEADROOM = 2e9  # bytes per device kept free (allocator fragmentation, CUDA context)
MEMORY = "memory"  # the kind of a rollout (memory-bound decode)
COMPUTE = "compute"  # the kind of a model pass (compute-bound)


@dataclass(slots=True)
class Board:
    """Who holds compute on which device, at what share, and the memory left per device.

    ``dev`` is changed only through the claiming methods, which also keep the counts the
    reading methods answer from (rollouts and passes per device, devices a rollout holds), so
    that no question scans the pool."""

    dev: list[dict[str, float]]  # device -> task id -> share (compute-holding tasks only)
    kind: dict[str, str] = field(default_factory=dict)  # task id -> memory | compute
    pipe: dict[str, str] = field(default_factory=dict)
    stage: dict[str, str] = field(default_factory=dict)
    ranks: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)  # live rollout ranks
    rank_idx: dict[str, list[int]] = field(default_factory=dict)
    mem_free: list[float] = field(default_factory=list)
    mem_on: list[int] = field(default_factory=list)  # device -> rollouts on it
    comp_on: list[int] = field(default_factory=list)  # device -> model passes on it
    n_comp: int = 0  # (pass, device) placements on the board
    mem_held: int = 0  # devices holding at least one rollout
    # Copy-on-write: the devices whose ``dev`` dict this board owns (None: all of them); a
    # copy shares the others with the board it was copied from.
    owned: set[int] | None = None
    token: Any = None  # the placement of running tasks this board was built from (caches)
    dirty: bool = False  # a claim or a release changed ``dev`` since it was built

    def __post_init__(self) -> None:
        if len(self.mem_on) == len(self.dev) and len(self.comp_on) == len(self.dev):
            return  # counts given (a copy)
        n = len(self.dev)
        self.mem_on, self.comp_on = [0] * n, [0] * n
        self.n_comp = self.mem_held = 0
        for d, tasks in enumerate(self.dev):
            for t in tasks:
                self._count(d, self.kind.get(t), +1)

    def copy(self) -> Board:
        """A board that starts equal to this one and changes alone (``dev`` copy-on-write)."""
        return Board(list(self.dev), dict(self.kind), dict(self.pipe), dict(self.stage),
                     dict(self.ranks), dict(self.rank_idx), list(self.mem_free),
                     list(self.mem_on), list(self.comp_on), self.n_comp, self.mem_held,
                     set(), self.token, self.dirty)

    def _own(self, d: int) -> dict[str, float]:
        owned = self.owned
        if owned is not None and d not in owned:
            self.dev[d] = dict(self.dev[d])
            owned.add(d)
        self.dirty = True
        return self.dev[d]

    def _count(self, d: int, kind: str | None, step: int) -> None:
        if kind == MEMORY:
            before = self.mem_on[d]
            self.mem_on[d] = before + step
            self.mem_held += (before == 0) - (before + step == 0)
        elif kind == COMPUTE:
            self.comp_on[d] += step
            self.n_comp += step

    def _put(self, d: int, tid: str, share: float) -> None:
        tasks = self._own(d)
        if tid not in tasks:  # _count(d, kind, +1), inlined (the board's hottest line)
            kind = self.kind[tid]
            if kind == MEMORY:
                before = self.mem_on[d]
                self.mem_on[d] = before + 1
                if before == 0:
                    self.mem_held += 1
            elif kind == COMPUTE:
                self.comp_on[d] += 1
                self.n_comp += 1
        tasks[tid] = share

    def _drop(self, d: int, tid: str) -> None:
        if tid in self.dev[d]:
            del self._own(d)[tid]
            self._count(d, self.kind.get(tid), -1)

    # ------------------------------------------------------------------ reading
    def count(self, d: int) -> int:
        """Tasks holding compute on device ``d``."""
        return len(self.dev[d])

    def has_compute(self, d: int) -> bool:
        return self.comp_on[d] > 0

    def mem_slots(self, d: int) -> int:
        """Rollout engines on device ``d`` (a compute stage does not take an engine slot)."""
        return self.mem_on[d]

    def max_mem_slots(self) -> int:
        """The most rollout engines on any one device."""
        return max(self.mem_on, default=0)

    def any_memory(self) -> bool:
        """Does a rollout hold any device?"""
        return self.mem_held > 0

    def any_compute(self) -> bool:
        """Does a model pass hold any device?"""
        return self.n_comp > 0

    def mem_frac(self) -> float:
        """The fraction of devices that a rollout holds (below 1 after a migration)."""
        n = len(self.dev)
        return self.mem_held / n if n else 1.0

    # ------------------------------------------------------------------ claiming
    def add_running(self, t: RunningTask) -> None:
        """Put a running task on the board (its live ranks only, for a rollout)."""
        if t.stage in HOST_STAGES:
            return
        self.pipe[t.task_id], self.stage[t.task_id] = t.pipeline, t.stage
        if t.stage == Stage.ROLLOUT:
            self.kind[t.task_id] = MEMORY
            live = [r for r, s in enumerate(t.rank_shares) if s > 0]
            self.ranks[t.task_id] = [t.rank_devices[r] for r in live]
            self.rank_idx[t.task_id] = live
            for r in live:
                share = t.rank_shares[r]
                for d in t.rank_devices[r]:
                    self._put(d, t.task_id, share)
        else:
            self.kind[t.task_id] = COMPUTE
            for d in t.devices:
                self._put(d, t.task_id, t.share)

    def claim_rollout(self, tid: str, pipeline: str, devs: list[int], tp: int,
                      need: float) -> None:
        """A rollout starting on ``devs`` (ranks of ``tp`` devices), ``need`` bytes per device;
        its share is assigned with the others' (:mod:`.shares`)."""
        self.kind[tid], self.pipe[tid], self.stage[tid] = MEMORY, pipeline, Stage.ROLLOUT
        self.ranks[tid] = [tuple(devs[i:i + tp]) for i in range(0, len(devs), tp)]
        self.rank_idx[tid] = list(range(len(self.ranks[tid])))
        for d in devs:
            self._put(d, tid, 0.0)
            self.mem_free[d] -= need

    def claim_compute(self, tid: str, pipeline: str, stage: str, devs: tuple[int, ...]) -> None:
        """A model pass starting on ``devs``; its share is assigned with the others'."""
        self.kind[tid], self.pipe[tid], self.stage[tid] = COMPUTE, pipeline, stage
        for d in devs:
            self._put(d, tid, 0.0)

    def release_ranks(self, m: Migrate) -> None:
        """A migration's source ranks leave their devices."""
        idx = self.rank_idx[m.task_id]
        for r in m.src_ranks:
            for d in self.ranks[m.task_id][idx.index(r)]:
                self._drop(d, m.task_id)
        keep = [i for i, r in enumerate(idx) if r not in m.src_ranks]
        self.ranks[m.task_id] = [self.ranks[m.task_id][i] for i in keep]
        self.rank_idx[m.task_id] = [idx[i] for i in keep]

    def spread_ranks(self, tid: str, groups: list[tuple[int, ...]], first: int,
                     need: float) -> None:
        """A spread's new ranks (numbered from ``first``) on ``groups``, ``need`` bytes per
        device; their share is assigned with the others' (:mod:`.shares`)."""
        self.ranks[tid] = [*self.ranks[tid], *groups]
        self.rank_idx[tid] = [*self.rank_idx[tid], *range(first, first + len(groups))]
        for g in groups:
            for d in g:
                self._put(d, tid, 0.0)
                self.mem_free[d] -= need

    def regroup_ranks(self, g: Regroup) -> None:
        """A regroup's ranks become one rank on all their devices (the rollout keeps them)."""
        idx, ranks = self.rank_idx[g.task_id], self.ranks[g.task_id]
        merged = tuple(d for r in (g.dst_rank, *g.src_ranks) for d in ranks[idx.index(r)])
        keep = [i for i, r in enumerate(idx) if r not in g.src_ranks]
        self.ranks[g.task_id] = [merged if idx[i] == g.dst_rank else ranks[i] for i in keep]
        self.rank_idx[g.task_id] = [idx[i] for i in keep]


def build_board(view: View) -> Board:
    """The board of the pool as the view shows it: running tasks, memory free per device."""
    b = Board([{} for _ in view.devices])
    b.mem_free = [d.mem_capacity_bytes - d.mem_used_bytes for d in view.devices]
    for pv in view.pipelines:
        for t in pv.running:
            b.add_running(t)
    b.dirty = False
    return b


def placement_key(view: View) -> tuple[tuple[Any, ...], ...]:
    """Everything of the running tasks that :meth:`Board.add_running` reads, in order."""
    return tuple((t.task_id, t.pipeline, t.stage, t.share, t.devices, t.rank_devices,
                  t.rank_shares) for pv in view.pipelines for t in pv.running)


class BoardCache:
    """:func:`build_board`, built once per placement of the running tasks (``placement_key``)
    and memory in use (the device views), each decision getting a copy-on-write copy."""

    def __init__(self) -> None:
        self._key: tuple[tuple[Any, ...], ...] | None = None
        self._devices: tuple[Any, ...] | None = None
        self._board: Board | None = None

    def board(self, view: View) -> Board:
        key = placement_key(view)
        if self._board is None or key != self._key:
            self._board = build_board(view)
            self._board.token = object()
            self._key, self._devices = key, view.devices
        elif view.devices != self._devices:  # memory in use moved (a residency change)
            self._board.mem_free = [d.mem_capacity_bytes - d.mem_used_bytes
                                    for d in view.devices]
            self._devices = view.devices
        return self._board.copy()
