"""The workers of a real run: one :class:`DeviceWorker` per logical device, one
:class:`RewardWorker` per pipeline.

What a device worker hosts: for every pipeline the scheduler has placed on its device, a
rollout-only copy of the pipeline (task, tokenizer, rollout engine; built on first use) and,
while the pipeline's *train state* (actor, AdamW moments, reference) is resident here, its
trainer. It runs what the executor sends, one call at a time:

- ``gen_run``: a time slice (``budget_s``) of one rollout rank: new requests, requests migrated
  here (``incoming``, already resolved by Ray) or fresh weights are taken in first, then the
  rank's :class:`~jigsawrl.engine.session.RolloutSession` runs; the slice returns the
  trajectories that finished, the rank's unfinished count, decode width and context tokens, and,
  when asked (``checkpoint``), a snapshot of its unfinished requests (the executor resumes them
  from it if this worker dies);
- ``gen_export``: abort a rank's unfinished requests and hand them over (long-tail migration);
- ``train_stage``: ``old_logprob`` / ``ref_logprob`` / ``actor_update`` on the resident train
  state (a state passed in is onloaded first);
- ``offload`` / ``onload`` / ``publish``: move the train state to or from host memory (the Ray
  object store) and broadcast the actor's weights (weight sync); ``publish`` also writes the
  pipeline's checkpoint when one is due.

Why one process per device that time-slices between pipelines: on a GPU, co-located pipelines
are separate processes sharing the device's SMs (MPS / green contexts); on this CPU a logical
device is one process with a torch-thread budget, and the executor interleaves the pipelines'
calls on it in short slices. Heavy results (train states, weights) are returned as separate
Ray objects (``num_returns=2``) so they stay in the object store, owned by the driver, and
survive the worker.

Imported only where ``ray`` is installed (``executors/raycluster/``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from jigsawrl.executors.raycluster.wire import use_numpy_wire

log = logging.getLogger(__name__)


class RewardFailed(RuntimeError):
    """A pipeline's reward function raised (or returned a non-number) on some samples."""


def _spec(spec_json: str) -> Any:
    from jigsawrl.config import PipelineSpec

    return PipelineSpec.model_validate_json(spec_json)


def _now() -> float:
    return time.time()  # wall clock: comparable between the driver and workers of one machine


@dataclass
class _Rank:
    """One rollout rank's live state on this device."""

    session: Any
    version: int  # the weights version its engine holds
    versions: dict[str, int] = field(default_factory=dict)  # request id -> weights version


