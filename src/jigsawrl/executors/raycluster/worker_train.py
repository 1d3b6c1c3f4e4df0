"""A device worker's train side: the train states resident on this device and what runs on them.

What it runs (for :class:`~jigsawrl.executors.raycluster.worker.DeviceWorker`):

- :meth:`TrainHost.init_train`: build a pipeline with its trainer (warm start, or its latest
  checkpoint) and hand the train state to the host;
- :meth:`TrainHost.onload` / :meth:`TrainHost.offload`: move a train state (and the batches of
  its steps in flight) between this device and host memory (the Ray object store);
- :meth:`TrainHost.run_stage`: ``old_logprob`` / ``ref_logprob`` / ``actor_update`` on the
  resident train state, alone or data-parallel with helper workers
  (:mod:`~jigsawrl.executors.raycluster.worker_shards`);
- :meth:`TrainHost.publish`: weight sync — the actor's weights as a separate object, and the
  pipeline's checkpoint when one is due.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from jigsawrl.executors.raycluster.callclock import CallClock
from jigsawrl.executors.raycluster.messages import (
    MoveResult,
    PublishRequest,
    ShardPayload,
    StageRequest,
    StageResult,
    Timed,
    TrainInit,
    TrainState,
)
from jigsawrl.executors.raycluster.worker_pipes import LocalPipelines, wall_now, worker_device
from jigsawrl.executors.raycluster.worker_shards import combine_shards, payload_of
from jigsawrl.executors.raycluster.worker_tail import fill_from_tail
from jigsawrl.stages import Stage

log = logging.getLogger(__name__)


class TrainHost:
    """The train states of one device worker (see the module docstring)."""

    def __init__(self, local: LocalPipelines) -> None:
        self.local = local
        self.data: dict[str, dict[int, Any]] = {}  # name -> step -> StepData (train side)

    def init_train(self, name: str, ckpt_root: str | None) -> tuple[TrainInit, TrainState]:
        """Build the pipeline with its trainer (warm start; the latest checkpoint under
        ``ckpt_root`` if given), then hand the train state to the host."""
        from jigsawrl.engine.pipeline import RealPipeline

        t0 = time.perf_counter()
        spec = self.local.specs[name]
        pipe = RealPipeline(spec, self.local.seed, cache_dir=self.local.cache_dir,
                            device=worker_device(spec))
        pipe.start(train=True)
        meta = pipe.restore(Path(ckpt_root)) if ckpt_root else None
        state = TrainState(pipe.export_train_state())
        self.local.pipes.setdefault(name, pipe)
        info = TrainInit(time.perf_counter() - t0, int(meta["step"]) if meta else -1,
                         tuple(meta.get("history", [])) if meta else ())
        return info, state

    @staticmethod
    def warm(pipe: Any) -> None:
        """First uses in a process are slow (lazy imports, the autograd and optimizer code
        paths: ~0.4 s for the first onload in a fresh worker, measured); pay them once."""
        import torch

        from jigsawrl.engine.device import model_device

        model = pipe.engine.model
        opt = torch.optim.AdamW(model.parameters(), lr=0.0)
        ids = torch.ones((1, 4), dtype=torch.long, device=model_device(model))
        model.train()
        model(input_ids=ids, use_cache=False).logits.float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        pipe.import_train_state({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                 "ref": None})
        pipe.export_train_state()
        model.eval()

    def onload(self, name: str, state: TrainState) -> MoveResult:
        """Make ``state`` (from host memory) this device's resident train state of ``name``."""
        t_start = wall_now()
        pipe = self.local.get(name)
        with self.local.locks[name]:
            pipe.import_train_state(state.train)
            self.data[name] = dict(state.steps)
        return MoveResult(t_start=t_start, t_end=wall_now(), state_bytes=state_bytes(state))

    def offload(self, name: str) -> tuple[MoveResult, TrainState]:
        """Move the resident train state of ``name`` (and its in-flight step data) to the host
        (call with ``num_returns=2``)."""
        t_start = wall_now()
        pipe = self.local.with_trainer(name, f"no train state of {name!r} to offload")
        with self.local.locks[name]:
            state = TrainState(pipe.export_train_state(), self.data.pop(name, {}))
        return MoveResult(t_start=t_start, t_end=wall_now(), state_bytes=state_bytes(state)), state

    def step_data(self, name: str, step: int, trajectories: Any, rewards: Any) -> Any:
        """The step's batch on this device's train state, built on first use (call holding the
        pipeline's lock)."""
        from jigsawrl.engine.pipeline import StepData

        pipe = self.local.with_trainer(name, f"the train state of {name!r} is not here")
        steps = self.data.setdefault(name, {})
        data = steps.get(step)
        if data is None:
            data = steps[step] = StepData(self.local.absolute_step(name, step), list(trajectories))
            pipe.prepare(data, list(rewards.rewards), list(rewards.infos))
        return data

    def run_stage(self, req: StageRequest, state: TrainState | None, trajectories: Any,
                  rewards: Any, helpers: list[list[Any]] | None = None,
                  tail: list[Any] | None = None) -> StageResult:
        """Run a model pass of ``req.step``.

        ``state`` (train state from the host) is onloaded first when given; ``trajectories``
        and ``rewards`` (the reward worker's result) build the step's batch on first use. With
        ``helpers`` (``[[ObjectRef, ...], [actor, ...]]``: ``dp_shard`` calls on the stage's
        other devices, rows ``req.bounds[1:]``, and those devices' workers), this device
        computes rows ``req.bounds[0]`` and combines: log-probs are gathered, gradients summed
        into one optimizer step per PPO epoch (data parallelism; a later epoch calls the
        workers again with the new weights). With ``tail`` (``ObjectRef`` s of in-tail
        log-prob calls, :mod:`.worker_tail`), a log-prob pass takes their rows and computes
        only the rows left.
        """
        import torch

        torch.set_num_threads(max(1, req.threads))
        t_start = wall_now()
        clock = CallClock().start()
        name = req.pipeline
        if state is not None:
            t_onload = time.perf_counter()
            self.onload(name, state)
            clock.onload_s = time.perf_counter() - t_onload
        timings: tuple[Timed | tuple[Timed, ...], ...] = ()
        with self.local.locks[name]:
            t_build = time.perf_counter()
            data = self.step_data(name, req.step, trajectories, rewards)
            clock.build_s = time.perf_counter() - t_build
            pipe = self.local.pipes[name]
            tokens = int(data.batch.attention_mask.sum())
            t_pass = time.perf_counter()
            if helpers and req.bounds:
                actors = list(helpers[1]) if len(helpers) > 1 else []
                result, timings = combine_shards(pipe, req, data, helpers[0], actors)
            elif tail and req.stage in (Stage.OLD_LOGPROB, Stage.REF_LOGPROB):
                kept = fill_from_tail(pipe, data, req.stage, tail)
                result = {f"perf/in_tail_rows/{req.stage}": float(kept)}
            else:
                method = {Stage.OLD_LOGPROB: pipe.old_logprob, Stage.REF_LOGPROB: pipe.ref_logprob,
                          Stage.ACTOR_UPDATE: pipe.update}[Stage(req.stage)]
                result = method(data)
            clock.pass_s = time.perf_counter() - t_pass
            if req.stage == Stage.ACTOR_UPDATE:  # the step's last pass: its batch is done
                self.data.get(name, {}).pop(req.step, None)
        metrics = dict(result) if isinstance(result, dict) else {}
        clock.stop()
        return StageResult(t_start=t_start, t_end=wall_now(), tokens=tokens, threads=req.threads,
                           metrics=metrics, helpers=timings, clock=clock.as_tuple())

    def rebuild(self, name: str, state: TrainState, passes: list[tuple[StageRequest, Any, Any]],
                synced: tuple[int, ...]) -> MoveResult:
        """Onload ``state`` and replay the model ``passes`` run on it since (the worker's
        ``rebuild``); the batches of the ``synced`` steps are dropped after."""
        moved = self.onload(name, state)
        for req, trajectories, rewards in passes:
            self.run_stage(req, None, trajectories, rewards)
        for step in synced:
            self.data.get(name, {}).pop(step, None)
        return MoveResult(t_start=moved.t_start, t_end=wall_now(), state_bytes=moved.state_bytes)

    def shard_payload(self, req: StageRequest, state: TrainState | None, trajectories: Any,
                      rewards: Any) -> tuple[Timed, ShardPayload]:
        """What the data-parallel helpers of a model pass need (call with ``num_returns=2``)."""
        t_start = wall_now()
        name = req.pipeline
        if state is not None:
            self.onload(name, state)
        with self.local.locks[name]:
            data = self.step_data(name, req.step, trajectories, rewards)
            trainer = self.local.pipes[name].trainer
            model = trainer.ref_model if req.stage == Stage.REF_LOGPROB else trainer.model
            payload = payload_of(model, data.batch, trainer.config)
        return Timed(t_start=t_start, t_end=wall_now()), payload

    def publish(self, req: PublishRequest, state: TrainState | None) -> tuple[Timed, Any]:
        """Weight sync: the actor's weights as a separate object (call with ``num_returns=2``);
        saves a checkpoint of the completed ``req.step`` when ``req.checkpoint``. With ``state``
        (the train state is in host memory) the weights are read from it without onloading it.
        """
        t_start = wall_now()
        name = req.pipeline
        due = req.checkpoint and req.ckpt_root
        with self.local.locks[name]:
            if state is not None:
                weights = {k: v.clone() for k, v in state.train["model"].items()}
                if due:
                    save_host_state(self.local.pipes.get(name) or self.local.get(name), state,
                                    Path(req.ckpt_root or ""), req.step, req.meta)
            else:
                pipe = self.local.with_trainer(name, f"no train state of {name!r} here")
                weights = pipe.actor_weights()
                if due:
                    pipe.save(Path(req.ckpt_root or ""), req.step, req.meta)
        return Timed(t_start=t_start, t_end=wall_now()), weights


def save_host_state(pipe: Any, state: TrainState, root: Path, step: int,
                    meta: dict[str, Any]) -> None:
    """A checkpoint written from a host-resident train state (same layout as ``pipe.save``)."""
    import torch

    from jigsawrl.engine.checkpoint import save_checkpoint
    from jigsawrl.engine.models import empty_model

    model = empty_model(pipe.engine.model.config)
    model.load_state_dict(state.train["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=pipe.spec.train.lr)
    opt.load_state_dict(state.train["optimizer"])
    save_checkpoint(root, step, model, opt, meta)


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a train state (what an offload moves)."""
    import dataclasses

    import torch

    total = 0
    stack: list[Any] = [state]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            # not into a list of numbers or strings (token ids, log-probs): no tensor there, and
            # walking them item by item cost 12-93 ms a move on the demo's step data (measured)
            if x and not isinstance(x[0], int | float | str | bytes):
                stack.extend(x)
        elif hasattr(x, "__dict__"):
            stack.extend(vars(x).values())
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):  # slots: TrainState
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
    return total
