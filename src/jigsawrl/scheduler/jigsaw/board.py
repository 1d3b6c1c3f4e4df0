"""The ``jigsaw`` policy's board: this decision's model of the pool.

Built afresh from the view at every decision (:func:`build_board`) and updated as the decision
claims devices (rollout and compute starts, migrations), so that each choice sees the ones made
before it in the same decision; never kept between decisions. Only tasks that hold compute are on
it: a rollout (kind ``memory``: memory-bound decode) on the devices of its live ranks, a model
pass (kind ``compute``) on its devices. Reward, weight sync and memory moves
(:data:`~jigsawrl.stages.HOST_STAGES`) hold no compute share and are left off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jigsawrl.scheduler.base import Migrate, RunningTask, View
from jigsawrl.stages import HOST_STAGES, Stage

MEM_HEADROOM = 2e9  # bytes per device kept free (allocator fragmentation, CUDA context)
MEMORY = "memory"  # the kind of a rollout (memory-bound decode)
COMPUTE = "compute"  # the kind of a model pass (compute-bound)


@dataclass(slots=True)
class Board:
    """Who holds compute on which device, at what share, and the memory left per device."""

    dev: list[dict[str, float]]  # device -> task id -> share (compute-holding tasks only)
    kind: dict[str, str] = field(default_factory=dict)  # task id -> memory | compute
    pipe: dict[str, str] = field(default_factory=dict)
    stage: dict[str, str] = field(default_factory=dict)
    ranks: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)  # live rollout ranks
    rank_idx: dict[str, list[int]] = field(default_factory=dict)
    mem_free: list[float] = field(default_factory=list)

    # ------------------------------------------------------------------ reading
    def count(self, d: int) -> int:
        """Tasks holding compute on device ``d``."""
        return len(self.dev[d])

    def has_compute(self, d: int) -> bool:
        return any(self.kind[t] == COMPUTE for t in self.dev[d])

    def mem_slots(self, d: int) -> int:
        """Rollout engines on device ``d`` (a compute stage does not take an engine slot)."""
        return sum(1 for t in self.dev[d] if self.kind[t] == MEMORY)

    def max_mem_slots(self) -> int:
        """The most rollout engines on any one device."""
        return max((self.mem_slots(d) for d in range(len(self.dev))), default=0)

    def any_memory(self) -> bool:
        """Does a rollout hold any device?"""
        return any(self.kind[t] == MEMORY for dev in self.dev for t in dev)

    def any_compute(self) -> bool:
        """Does a model pass hold any device?"""
        return any(self.kind.get(t) == COMPUTE for dev in self.dev for t in dev)

    def mem_frac(self) -> float:
        """The fraction of devices that a rollout holds (below 1 after a migration)."""
        n = len(self.dev)
        held = sum(1 for d in range(n) if any(self.kind.get(t) == MEMORY for t in self.dev[d]))
        return held / n if n else 1.0

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
                for d in t.rank_devices[r]:
                    self.dev[d][t.task_id] = t.rank_shares[r]
        else:
            self.kind[t.task_id] = COMPUTE
            for d in t.devices:
                self.dev[d][t.task_id] = t.share

    def claim_rollout(self, tid: str, pipeline: str, devs: list[int], tp: int,
                      need: float) -> None:
        """A rollout starting on ``devs`` (ranks of ``tp`` devices), ``need`` bytes per device;
        its share is assigned with the others' (:mod:`.shares`)."""
        self.kind[tid], self.pipe[tid], self.stage[tid] = MEMORY, pipeline, Stage.ROLLOUT
        self.ranks[tid] = [tuple(devs[i:i + tp]) for i in range(0, len(devs), tp)]
        self.rank_idx[tid] = list(range(len(self.ranks[tid])))
        for d in devs:
            self.dev[d][tid] = 0.0
            self.mem_free[d] -= need

    def claim_compute(self, tid: str, pipeline: str, stage: str, devs: tuple[int, ...]) -> None:
        """A model pass starting on ``devs``; its share is assigned with the others'."""
        self.kind[tid], self.pipe[tid], self.stage[tid] = COMPUTE, pipeline, stage
        for d in devs:
            self.dev[d][tid] = 0.0

    def release_ranks(self, m: Migrate) -> None:
        """A migration's source ranks leave their devices."""
        idx = self.rank_idx[m.task_id]
        for r in m.src_ranks:
            for d in self.ranks[m.task_id][idx.index(r)]:
                self.dev[d].pop(m.task_id, None)
        keep = [i for i, r in enumerate(idx) if r not in m.src_ranks]
        self.ranks[m.task_id] = [self.ranks[m.task_id][i] for i in keep]
        self.rank_idx[m.task_id] = [idx[i] for i in keep]


def build_board(view: View) -> Board:
    """The board of the pool as the view shows it: running tasks, memory free per device."""
    b = Board([{} for _ in view.devices])
    b.mem_free = [d.mem_capacity_bytes - d.mem_used_bytes for d in view.devices]
    for pv in view.pipelines:
        for t in pv.running:
            b.add_running(t)
    return b
