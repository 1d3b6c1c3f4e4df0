"""A device worker's rollout side: the weights each pipeline's engines load here, and one
:class:`~jigsawrl.engine.session.RolloutSession` per rollout rank running on this device.

What it runs (for :class:`~jigsawrl.executors.raycluster.worker.DeviceWorker`):

- :meth:`RolloutHost.run_slice`: a time slice of one rank. New requests, requests migrated here
  (already resolved by Ray) and fresh weights are taken in first, then the rank's session runs
  for the slice's budget; the slice reports the trajectories that finished, the rank's
  unfinished count, decode width and context tokens and, when asked, a snapshot of its
  unfinished requests (the executor resumes them from it if this worker dies);
- :meth:`RolloutHost.export`: abort a rank's unfinished requests, or some of them, and hand them
  over (long-tail migration; a spread onto new ranks).

Each rank has its own engine, loaded with the pipeline's newest weights on this device when the
rank starts; it keeps them for the whole rollout (on-policy for its version) unless a slice
asks for a reload.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from jigsawrl.executors.raycluster.messages import (
    Resumable,
    SliceRequest,
    SliceResult,
    TrainState,
)
from jigsawrl.executors.raycluster.rollouts import request_row
from jigsawrl.executors.raycluster.worker_pipes import LocalPipelines, wall_now

log = logging.getLogger(__name__)


@dataclass
class RankSession:
    """One rollout rank's live state on this device."""

    session: Any
    version: int  # the weights version its engine holds
    versions: dict[str, int] = field(default_factory=dict)  # request id -> weights version

    def versioned(self, items: list[Any]) -> tuple[Resumable, ...]:
        """Exported requests paired with the weights version that generated them."""
        return tuple(Resumable(item, self.versions.get(item.state.request_id, -1))
                     for item in items)


class RolloutHost:
    """The rollout ranks of one device worker (see the module docstring)."""

    def __init__(self, local: LocalPipelines) -> None:
        self.local = local
        self.weights: dict[str, tuple[int, Any]] = {}  # name -> newest (version, weights) here
        self.ranks: dict[tuple[str, int, int], RankSession] = {}

    def preload(self, name: str, version: int, weights: Any) -> None:
        """Receive a pipeline's weights (a state dict, or a host train state holding them)."""
        self.weights[name] = (version, weights.train["model"] if isinstance(weights, TrainState)
                              else weights)

    @staticmethod
    def warm(pipe: Any) -> None:
        """A throwaway engine generating two tokens: a worker's first engine took ~0.4 s to
        build (measured), which otherwise lands in the first rollout slice of the run."""
        from jigsawrl.engine.session import RolloutSession

        engine = pipe.new_engine(pipe.engine.model.state_dict())
        example, req = pipe.step_requests(0)[0]
        req = dataclasses.replace(req, request_id="warm/0/0/0",
                                  params=dataclasses.replace(req.params, max_new_tokens=2))
        session = RolloutSession(engine, pipe.tokenizer, pipe.task)
        session.add(example, req)
        session.run()

    def run_slice(self, req: SliceRequest, weights: Any,
                  incoming: tuple[list[Resumable], ...]) -> SliceResult:
        """Run one time slice of rank ``(req.pipeline, req.step, req.rank)``.

        Args:
            req: the slice (see :class:`SliceRequest`).
            weights: the pipeline's newest weights, sent when this device has an older version;
                None otherwise.
            incoming: lists of requests migrated here (:meth:`export` of another rank) or
                resumed from a dead worker's checkpoints.
        """
        import torch

        torch.set_num_threads(max(1, req.threads))
        t_start = wall_now()
        pipe = self.local.get(req.pipeline)
        if weights is not None:
            self.preload(req.pipeline, req.version, weights)
        key = (req.pipeline, req.step, req.rank)
        rk = self.ranks.get(key) or self._new_rank(key, pipe)
        self._take_in(rk, pipe, req, incoming)
        engine = rk.session.engine
        t_setup = wall_now()
        stats0 = engine.stats
        finished = rk.session.run(req.budget_s, idle_return=True)
        stats1 = engine.stats
        decoded = stats1.decode_tokens - stats0.decode_tokens
        out = SliceResult(
            trajectories=tuple(finished),
            versions=tuple(rk.versions.pop(t.request_id, -1) for t in finished),
            unfinished=rk.session.unfinished, decoding=rk.session.decoding,
            ctx_tokens=rk.session.ctx_tokens(), next_ready_s=rk.session.next_ready_s,
            tokens=stats1.prefill_tokens - stats0.prefill_tokens + decoded,
            # mean decode width of the slice's iterations: what names its band
            width=round(decoded / max(1, stats1.iterations - stats0.iterations)),
            t_start=t_start, t_end=wall_now(), threads=req.threads, setup_s=t_setup - t_start,
            checkpoint=rk.versioned(rk.session.snapshot()) if req.checkpoint else ())
        if rk.session.done():
            del self.ranks[key]
        return out

    def _take_in(self, rk: RankSession, pipe: Any, req: SliceRequest,
                 incoming: tuple[list[Resumable], ...]) -> None:
        """A reload the slice asked for, then its new and migrated requests."""
        name = req.pipeline
        if req.force_reload and self.weights[name][0] != rk.version:
            rk.session.load_weights(self.weights[name][1])
            rk.version = self.weights[name][0]
        if req.fresh:
            reqs = pipe.step_requests(self.local.absolute_step(name, req.step))
            for i in req.fresh:
                example, request = reqs[i]
                rk.session.add(example, request)
                rk.versions[request.request_id] = rk.version
        for items in incoming:
            for item, item_version in items:
                rk.session.add_exported(item)
                rk.versions[item.state.request_id] = item_version

    def _new_rank(self, key: tuple[str, int, int], pipe: Any) -> RankSession:
        from jigsawrl.engine.session import RolloutSession

        name = key[0]
        if name not in self.weights:
            raise RuntimeError(f"device {self.local.device}: no weights of {name!r} received yet")
        version, weights = self.weights[name]
        engine = pipe.new_engine(weights)
        rk = self.ranks[key] = RankSession(RolloutSession(
            engine, pipe.tokenizer, pipe.task, extra_latency_s=pipe.spec.rollout.tool_latency_s),
            version)
        return rk

    def export(self, name: str, step: int, rank: int,
               indices: tuple[int, ...] | None = None) -> tuple[Resumable, ...]:
        """Abort the rank's unfinished requests — or those of the batch rows ``indices`` still
        here (a spread: the rank goes on with the others) — and return them with their
        weights versions."""
        key = (name, step, rank)
        rk = self.ranks.get(key)
        if rk is None:
            return ()
        only = None
        if indices is not None:
            g = self.local.specs[name].group_size
            rows = set(indices)
            only = {rid for rid in rk.session.request_ids() if request_row(rid, g) in rows}
        items = rk.versioned(rk.session.export(only))
        if only is None or rk.session.done():
            del self.ranks[key]
        for item in items:
            rk.versions.pop(item.request.state.request_id, None)
        log.info("device %d: exported %d requests of %s/%d rank %d", self.local.device,
                 len(items), name, step, rank)
        return items