class DeviceWorker:
    """One logical device (see the module docstring).

    Args:
        device: the device index (for logs and errors).
        specs_json: pipeline name -> its ``PipelineSpec`` as JSON.
        seed: the experiment seed.
        cache_dir: warm-start cache (None: the engine's default).
        offsets: pipeline name -> steps already done before this run (``--resume``).
    """

    def __init__(self, device: int, specs_json: dict[str, str], seed: int,
                 cache_dir: str | None = None, offsets: dict[str, int] | None = None) -> None:
        use_numpy_wire()  # weights, train states, payloads and gradients leave as numpy buffers
        self.device = device
        self.specs = {name: _spec(js) for name, js in specs_json.items()}
        self.seed = seed
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.offsets = dict(offsets or {})
        self.pipes: dict[str, Any] = {}  # name -> RealPipeline (rollout-only or with trainer)
        self.weights: dict[str, tuple[int, Any]] = {}  # name -> newest (version, weights) here
        self.ranks: dict[tuple[str, int, int], _Rank] = {}
        self.data: dict[str, dict[int, Any]] = {}  # name -> step -> StepData (train side)
        self.dp_models: dict[str, Any] = {}  # name -> model of data-parallel helper calls
        # publish runs in the "control" concurrency group, beside a rollout slice; a pipeline's
        # train-state methods take its lock so a publish never reads a state being changed
        self._locks = {name: threading.Lock() for name in self.specs}

    # ------------------------------------------------------------------ lifecycle
    def ready(self) -> dict[str, Any]:
        """Where this worker runs (a call to wait on)."""
        node = ""
        with contextlib.suppress(Exception):  # in-process use (tests) has no runtime context
            node = ray.get_runtime_context().get_node_id()
        return {"device": self.device, "pid": os.getpid(), "node_id": node}

    def warm(self) -> float:
        """Build every pipeline's rollout-only copy now (imports torch, builds datasets), so
        that the run clock never includes a worker's start-up; returns the seconds it took."""
        import torch

        t0 = time.perf_counter()
        for name in self.specs:
            pipe = self._pipe(name)
            self._dp_model(name)
        # First uses in a process are slow (lazy imports, the autograd and optimizer code paths:
        # ~0.4 s for the first onload in a fresh worker, measured); pay them here, once.
        model = pipe.engine.model
        opt = torch.optim.AdamW(model.parameters(), lr=0.0)
        ids = torch.ones((1, 4), dtype=torch.long)
        model.train()
        model(input_ids=ids, use_cache=False).logits.float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        pipe.import_train_state({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                 "ref": None})
        pipe.export_train_state()
        model.eval()
        self._warm_rollout(pipe)
        return time.perf_counter() - t0

    @staticmethod
    def _warm_rollout(pipe: Any) -> None:
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

    def preload(self, name: str, version: int, weights: Any) -> None:
        """Receive a pipeline's weights ahead of its first rollout here (start-up)."""
        self.weights[name] = (version, weights["train"]["model"] if "train" in weights
                              else weights)

    def _pipe(self, name: str) -> Any:
        """The pipeline's rollout-only copy here, built on first use."""
        pipe = self.pipes.get(name)
        if pipe is None:
            from jigsawrl.engine.pipeline import RealPipeline

            pipe = RealPipeline(self.specs[name], self.seed, cache_dir=self.cache_dir)
            pipe.start(train=False)
            self.pipes[name] = pipe
        return pipe

    def init_train(self, name: str, ckpt_root: str | None) -> tuple[dict[str, Any], Any]:
        """Build the pipeline with its trainer (warm start; the latest checkpoint under
        ``ckpt_root`` if given), then hand the train state to the host.

        Returns:
            ``(info, state)``: info has ``start_s``, ``resumed_step`` (-1 if none) and
            ``history``; ``state`` is the train state (call with ``num_returns=2``).
        """
        from jigsawrl.engine.pipeline import RealPipeline

        t0 = time.perf_counter()
        pipe = RealPipeline(self.specs[name], self.seed, cache_dir=self.cache_dir)
        pipe.start(train=True)
        meta = pipe.restore(Path(ckpt_root)) if ckpt_root else None
        state = {"train": pipe.export_train_state(), "steps": {}}
        self.pipes.setdefault(name, pipe)
        info = {"start_s": time.perf_counter() - t0,
                "resumed_step": int(meta["step"]) if meta else -1,
                "history": list(meta.get("history", [])) if meta else []}
        return info, state

    # ------------------------------------------------------------------ rollout
    def gen_run(self, name: str, step: int, rank: int, budget_s: float, threads: int,
                fresh: list[int], weights: Any, version: int, force_reload: bool,
                checkpoint: bool, *incoming: list[Any]) -> dict[str, Any]:
        """Run one time slice of rollout rank ``(name, step, rank)``.

        Each rank has its own engine, loaded with the pipeline's newest weights on this device
        when the rank starts; it keeps them for the whole rollout (on-policy for its version)
        unless ``force_reload``.

        Args:
            fresh: indices (into the step's request list) to start here.
            weights: the pipeline's newest weights (a state dict, or a host train state holding
                them), sent when this device has an older version; None otherwise.
            version: the version of ``weights``.
            force_reload: reload the newest weights now (AReaL's interruption: the KV caches
                are dropped and every running request is re-prefilled).
            checkpoint: return ``"checkpoint"``: the rank's unfinished requests after the slice
                (``RolloutSession.snapshot``) as ``(ExportedRequest, weights version)`` pairs,
                like :meth:`gen_export` but leaving them running; [] when not asked (it costs
                ~2 ms and ~130 KB for 16 requests × 200 tokens, so the executor asks only every
                ``checkpoint_s``).
            incoming: lists of ``(ExportedRequest, weights version)`` migrated here
                (:meth:`gen_export` of another rank).
        """
        import torch

        torch.set_num_threads(max(1, threads))
        t_start = _now()
        pipe = self._pipe(name)
        if weights is not None:
            self.preload(name, version, weights)
        key = (name, step, rank)
        rk = self.ranks.get(key) or self._new_rank(key, pipe)
        if force_reload and self.weights[name][0] != rk.version:
            rk.session.load_weights(self.weights[name][1])
            rk.version = self.weights[name][0]
        if fresh:
            reqs = pipe.step_requests(step + self.offsets.get(name, 0))
            for i in fresh:
                example, req = reqs[i]
                rk.session.add(example, req)
                rk.versions[req.request_id] = rk.version
        for items in incoming:
            for item, item_version in items:
                rk.session.add_exported(item)
                rk.versions[item.state.request_id] = item_version
        engine = rk.session.engine
        t_setup = _now()
        stats0 = engine.stats
        finished = rk.session.run(budget_s, idle_return=True)
        stats1 = engine.stats
        out = {"trajectories": finished,
               "versions": [rk.versions.pop(t.request_id, -1) for t in finished],
               "unfinished": rk.session.unfinished, "decoding": rk.session.decoding,
               "ctx_tokens": rk.session.ctx_tokens(), "next_ready_s": rk.session.next_ready_s,
               "tokens": (stats1.prefill_tokens - stats0.prefill_tokens
                          + stats1.decode_tokens - stats0.decode_tokens),
               # mean decode width of the slice's iterations: what names its band
               "width": round((stats1.decode_tokens - stats0.decode_tokens)
                              / max(1, stats1.iterations - stats0.iterations)),
               "t_start": t_start, "t_end": _now(), "threads": threads,
               "setup_s": t_setup - t_start,
               "checkpoint": self._versioned(rk, rk.session.snapshot()) if checkpoint else []}
        if rk.session.done():
            del self.ranks[key]
        return out

    def _new_rank(self, key: tuple[str, int, int], pipe: Any) -> _Rank:
        from jigsawrl.engine.session import RolloutSession

        name = key[0]
        if name not in self.weights:
            raise RuntimeError(f"device {self.device}: no weights of {name!r} received yet")
        version, weights = self.weights[name]
        engine = pipe.new_engine(weights)
        rk = self.ranks[key] = _Rank(RolloutSession(
            engine, pipe.tokenizer, pipe.task, extra_latency_s=pipe.spec.rollout.tool_latency_s),
            version)
        return rk

    def gen_export(self, name: str, step: int, rank: int) -> list[tuple[Any, int]]:
        """Abort the rank's unfinished requests; return them with their weights versions."""
        rk = self.ranks.pop((name, step, rank), None)
        if rk is None:
            return []
        items = self._versioned(rk, rk.session.export())
        log.info("device %d: exported %d requests of %s/%d rank %d", self.device, len(items),
                 name, step, rank)
        return items

    @staticmethod
    def _versioned(rk: _Rank, items: list[Any]) -> list[tuple[Any, int]]:
        """Exported requests paired with the weights version that generated them (kept when
        they resume elsewhere, so the samples' version accounting stays right)."""
        return [(item, rk.versions.get(item.state.request_id, -1)) for item in items]

    # ------------------------------------------------------------------ train state
    def onload(self, name: str, state: dict[str, Any]) -> dict[str, Any]:
        """Make ``state`` (from host memory) this device's resident train state of ``name``."""
        t_start = _now()
        pipe = self._pipe(name)
        with self._locks[name]:
            pipe.import_train_state(state["train"])
            self.data[name] = dict(state.get("steps", {}))
        return {"t_start": t_start, "t_end": _now(), "bytes": _state_bytes(state)}

    def offload(self, name: str) -> tuple[dict[str, Any], Any]:
        """Move the resident train state of ``name`` (and its in-flight step data) to the host.

        Returns ``(info, state)`` (call with ``num_returns=2``)."""
        t_start = _now()
        pipe = self.pipes.get(name)
        if pipe is None or not pipe.has_trainer:
            raise RuntimeError(f"device {self.device}: no train state of {name!r} to offload")
        with self._locks[name]:
            state = {"train": pipe.export_train_state(), "steps": self.data.pop(name, {})}
        return {"t_start": t_start, "t_end": _now(), "bytes": _state_bytes(state)}, state

    def _step_data(self, name: str, step: int, trajectories: Any, rewards: Any) -> Any:
        """The step's batch on this device's train state, built on first use."""
        from jigsawrl.engine.pipeline import StepData

        pipe = self.pipes.get(name)
        if pipe is None or not pipe.has_trainer:
            raise RuntimeError(f"device {self.device}: the train state of {name!r} is not here")
        steps = self.data.setdefault(name, {})
        data = steps.get(step)
        if data is None:
            data = steps[step] = StepData(step + self.offsets.get(name, 0), list(trajectories))
            pipe.prepare(data, rewards["rewards"], rewards["infos"])
        return data

    def train_stage(self, name: str, stage: str, step: int, threads: int, state: Any,
                    trajectories: Any, rewards: Any, helpers: list[list[Any]] | None = None,
                    bounds: list[tuple[int, int]] | None = None) -> dict[str, Any]:
        """Run ``old_logprob`` / ``ref_logprob`` / ``actor_update`` of ``step``.

        ``state`` (train state from the host) is onloaded first when given; ``trajectories``
        and ``rewards`` (the reward worker's result) build the step's batch on first use. With
        ``helpers`` (``[[ObjectRef, ...]]``: :meth:`dp_shard` calls on the stage's other devices,
        rows ``bounds[1:]``), this device computes rows ``bounds[0]`` and combines: log-probs
        are gathered, gradients summed into one optimizer step (data parallelism).
        """
        import torch

        torch.set_num_threads(max(1, threads))
        t_start = _now()
        if state is not None:
            self.onload(name, state)
        with self._locks[name]:
            data = self._step_data(name, step, trajectories, rewards)
            pipe = self.pipes[name]
            out: dict[str, Any] = {"threads": threads,
                                   "tokens": int(data.batch.attention_mask.sum())}
            if helpers and bounds:
                result, out["helpers"] = self._data_parallel(pipe, stage, data, helpers[0],
                                                             bounds)
            else:
                method = {"old_logprob": pipe.old_logprob, "ref_logprob": pipe.ref_logprob,
                          "actor_update": pipe.update}[stage]
                result = method(data)
        if stage == "actor_update":
            out["metrics"] = dict(result)
        out.update(t_start=t_start, t_end=_now())
        return out

    def _data_parallel(self, pipe: Any, stage: str, data: Any, helpers: list[Any],
                       bounds: list[tuple[int, int]]) -> tuple[Any, list[dict[str, Any]]]:
        """This device's shard plus the helpers' (see :meth:`train_stage`); returns the
        stage's result and the helpers' timings (``t_start``, ``t_end``, ``tokens``)."""
        import torch

        from jigsawrl.engine.trainer import compute_logprobs

        batch, trainer = data.batch, pipe.trainer
        own = batch.slice(*bounds[0])
        got: list[dict[str, Any]] = []

        def fetch() -> list[dict[str, Any]]:
            got.extend(ray.get(helpers))
            return got

        timings = lambda: [{k: r[k] for k in ("t_start", "t_end", "tokens")}  # noqa: E731
                           for r in got]
        if stage == "actor_update":
            total = float(batch.loss_mask.sum())
            metrics = trainer.update_data_parallel(own, total,
                                                   lambda: [r["grads"] for r in fetch()])
            data.metrics.update(metrics)
            return metrics, timings()
        model = trainer.ref_model if stage == "ref_logprob" else trainer.model
        parts = [compute_logprobs(model, own, trainer.config.micro_batch_size)]
        parts += [r["logprobs"] for r in fetch()]
        full = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
        for (start, stop), lp in zip(bounds, parts, strict=True):
            full[start:stop, : lp.shape[1]] = lp
        if stage == "ref_logprob":
            batch.ref_logprobs = full
        else:
            batch.old_logprobs = full
        return None, timings()

    def dp_export(self, name: str, stage: str, step: int, state: Any, trajectories: Any,
                  rewards: Any) -> tuple[dict[str, Any], Any]:
        """What the data-parallel helpers of a stage need: the model's weights (the actor, or
        the reference for ``ref_logprob``), the step's batch and the trainer config.

        Returns ``(info, payload)`` (call with ``num_returns=2``)."""
        t_start = _now()
        if state is not None:
            self.onload(name, state)
        with self._locks[name]:
            data = self._step_data(name, step, trajectories, rewards)
            trainer = self.pipes[name].trainer
            model = trainer.ref_model if stage == "ref_logprob" else trainer.model
            payload = {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
                       "batch": data.batch, "config": trainer.config}
        return {"t_start": t_start, "t_end": _now()}, payload

    def dp_shard(self, name: str, stage: str, start: int, stop: int, threads: int,
                 payload: dict[str, Any]) -> dict[str, Any]:
        """A data-parallel helper's part of a stage: rows ``start:stop`` of the payload's batch
        (log-probs, or the update's gradients over the whole batch's token count)."""
        import torch

        from jigsawrl.engine.trainer import compute_logprobs, shard_grads

        torch.set_num_threads(max(1, threads))
        t_start = _now()
        model = self._dp_model(name)
        model.load_state_dict(payload["weights"])
        batch, cfg = payload["batch"], payload["config"]
        shard = batch.slice(start, stop)
        out: dict[str, Any] = {}
        if stage == "actor_update":
            out["grads"] = shard_grads(model, shard, float(batch.loss_mask.sum()), cfg)
        else:
            out["logprobs"] = compute_logprobs(model, shard, cfg.micro_batch_size)
        out.update(t_start=t_start, t_end=_now(),
                   tokens=int(shard.attention_mask.sum()))
        return out

    def _dp_model(self, name: str) -> Any:
        """The model data-parallel helper calls of ``name`` load weights into (built once)."""
        model = self.dp_models.get(name)
        if model is None:
            from jigsawrl.engine.pipeline import build_model_and_tokenizer

            model = self.dp_models[name] = build_model_and_tokenizer(
                self.specs[name].model, self.seed)[0]
        return model

    def publish(self, name: str, step: int, state: Any, ckpt_root: str | None,
                checkpoint: bool, meta: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """Weight sync: the actor's weights as a separate object; saves a checkpoint of the
        completed ``step`` when ``checkpoint``. With ``state`` (the train state is in host
        memory) the weights are read from it without onloading it.

        Returns ``(info, weights)`` (call with ``num_returns=2``)."""
        t_start = _now()
        with self._locks[name]:
            pipe = self.pipes.get(name)
            if state is not None:
                weights = {k: v.clone() for k, v in state["train"]["model"].items()}
                if checkpoint and ckpt_root:
                    _save_host_state(pipe or self._pipe(name), state, Path(ckpt_root), step,
                                     meta)
            else:
                if pipe is None or not pipe.has_trainer:
                    raise RuntimeError(f"device {self.device}: no train state of {name!r} here")
                weights = pipe.actor_weights()
                if checkpoint and ckpt_root:
                    pipe.save(Path(ckpt_root), step, meta)
            self.data.get(name, {}).pop(step, None)  # the step is over
        return {"t_start": t_start, "t_end": _now()}, weights


def _save_host_state(pipe: Any, state: dict[str, Any], root: Path, step: int,
                     meta: dict[str, Any]) -> None:
    """A checkpoint written from a host-resident train state (same layout as ``pipe.save``)."""
    import torch

    from jigsawrl.engine.checkpoint import save_checkpoint
    from jigsawrl.engine.pipeline import build_model_and_tokenizer

    model, _ = build_model_and_tokenizer(pipe.spec.model, pipe.seed)
    model.load_state_dict(state["train"]["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=pipe.spec.train.lr)
    opt.load_state_dict(state["train"]["optimizer"])
    save_checkpoint(root, step, model, opt, meta)


def _state_bytes(state: dict[str, Any]) -> int:
    """Bytes of the tensors in a train state (what an offload moves)."""
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
            stack.extend(x)
        elif hasattr(x, "__dict__"):
            stack.extend(vars(x).values())
    return total


class RewardWorker:
    """Scores one pipeline's responses off the driver (a user reward function that hangs or
    crashes takes down only this process and this pipeline).

    Args:
        spec_json: the pipeline's ``PipelineSpec`` as JSON.
        reward_fn: ``fn(solution_str, example) -> float`` replacing the task's reward.
        strict: a reward error fails the stage (:class:`RewardFailed`) instead of scoring 0.
    """

    def __init__(self, spec_json: str, reward_fn: Any = None, strict: bool = True) -> None:
        from jigsawrl.tasks import get_task

        self.spec = _spec(spec_json)
        self.task = get_task(self.spec.task, **self.spec.rollout.task_params)
        self.reward_fn = reward_fn
        self.strict = strict

    def ready(self) -> bool:
        """A call to wait on: the executor starts the run clock only once this process is up."""
        return True

    def score(self, step: int, trajectories: list[Any]) -> dict[str, Any]:
        """``{"rewards", "infos", "t_start", "t_end"}`` for the step's trajectories (in order)."""
        from types import SimpleNamespace

        from jigsawrl.tasks import safe_score

        t_start = _now()
        rewards, infos = [], []
        fn = self.reward_fn
        for t in trajectories:
            task: Any = self.task
            if fn is not None:
                task = SimpleNamespace(name=self.spec.task, compute_score=lambda *_a, _t=t, **_k:
                                       fn(_t.response_text, _t.example))
            score, info = safe_score(task, t.response_text, t.example)
            rewards.append(score)
            infos.append(info)
        errors = [i["error"] for i in infos if "error" in i]
        if errors and self.strict:
            raise RewardFailed(f"{self.spec.name} step {step}: the reward function failed on "
                               f"{len(errors)} of {len(infos)} samples; first: {errors[0]}")
        return {"rewards": rewards, "infos": infos, "t_start": t_start, "t_end": _now()}


# num_cpus=0: a logical device is not a Ray CPU (cpu-notes.md: an actor reserves one CPU by
# default, and a third one on a 2-CPU machine would hang); max_restarts=0: the executor replaces
# a dead device worker itself (it knows which requests were lost).
# concurrency_groups: "control" (publish) runs beside the default group's one call at a time,
# so a weight sync does not wait behind another pipeline's rollout slice on the same device.
DeviceActor = ray.remote(num_cpus=0, max_restarts=0,
                         concurrency_groups={"control": 1})(DeviceWorker)
RewardActor = ray.remote(num_cpus=0, max_restarts=0)(RewardWorker)
