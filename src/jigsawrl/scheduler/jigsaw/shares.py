"""The ``jigsaw`` policy's compute shares: the split of each device between co-located sub-stages
(DESIGN.md §2.3), and the share actions that apply it.

Shares are discrete levels (``SHARE_LEVELS``, the prototype's hand-picked SM levels). A device
pairing a model pass with decodes is split at the level maximising the summed progress rate
``1 / slowdown(update, c) + n / slowdown(decode, m)`` (:func:`compute_split`); co-located rollouts
split what is left, equally or (two of them) at the levels maximising their urgency-weighted rate
(:meth:`ShareAssigner.rollout_split`). ``dynamic_shares=False``: equal splits throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache

from jigsawrl.costmodel import SHARE_LEVELS, CostModelProtocol
from jigsawrl.scheduler.base import (
    Action,
    PipelineView,
    RunningTask,
    SetShare,
    StartRollout,
    StartStage,
    View,
    task_id,
)
from jigsawrl.scheduler.jigsaw.board import COMPUTE, MEMORY, Board
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.workload.task_presets import TASKS

Shares = dict[str, dict[int, float]]  # task id -> device -> compute share


@lru_cache(maxsize=4096)
def level_floor(x: float) -> float:
    """The largest share level not above ``x`` (``x`` itself, at least 0.05, below them all)."""
    fit = [s for s in SHARE_LEVELS if s <= x + 1e-9]
    return fit[-1] if fit else max(x, 0.05)


def rollout_rate(view: View, pv: PipelineView, share: float) -> float:
    """Progress rate of ``pv``'s rollout at ``share``: decode (memory-bound) blended with
    prefill (compute-bound; a larger part for multi-turn tasks, which re-prefill each turn)."""
    task = TASKS.get(pv.spec.task)
    prefill = 0.25 if task is not None and task.multi_turn else 0.05  # share of rollout time
    cost = view.cost
    return (1 - prefill) / cost.slowdown(Stage.DECODE_SMALL, share) + prefill / cost.slowdown(
        Stage.PREFILL, share)


def compute_split(view: View, pv: PipelineView, n_mem: int,
                  dynamic: bool) -> tuple[float, float]:
    """(compute share, share of each of ``n_mem`` co-located decodes) for a device pairing a
    compute-bound stage with decodes: the level maximising the summed progress rate."""
    if not dynamic:
        even = level_floor(1.0 / (n_mem + 1))
        return 1.0 - even * n_mem, even
    return _best_split(id(view.cost), view.cost, pv.model.name, n_mem)


@lru_cache(maxsize=256)
def _best_split(_key: int, cost: CostModelProtocol, model_name: str,
                n_mem: int) -> tuple[float, float]:
    best, arg = -1.0, (0.5, 0.5)
    for m in SHARE_LEVELS:
        c = 1.0 - m * n_mem
        if c < 0.2 - 1e-9:
            continue
        rate = 1.0 / cost.slowdown(Stage.ACTOR_UPDATE, c) + n_mem / cost.slowdown(
            Stage.DECODE_SMALL, m)
        if rate > best + 1e-12:
            best, arg = rate, (round(c, 6), m)
    return arg


def with_share(a: Action, want: Shares) -> Action:
    """A start action at the share assigned to its task (the smallest over its devices)."""
    if isinstance(a, StartRollout):
        shares = want.get(task_id(a.pipeline, a.step, Stage.ROLLOUT), {})
        s = min((shares[d] for d in a.devices if d in shares), default=1.0)
        return replace(a, share=s)
    if isinstance(a, StartStage) and a.stage in MODEL_PASSES:
        shares = want.get(task_id(a.pipeline, a.step, a.stage), {})
        s = min(shares.values(), default=1.0)
        return StartStage(a.pipeline, a.step, a.stage, a.devices, s, a.mem_bytes)
    return a


class ShareAssigner:
    """Splits every device of the board and emits the actions that apply the splits.

    Args:
        dynamic: splits from the slowdown table (else equal).
        urgency: a pipeline's urgency, the weight of its rollout in a split.
    """

    def __init__(self, dynamic: bool, urgency: Callable[[View, PipelineView], float]) -> None:
        self.dynamic = dynamic
        self.urgency = urgency
        self.weighed = False  # the last split weighed urgencies (which move with the clock)
        # (board token, urgencies weighed, splits, decreases, increases) of the last clean board
        self._memo: tuple[object, tuple[tuple[str, float], ...], Shares, list[Action],
                          list[Action]] | None = None

    def share_actions(self, view: View, b: Board, starts: list[Action],
                      grows: Sequence[Action] = ()) -> list[Action]:
        """Assign every device's split, then emit decreases, starts, ``grows`` (spreads of
        running rollouts onto idle devices), increases (in that order, so the driver never
        sees a device over its compute).

        The splits and changes of a board no claim changed are those of the last decision on
        the same placement (``Board.token``) when the urgencies they weighed are the same: they
        are remembered, not worked out again over the pool."""
        memo = self._memo
        self.weighed = False
        if not b.dirty and b.token is not None and memo is not None and memo[0] is b.token:
            pvs = {pv.name: pv for pv in view.pipelines}
            if all(self.urgency(view, pvs[name]) == w for name, w in memo[1]):
                self.weighed = bool(memo[1])
                _, _, want, down, up = memo
                return down + [with_share(a, want) for a in starts] + list(grows) + up
        used: dict[str, float] = {}
        want = self.assign(view, b, used)
        self.weighed = bool(used)
        running = {t.task_id: t for pv in view.pipelines for t in pv.running}
        down: list[Action] = []
        up: list[Action] = []
        starts = [with_share(a, want) for a in starts]
        started = {task_id(a.pipeline, a.step, Stage.ROLLOUT if isinstance(a, StartRollout)
                           else a.stage) for a in starts}
        for tid, shares in want.items():
            if tid in started or tid not in running:
                continue
            for change in self._changes(b, running[tid], shares):
                (down if change[1] < change[2] else up).append(change[0])
        self._memo = None if b.dirty or b.token is None else (
            b.token, tuple(used.items()), want, list(down), list(up))
        return down + starts + list(grows) + up

    @staticmethod
    def _changes(b: Board, t: RunningTask,
                 shares: dict[int, float]) -> list[tuple[SetShare, float, float]]:
        """(action, new share, old share) for each part of a running task whose share moves."""
        if b.kind[t.task_id] == COMPUTE:
            new = min(shares.values())
            return [(SetShare(t.task_id, new), new, t.share)] if abs(new - t.share) > 1e-9 else []
        out = []
        known = len(t.rank_devices)
        for i, r in enumerate(b.rank_idx[t.task_id]):
            # a rank a spread adds in this decision starts at the share of the first live one
            devs = t.rank_devices[r] if r < known else b.ranks[t.task_id][i]
            new = shares[devs[0]] if len(devs) == 1 else min(shares[d] for d in devs)
            old = t.rank_shares[r] if r < known else t.live_share
            if abs(new - old) > 1e-9:
                out.append((SetShare(t.task_id, new, rank=r), new, old))
        return out

    def assign(self, view: View, b: Board, used: dict[str, float] | None = None) -> Shares:
        """Per task, per device: its compute share. Devices holding the same tasks (in the same
        order) get the same split, so it is worked out once per such set of tasks. ``used``
        collects the urgencies a split weighed (pipeline -> urgency)."""
        want: Shares = {}
        compute_share = self._compute_shares(view, b)
        urgency = {pv.name: self.urgency(view, pv) for pv in view.pipelines}
        by_name = {pv.name: pv for pv in view.pipelines}
        kind, pipe = b.kind, b.pipe
        splits: dict[tuple[str, ...], list[tuple[str, float]]] = {}
        for d, tasks in enumerate(b.dev):
            key = tuple(tasks)
            split = splits.get(key)
            if split is None:
                mems = [t for t in key if kind[t] == MEMORY]
                if used is not None and self.dynamic and len(mems) == 2:
                    used.update((pipe[t], urgency[pipe[t]]) for t in mems)
                c = max((compute_share[t] for t in key if t in compute_share), default=0.0)
                shares = self.rollout_split(view, [by_name[pipe[t]] for t in mems],
                                            [urgency[pipe[t]] for t in mems], 1.0 - c)
                split = splits[key] = [(t, compute_share[t]) for t in key
                                       if t in compute_share] + list(zip(mems, shares,
                                                                         strict=True))
            for t, share in split:
                got = want.get(t)
                if got is None:
                    want[t] = {d: share}
                else:
                    got[d] = share
        return want

    def _compute_shares(self, view: View, b: Board) -> dict[str, float]:
        """Each model pass's share: the smallest its devices' splits give it."""
        compute_share: dict[str, float] = {}
        kind = b.kind
        seen: set[tuple[str, ...]] = set()  # the share depends on the device's tasks only
        for tasks in b.dev:
            key = tuple(tasks)
            if key in seen:
                continue
            seen.add(key)
            comps = [t for t in key if kind[t] == COMPUTE]
            if not comps:
                continue
            n_mems = sum(1 for t in key if kind[t] == MEMORY)
            if n_mems:
                pv = next(p for p in view.pipelines if p.name == b.pipe[comps[0]])
                c_share = compute_split(view, pv, n_mems, self.dynamic)[0]
            else:
                c_share = 1.0
            for t in comps:
                compute_share[t] = min(compute_share.get(t, 1.0), c_share)
        return compute_share

    def rollout_split(self, view: View, pvs: list[PipelineView], weights: list[float],
                      room: float) -> list[float]:
        """Shares of co-located rollouts in ``room``: equal, or (dynamic, two of them) the levels
        maximising the urgency-weighted rate (:func:`rollout_rate`)."""
        even = level_floor(room / len(pvs)) if pvs else 0.0
        if not self.dynamic or len(pvs) != 2:
            return [even] * len(pvs)
        best, arg = -1.0, [even, even]
        for s1 in SHARE_LEVELS:
            s2 = level_floor(room - s1)
            if s1 > room + 1e-9 or s2 < 0.2 - 1e-9:
                continue
            rate = sum(w * rollout_rate(view, pv, sh)
                       for pv, w, sh in zip(pvs, weights, (s1, s2), strict=True))
            if rate > best + 1e-12:
                best, arg = rate, [s1, s2]
        return arg
