"""Requests moved between the ranks of a running rollout (mixed into
:class:`~jigsawrl.executors.raycluster.slices.Rollouts`): long-tail migration, a re-formed
(wider) engine for the tail, and spreads onto new ranks.

Every move follows one rule: requests not started yet move as they are; started ones are
exported after their rank's current slice (``gen_export``: prompt, generated tokens, sampling
RNG and tool state) and taken in by the destination's next slice, which re-prefills them.
Ownership of each request index moves with it (``RolloutRT``), so trajectories come back in
index order and a dead worker's requests resume from their checkpoints as after any move.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from jigsawrl.executors.raycluster.records import RunState
from jigsawrl.executors.raycluster.rollouts import RankRT, RolloutRT
from jigsawrl.scheduler.base import Migrate, Regroup, Spread

log = logging.getLogger(__name__)


class RequestMoves:
    """:meth:`migrate`, :meth:`regroup` and :meth:`spread` of the running rollouts (module
    docstring)."""

    state: RunState
    active: dict[str, RolloutRT]
    exports: dict[Any, tuple[int, tuple[int, ...]]]

    if TYPE_CHECKING:  # provided by Rollouts
        def submit_chunk(self, ro: RolloutRT, rank: RankRT) -> None: ...

    def migrate(self, action: Migrate) -> None:
        """Abort the source ranks' unfinished requests after their current slice and resume
        them on ``dst_rank`` (its next slice re-prefills prompt + generated tokens)."""
        ro = self.active[action.task_id]
        dst = ro.ranks[action.dst_rank]
        for r in action.src_ranks:
            self._hand_over(ro, ro.ranks[r], dst)
        self._wake(ro, dst)

    def regroup(self, action: Regroup) -> None:
        """One engine for the tail on the devices of ``dst_rank`` and ``src_ranks``: the
        sources' unfinished requests move to the destination as in a migration, and the
        destination's slices run from then on with the threads of all those devices (a CPU
        worker's counterpart of a wider TP group). Its own requests keep their KV caches: on a
        CPU engine the thread count changes no cache layout, so only the moved requests are
        re-prefilled (the simulator charges every moved context and a wake-up: an upper bound
        of what this costs here)."""
        ro = self.active[action.task_id]
        dst = ro.ranks[action.dst_rank]
        devices = list(dst.devices)
        for r in action.src_ranks:
            src = ro.ranks[r]
            self._hand_over(ro, src, dst)
            devices += [d for d in src.devices if d not in devices]
        dst.devices = tuple(devices)
        log.debug("%s: rank %d regrouped onto devices %s", ro.tid, dst.index, dst.devices)
        self._wake(ro, dst)

    def _hand_over(self, ro: RolloutRT, src: RankRT, dst: RankRT) -> None:
        """``src``'s unfinished requests go to ``dst``: those not started yet as they are, the
        others exported after ``src``'s current slice (``src`` stops then)."""
        if src.done:
            return
        exported = tuple(i for i in ro.owned_by(src.index) if i not in src.fresh)
        moved = ro.move(src.index, dst.index)
        dst.fresh.extend(src.fresh)  # not started yet: start them on dst
        src.fresh = []
        export = self.state.devs[src.device].actor.gen_export.remote(ro.pipeline, ro.step,
                                                                     src.index)
        dst.incoming.append(export)
        self.exports[export] = (src.index, exported)
        src.migrate_to = dst.index
        log.debug("%s: migrating %d requests rank %d -> %d", ro.tid, moved, src.index,
                  dst.index)

    def _wake(self, ro: RolloutRT, dst: RankRT) -> None:
        """A destination that had drained, or waits for a tool, takes its new requests now."""
        if dst.done or (dst.inflight is None and dst.timer_at is not None):
            dst.done = False
            self.submit_chunk(ro, dst)

    def spread(self, action: Spread) -> None:
        """New ranks on ``action.devices`` (one per TP group; a CPU worker is one device), and
        the rollout's unfinished requests re-dealt so that every rank holding some, and each
        new one, holds about as many. From a rank with more than its share, rows not started
        yet move as they are, then started ones (the last dealt first: chosen without lengths)
        are exported after its current slice and resumed on their new rank, which re-prefills
        them; tool-waiting ones carry their result and remaining wait."""
        ro = self.active[action.task_id]
        tp = len(ro.ranks[0].devices)
        old = [r for r in ro.ranks if ro.owned_by(r.index)]
        share = old[0].share if old else 1.0
        now = self.state.now_s
        new = [RankRT(len(ro.ranks) + i, action.devices[g:g + tp], share, checkpoint_at=now)
               for i, g in enumerate(range(0, len(action.devices), tp))]
        ro.ranks.extend(new)
        owned = {r.index: ro.owned_by(r.index) for r in old}
        target = math.ceil(sum(map(len, owned.values())) / (len(old) + len(new)))
        load = {r.index: 0 for r in new}
        for src in old:
            excess = len(owned[src.index]) - target
            if excess > 0:
                self._deal_out(ro, src, owned[src.index], excess, new, load)
        log.debug("%s: spread onto %s, %d requests moved", ro.tid, action.devices,
                  sum(load.values()))
        for rank in new:
            if rank.fresh or rank.incoming:
                self.submit_chunk(ro, rank)
            else:
                rank.done = True

    def _deal_out(self, ro: RolloutRT, src: RankRT, rows: list[int], excess: int,
                  new: list[RankRT], load: dict[int, int]) -> None:
        """``excess`` of ``src``'s ``rows`` to the least loaded of the ``new`` ranks: not
        started ones first (from the end of its queue), then started ones (the last dealt
        first), which one partial export per destination takes off the source's worker."""
        fresh = set(src.fresh)
        take = list(reversed(src.fresh))[:excess]
        take += sorted((i for i in rows if i not in fresh), reverse=True)[:excess - len(take)]
        exports: dict[int, list[int]] = {}
        for i in take:
            dst = min(new, key=lambda r: (load[r.index], r.index))
            load[dst.index] += 1
            ro.owner[i] = dst.index
            if i in fresh:
                src.fresh.remove(i)
                dst.fresh.append(i)
            else:
                exports.setdefault(dst.index, []).append(i)
        for d, out in exports.items():
            ref = self.state.devs[src.device].actor.gen_export.remote(
                ro.pipeline, ro.step, src.index, tuple(out))
            ro.ranks[d].incoming.append(ref)
            self.exports[ref] = (src.index, tuple(out))

