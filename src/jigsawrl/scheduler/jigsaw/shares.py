"""Pieces of the ``jigsaw`` policy: its per-decision board, predictions and the share arithmetic.

Split out of :mod:`jigsawrl.scheduler.jigsaw` to keep modules small; nothing here decides on its
own. Shares are discrete levels (``SHARE_LEVELS``, the prototype's hand-picked SM levels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from jigsawrl.costmodel import SHARE_LEVELS
from jigsawrl.scheduler.base import (
    Action,
    Migrate,
    PipelineView,
    StartRollout,
    StartStage,
    View,
    task_id,
)
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.workload.task_presets import TASKS

MEM_HEADROOM = 2e9  # bytes per device kept free (allocator fragmentation, CUDA context)


@dataclass(slots=True)
class Prediction:
    gen_s: float
    stages_s: dict[str, float]

    @property
    def step_s(self) -> float:
        return self.gen_s + sum(self.stages_s.values())


@dataclass(slots=True)
class Board:
    """This decision's model of the pool: who holds compute on which device, at what share."""

    dev: list[dict[str, float]]  # device -> task id -> share (compute-holding tasks only)
    kind: dict[str, str] = field(default_factory=dict)  # task id -> memory | compute
    pipe: dict[str, str] = field(default_factory=dict)
    stage: dict[str, str] = field(default_factory=dict)
    ranks: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)  # live rollout ranks
    rank_idx: dict[str, list[int]] = field(default_factory=dict)
    mem_free: list[float] = field(default_factory=list)

    def count(self, d: int) -> int:
        return len(self.dev[d])

    def has_compute(self, d: int) -> bool:
        return any(self.kind[t] == "compute" for t in self.dev[d])


def pack(busy: list[int], left: dict[int, int], keep: int, cap: int, tid: str,
          live: list[int]) -> list[Migrate]:
    """Move the tail onto the ``keep`` fullest ranks (they keep their KV), filling each up to
    ``cap`` requests, largest sources first; drained ranks are released onto the first."""
    dsts = busy[:keep]
    load = {d: left[d] for d in dsts}
    moves: dict[int, list[int]] = {d: [] for d in dsts}
    for src in busy[keep:]:
        d = min(dsts, key=lambda x: load[x])
        moves[d].append(src)
        load[d] += left[src]
    moves[dsts[0]].extend(r for r in live if left[r] == 0)
    return [Migrate(tid, tuple(srcs), d) for d, srcs in moves.items() if srcs]


def with_share(a: Action, want: dict[str, dict[int, float]]) -> Action:
    if isinstance(a, StartRollout):
        shares = want.get(task_id(a.pipeline, a.step, Stage.ROLLOUT), {})
        s = min((shares[d] for d in a.devices if d in shares), default=1.0)
        return StartRollout(a.pipeline, a.step, a.devices, a.tp, s, a.kv_mem_bytes, a.dispatch)
    if isinstance(a, StartStage) and a.stage in MODEL_PASSES:
        shares = want.get(task_id(a.pipeline, a.step, a.stage), {})
        s = min(shares.values(), default=1.0)
        return StartStage(a.pipeline, a.step, a.stage, a.devices, s, a.mem_bytes)
    return a


def rollout_rate(view: View, pv: PipelineView, share: float) -> float:
    task = TASKS.get(pv.spec.task)
    prefill = 0.25 if task is not None and task.multi_turn else 0.05  # share of rollout time
    cost = view.cost
    return (1 - prefill) / cost.slowdown(Stage.DECODE_SMALL, share) + prefill / cost.slowdown(
        Stage.PREFILL, share)


def level_floor(x: float) -> float:
    fit = [s for s in SHARE_LEVELS if s <= x + 1e-9]
    return fit[-1] if fit else max(x, 0.05)


def slow_fn(view: View):  # noqa: ANN202
    cost = view.cost

    def slow(stage: str, share: float) -> float:
        if stage == Stage.ROLLOUT:
            stage = Stage.DECODE_SMALL
        return cost.slowdown(stage, max(0.05, min(1.0, share)))

    return slow


def compute_split(view: View, pv: PipelineView, n_mem: int,
                  dynamic: bool) -> tuple[float, float]:
    """(compute share, share of each of ``n_mem`` co-located decodes) for a device pairing a
    compute-bound stage with decodes: the level maximising the summed progress rate."""
    if not dynamic:
        even = level_floor(1.0 / (n_mem + 1))
        return 1.0 - even * n_mem, even
    return _best_split(id(view.cost), view.cost, pv.model.name, n_mem)


@lru_cache(maxsize=256)
def _best_split(_key: int, cost, model_name: str, n_mem: int) -> tuple[float, float]:  # noqa: ANN001
    best, arg = -1.0, (0.5, 0.5)
    for m in SHARE_LEVELS:
        c = 1.0 - m * n_mem
        if c < 0.2 - 1e-9:
            continue
        rate = 1.0 / cost.slowdown(Stage.ACTOR_UPDATE, c) + n_mem / cost.slowdown(Stage.DECODE_SMALL, m)
        if rate > best + 1e-12:
            best, arg = rate, (round(c, 6), m)
    return arg
