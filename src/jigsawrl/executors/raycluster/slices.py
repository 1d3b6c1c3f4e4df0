"""Real rollouts as time slices on device workers: submission, results, interruption, and the
redispatch of a dead worker's requests; requests moved between ranks (migration, a regrouped
tail, spreads) are :mod:`.moves`', a sync rollout's in-tail log-probs :mod:`.tail`'s.

What: a rollout runs as ``len(devices) // tp`` ranks; each rank advances in time slices
(``chunk_s``) on its device's worker, and after every slice :class:`Rollouts` emits the
trajectories that finished (``SampleFinished``), a :class:`RankProgress` when the rank's
unfinished count changed, and a span of the slice's decode band. A rank whose requests all wait
for tools gives its device back until the first is ready (a timer). Every ``checkpoint_s`` of a
rank's rollout its next slice also returns a snapshot of its unfinished requests; the latest one
of each request is kept (:class:`~jigsawrl.executors.raycluster.rollouts.RolloutRT`) until it
finishes, so that a dead worker's requests resume elsewhere (:meth:`Rollouts.redispatch`).
"""

from __future__ import annotations

import logging
from typing import Any

import ray

from jigsawrl.driver.protocol import RankProgress, TaskDone
from jigsawrl.events import SampleFinished
from jigsawrl.executors.raycluster.messages import SliceRequest, SliceResult
from jigsawrl.executors.raycluster.moves import RequestMoves
from jigsawrl.executors.raycluster.records import Call, CallKind, RunState
from jigsawrl.executors.raycluster.rollouts import RankRT, RolloutRT, dispatch, request_row
from jigsawrl.executors.raycluster.tail import TailPasses
from jigsawrl.scheduler.base import Interrupt, SetShare, StartRollout
from jigsawrl.stages import Stage, decode_band

log = logging.getLogger(__name__)

DONE_BAND = "done"  # the band a drained rank reports (not a stage: no span has it)


def rollout_band(decoding: int) -> str:
    """The decode band of a slice whose engine batch held ``decoding`` requests."""
    return decode_band(decoding) if decoding > 0 else Stage.TOOL_WAIT


class Rollouts(RequestMoves):
    """The running rollouts of a real run (see the module docstring)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.active: dict[str, RolloutRT] = {}
        # requests of dead workers: resumed from a checkpoint, regenerated from the prompt, and
        # the sampled tokens the resumed ones kept
        self.recovered = {"resumed": 0, "regenerated": 0, "tokens_kept": 0}
        # export ref -> (the source rank, the requests it carries)
        self.exports: dict[Any, tuple[int, tuple[int, ...]]] = {}
        self.tail = TailPasses(state, self.active)  # in-tail log-probs (tail.py)

    # ------------------------------------------------------------------ actions
    def launch(self, a: StartRollout, tid: str) -> None:
        spec = self.state.pipes[a.pipeline].spec
        n = spec.batch_size * spec.group_size
        now = self.state.now_s
        if a.first_b or a.stream_devices:
            log.warning("%s: streaming into training and first-B batches are modelled by the "
                        "simulator only; the Ray executor runs this rollout as a plain one", tid)
        ranks = [RankRT(r, a.devices[r * a.tp:(r + 1) * a.tp], a.share, checkpoint_at=now)
                 for r in range(len(a.devices) // a.tp)]
        ro = RolloutRT(tid, a.pipeline, a.step, n, ranks)
        for r, idx in enumerate(dispatch(n, spec.group_size, len(ranks), a.dispatch)):
            ro.assign(r, idx)
            # every rank's count at once, as the simulator reports them at a rollout's start: a
            # rank first heard of after its first slice looked drained to a decision taken
            # between two ranks' first slices, which released it (moving all its requests)
            ranks[r].unfinished = len(idx)
            self.state.notes.append(RankProgress(tid, r, len(idx), Stage.PREFILL, now, 0))
        self.active[tid] = ro
        if a.tail_logprobs:
            self.tail.open(ro)
        for rank in ranks:
            self.submit_chunk(ro, rank)

    def submit_chunk(self, ro: RolloutRT, rank: RankRT) -> None:
        """Send the rank's next slice (with what it takes in first: new and migrated requests,
        newer weights, a reload, a checkpoint request)."""
        settings, now = self.state.settings, self.state.now_s
        pipe, dev = self.state.pipes[ro.pipeline], self.state.devs[rank.device]
        weights = pipe.weights_ref if dev.versions.get(pipe.name) != pipe.version else None
        checkpoint = now - rank.checkpoint_at >= settings.checkpoint_s
        if checkpoint:
            rank.checkpoint_at = now
        req = SliceRequest(pipe.name, ro.step, rank.index, settings.chunk_s,
                           settings.threads_for(rank.share, len(rank.devices)), tuple(rank.fresh),
                           pipe.version, rank.force_reload, checkpoint)
        ref = dev.actor.gen_run.remote(req, weights, *rank.incoming)
        sent = (tuple(rank.fresh), tuple(rank.incoming))
        dev.versions[pipe.name] = pipe.version
        rank.fresh, rank.incoming, rank.force_reload, rank.timer_at = [], [], False, None
        rank.inflight = ref
        self.state.track(ref, Call(CallKind.CHUNK, pipe.name, ro.step, Stage.ROLLOUT,
                                   rank.devices, rank.share, ro.tid, ro, rank,
                                   worker=rank.device, sent=sent))

    def set_share(self, action: SetShare) -> None:
        """A new share: a rollout rank's next slice (or the task's next call) uses it."""
        ro = self.active.get(action.task_id)
        if ro is None:
            if not any(c.tid == action.task_id for c in self.state.calls.values()):
                raise KeyError(f"set_share: no running task {action.task_id!r}")
            return  # a single call: it keeps its threads until it returns
        for rank in ro.ranks if action.rank is None else [ro.ranks[action.rank]]:
            rank.share = action.share

    def interrupt(self, action: Interrupt) -> None:
        """Every rank reloads the newest weights at its next slice (AReaL's interruption)."""
        for rank in self.active[action.task_id].ranks:
            rank.force_reload = not rank.done

    # ------------------------------------------------------------------ timers
    def timers(self) -> list[float]:
        """When the ranks waiting for tools are due (run clock)."""
        return [r.timer_at for ro in self.active.values() for r in ro.ranks
                if r.timer_at is not None]

    def fire_timers(self) -> None:
        now = self.state.now_s
        for ro in list(self.active.values()):
            for rank in ro.ranks:
                if rank.timer_at is not None and rank.timer_at <= now and rank.inflight is None:
                    self.submit_chunk(ro, rank)

    # ------------------------------------------------------------------ results
    def chunk_done(self, call: Call, res: SliceResult) -> None:
        for item in call.sent[1] if call.sent else ():
            if not isinstance(item, list):
                self.exports.pop(item, None)
        ro, rank = call.rollout, call.rank
        assert ro is not None and rank is not None
        rank.inflight = None
        g = self.state.pipes[ro.pipeline].spec.group_size
        self.state.span(call, rollout_band(res.width if res.tokens else 0), res, rank.index)
        t_end = self.state.run_time(res.t_end)
        for traj, version in zip(res.trajectories, res.versions, strict=True):
            if ro.finished(request_row(traj.request_id, g), traj, version):
                self.state.events.append(SampleFinished(
                    ro.pipeline, ro.step, traj.request_id, t_end, len(traj.prompt_ids),
                    len(traj.response_ids), 1 + traj.num_tool_calls, version,
                    int(sum(traj.response_mask))))
        for item, version in res.checkpoint:
            ro.keep_checkpoint(request_row(item.state.request_id, g), item, version)
        self._after_chunk(ro, rank, res)
        self.tail.pump(ro)

    def _after_chunk(self, ro: RolloutRT, rank: RankRT, res: SliceResult) -> None:
        """The rank's next step: done, a timer until its first tool result, or its next slice."""
        migrated = rank.migrate_to is not None
        unfinished = 0 if migrated else res.unfinished
        waiting = rank.incoming or rank.fresh
        if migrated or (unfinished == 0 and not waiting):
            rank.done = True
        elif res.decoding == 0 and res.next_ready_s > 0 and not waiting:
            rank.timer_at = self.state.now_s + res.next_ready_s
        else:
            self.submit_chunk(ro, rank)
        if unfinished != rank.unfinished:
            rank.unfinished = unfinished
            band = DONE_BAND if rank.done else rollout_band(res.decoding)
            self.state.notes.append(RankProgress(ro.tid, rank.index, unfinished, band,
                                                 self.state.now_s,
                                                 0 if rank.done else res.ctx_tokens))
        if ro.complete:
            self._rollout_done(ro)

    def _rollout_done(self, ro: RolloutRT) -> None:
        del self.active[ro.tid]
        trajs = [t for t, _ in ro.ordered()]
        self.state.pipes[ro.pipeline].trajs[ro.step] = ray.put(trajs)
        self.state.notes.append(TaskDone(ro.tid, ro.pipeline, ro.step, Stage.ROLLOUT,
                                         self.state.now_s,
                                         tuple(len(t.prompt_ids) for t in trajs),
                                         tuple(len(t.response_ids) for t in trajs)))

    # ------------------------------------------------------------------ recovery
    def drop(self, pipeline: str) -> None:
        """Forget the rollouts of a failed pipeline."""
        for tid in [t for t, ro in self.active.items() if ro.pipeline == pipeline]:
            del self.active[tid]
        self.tail.forget(pipeline)

    def running(self, pipeline: str) -> list[RolloutRT]:
        return [ro for ro in self.active.values() if ro.pipeline == pipeline]

    def redispatch_device(self, index: int) -> None:
        """Device ``index``'s worker died: the requests of every live rank it ran go on."""
        for ro in list(self.active.values()):
            for rank in ro.ranks:
                if rank.device == index and not rank.done:
                    self.redispatch(ro, rank)

    def redispatch(self, ro: RolloutRT, rank: RankRT) -> None:
        """Give a dead rank's requests to the live rank with the fewest: each resumes there
        from its latest checkpoint (with the weights version that generated it, for the
        samples' version accounting), or is regenerated from its prompt if it has none.

        Exports migrated to the dead rank and not yet taken in are dropped: their requests,
        now owned by the dead rank, resume from their checkpoints like its own."""
        live = [r for r in ro.ranks if not r.done and r.device != rank.device]
        target = min(live, key=lambda r: len(ro.owned_by(r.index))) if live else rank
        rank.fresh, rank.incoming = [], []
        if target is not rank:
            rank.done, rank.migrate_to = True, target.index
        resume, fresh = ro.recover(rank.index, target.index)
        if resume:
            target.incoming.append(resume)
        self._count_recovered(ro, rank, target, resume, fresh)
        if target.inflight is None:
            target.done = False
            self.submit_chunk(ro, target)
        if target is not rank:
            self.state.notes.append(RankProgress(ro.tid, rank.index, 0, DONE_BAND,
                                                 self.state.now_s, 0))

    def retry_lost_exports(self, call: Call) -> tuple[int, ...] | None:
        """A slice failed on a live worker because a migration's export it took in was lost
        (the source worker died before exporting): the exported requests resume on this rank
        from their latest checkpoints (regenerated from their prompts if they have none), and
        the slice is sent again with everything else it took in. Returns the devices whose
        exports were lost (their workers are likely dead: the caller checks and replaces
        them, since nothing else may call them again); None: not that case."""
        ro, rank = call.rollout, call.rank
        if ro is None or rank is None or call.sent is None or self.active.get(ro.tid) is not ro:
            return None
        fresh, incoming = call.sent
        keep: list[Any] = []
        lost: list[int] = []
        sources: list[int] = []
        for item in incoming:
            if isinstance(item, list) or item not in self.exports:
                keep.append(item)
                continue
            try:
                ray.get(item, timeout=0)
                keep.append(item)
            except ray.exceptions.GetTimeoutError:
                keep.append(item)
            except Exception:  # noqa: BLE001 - its worker died: the export is gone
                source, requests = self.exports.pop(item)
                sources.append(source)
                lost += requests
        if not sources:
            return None
        pending = [i for i in lost if i not in ro.results and ro.owner.get(i) == rank.index]
        resume = [ro.checkpoints[i] for i in pending if i in ro.checkpoints]
        regen = [i for i in pending if i not in ro.checkpoints]
        rank.fresh = [*fresh, *regen, *rank.fresh]
        rank.incoming = [*keep, *([resume] if resume else []), *rank.incoming]
        self._count_recovered(ro, ro.ranks[sources[0]], rank, resume, regen)
        rank.done = False
        if rank.inflight is None:
            self.submit_chunk(ro, rank)
        return tuple(dict.fromkeys(ro.ranks[i].device for i in sources))

    def _count_recovered(self, ro: RolloutRT, rank: RankRT, target: RankRT,
                         resume: list[tuple[Any, int]], fresh: list[int]) -> None:
        kept = sum(item.state.num_generated for item, _ in resume)
        self.recovered["resumed"] += len(resume)
        self.recovered["regenerated"] += len(fresh)
        self.recovered["tokens_kept"] += kept
        log.warning("%s: requests of rank %d moved to rank %d: %d resumed from checkpoints "
                    "(%d sampled tokens kept), %d regenerated from their prompts", ro.tid,
                    rank.index, target.index, len(resume), kept, len(fresh))
