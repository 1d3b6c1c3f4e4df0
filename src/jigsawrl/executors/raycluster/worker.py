"""The workers of a real run: one :class:`DeviceWorker` per logical device, one
:class:`RewardWorker` per pipeline.

What a device worker hosts: for every pipeline the scheduler has placed on its device, a
rollout-only copy of the pipeline (task, tokenizer, rollout engine; built on first use,
:mod:`.worker_pipes`) and, while the pipeline's *train state* (actor, AdamW moments, reference) is
resident here, its trainer. It runs what the executor sends, one call at a time; each call takes a
request and returns a result of :mod:`.messages`:

- ``gen_run`` / ``gen_export``: a time slice of one rollout rank, and the export of a rank's
  unfinished requests (long-tail migration) — the rollout side, :mod:`.worker_rollout`;
- ``train_stage``: ``old_logprob`` / ``ref_logprob`` / ``actor_update`` on the resident train
  state (a state passed in is onloaded first), with ``dp_export`` / ``dp_shard`` for its
  data-parallel helpers; ``offload`` / ``onload`` / ``publish``: move the train state to or from
  host memory (the Ray object store) and broadcast the actor's weights (weight sync; ``publish``
  also writes the pipeline's checkpoint when one is due) — the train side, :mod:`.worker_train`
  and :mod:`.worker_shards`;
- ``tail_pass``: in-tail log-probs of a sync rollout's finished groups on a drained rank's
  device (:mod:`.worker_tail`).

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
import os
import time
from typing import Any

import ray

from jigsawrl.engine.allocator import keep_freed_memory
from jigsawrl.executors.raycluster.messages import (
    MoveResult,
    PublishRequest,
    Resumable,
    RewardResult,
    ShardPayload,
    ShardRequest,
    ShardResult,
    SliceRequest,
    SliceResult,
    StageRequest,
    StageResult,
    TailRequest,
    TailResult,
    Timed,
    TrainInit,
    TrainState,
    WorkerInfo,
)
from jigsawrl.executors.raycluster.wire import use_numpy_wire
from jigsawrl.executors.raycluster.worker_pipes import LocalPipelines, spec_from_json, wall_now
from jigsawrl.executors.raycluster.worker_rollout import RolloutHost
from jigsawrl.executors.raycluster.worker_shards import ShardModels
from jigsawrl.executors.raycluster.worker_tail import TailHost
from jigsawrl.executors.raycluster.worker_train import TrainHost


def freeze_heap() -> float:
    """Collect once, then move every object alive now out of the garbage collector's reach
    (``gc.freeze``); returns the seconds the collection took.

    Why: a worker holds every pipeline's datasets, tokenizers, retrieval corpus and models —
    ~400k tracked objects for the bench's three pipelines — and a full (generation-2)
    collection walks all of them: 0.4 s measured in such a process, which Python starts by
    itself now and then. In real runs it struck inside a call (an onload, a rollout slice: one
    0.45-0.55 s stall in 5 of 6 `bench real` runs of the multiplexing policies, and in the
    first steps of verl's). Frozen, those objects are never walked again; what the run
    allocates later is collected as usual. Called at the end of start-up, outside the run clock.
    """
    import gc

    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - t0


class RewardFailed(RuntimeError):
    """A pipeline's reward function raised (or returned a non-number) on some samples."""


class DeviceWorker:
    """One logical device (see the module docstring): the Ray-facing calls, each handed to the
    worker's rollout side, train side or data-parallel shards.

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
        keep_freed_memory()  # a pass re-faulting memory it freed cost 40-80 ms (allocator.py)
        self.local = LocalPipelines(device, specs_json, seed, cache_dir, offsets)
        self.rollout = RolloutHost(self.local)
        self.train = TrainHost(self.local)
        self.shards = ShardModels(self.local)
        self.tail = TailHost(self.local, self.rollout.weights, self.shards)

    # ------------------------------------------------------------------ lifecycle
    def ready(self) -> WorkerInfo:
        """Where this worker runs (a call to wait on)."""
        node = ""
        with contextlib.suppress(Exception):  # in-process use (tests) has no runtime context
            node = ray.get_runtime_context().get_node_id()
        return WorkerInfo(self.local.device, os.getpid(), node)

    def warm(self) -> float:
        """Build every pipeline's rollout-only copy now (imports torch, builds datasets),
        take the slow first uses of a process, grow the heap to each pipeline's largest train
        pass (:func:`~jigsawrl.engine.warmup.warm_train_peak`), then freeze what start-up built
        out of the garbage collector's walks (:func:`freeze_heap`), so that the run clock never
        includes a worker's start-up; returns the seconds it took."""
        from jigsawrl.engine.warmup import warm_train_peak

        t0 = time.perf_counter()
        for name in self.local.specs:
            pipe = self.local.get(name)
            self.shards.get(name)
            warm_train_peak(pipe)
        self.train.warm(pipe)
        self.rollout.warm(pipe)
        freeze_heap()
        return time.perf_counter() - t0

    def probe(self) -> float:
        """Seconds of the engine's speed probe here (:mod:`jigsawrl.engine.speedprobe`): how
        fast this machine runs now, next to the profile's own probe."""
        from jigsawrl.engine.speedprobe import speed_probe_s

        return speed_probe_s()

    def preload(self, name: str, version: int, weights: Any) -> None:
        """Receive a pipeline's weights ahead of its first rollout here (start-up)."""
        self.rollout.preload(name, version, weights)

    def init_train(self, name: str, ckpt_root: str | None) -> tuple[TrainInit, TrainState]:
        """Build the pipeline with its trainer and hand its train state to the host (call with
        ``num_returns=2``)."""
        return self.train.init_train(name, ckpt_root)

    # ------------------------------------------------------------------ rollout
    def gen_run(self, req: SliceRequest, weights: Any, *incoming: list[Resumable]) -> SliceResult:
        """One time slice of a rollout rank (:meth:`.worker_rollout.RolloutHost.run_slice`)."""
        return self.rollout.run_slice(req, weights, incoming)

    def gen_export(self, name: str, step: int, rank: int,
                   indices: tuple[int, ...] | None = None) -> tuple[Resumable, ...]:
        """Abort the rank's unfinished requests (those of batch rows ``indices``, when given);
        return them with their weights versions."""
        return self.rollout.export(name, step, rank, indices)

    def tail_pass(self, req: TailRequest, ref_state: TrainState | None) -> TailResult:
        """In-tail log-probs of finished groups on this drained rank's device
        (:meth:`.worker_tail.TailHost.run`)."""
        return self.tail.run(req, ref_state)

    # ------------------------------------------------------------------ train state
    def onload(self, name: str, state: TrainState) -> MoveResult:
        return self.train.onload(name, state)

    def offload(self, name: str) -> tuple[MoveResult, TrainState]:
        return self.train.offload(name)

    def rebuild(self, name: str, state: TrainState, passes: list[tuple[Any, Any, Any]],
                synced: tuple[int, ...]) -> MoveResult:
        """Rebuild a train state lost with another worker: onload ``state`` (its restore point)
        and replay ``passes`` (``(StageRequest, trajectories ref, rewards ref)``, in order);
        the batches of the ``synced`` steps are dropped after."""
        return self.train.rebuild(name, state, [(r, ray.get(t), ray.get(w)) for r, t, w in passes],
                                  synced)

    def train_stage(self, req: StageRequest, state: TrainState | None, trajectories: Any,
                    rewards: RewardResult, helpers: list[list[Any]] | None = None,
                    tail: list[Any] | None = None) -> StageResult:
        """A model pass (:meth:`.worker_train.TrainHost.run_stage`)."""
        return self.train.run_stage(req, state, trajectories, rewards, helpers, tail)

    def dp_export(self, req: StageRequest, state: TrainState | None, trajectories: Any,
                  rewards: RewardResult) -> tuple[Timed, ShardPayload]:
        """What the data-parallel helpers of a model pass need (call with ``num_returns=2``)."""
        return self.train.shard_payload(req, state, trajectories, rewards)

    def dp_shard(self, req: ShardRequest, payload: ShardPayload) -> ShardResult:
        """A data-parallel helper's part of a model pass."""
        return self.shards.run_shard(req, payload)

    def publish(self, req: PublishRequest, state: TrainState | None) -> tuple[Timed, Any]:
        """Weight sync (and a checkpoint when due; call with ``num_returns=2``)."""
        return self.train.publish(req, state)


class RewardWorker:
    """Scores one pipeline's responses off the driver (a user reward function that hangs or
    crashes takes down only this process and this pipeline).

    Args:
        spec_json: the pipeline's ``PipelineSpec`` as JSON.
        reward_fn: ``fn(solution_str, example) -> float`` replacing the task's reward.
        strict: a reward error fails the stage (:class:`RewardFailed`) instead of scoring 0.
    """

    def __init__(self, spec_json: str, reward_fn: Any = None, strict: bool = False) -> None:
        from jigsawrl.tasks import build_task

        self.spec = spec_from_json(spec_json)
        self.task = build_task(self.spec)  # a registered task, user data, a reward file
        self.reward_fn = reward_fn
        self.strict = strict

    def ready(self) -> bool:
        """A call to wait on: the executor starts the run clock only once this process is up
        (its start-up objects frozen: :func:`freeze_heap`)."""
        freeze_heap()
        return True

    def score(self, step: int, trajectories: list[Any]) -> RewardResult:
        """The scores of the step's trajectories (in order)."""
        from types import SimpleNamespace

        from jigsawrl.tasks import safe_score

        t_start = wall_now()
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
        return RewardResult(t_start=t_start, t_end=wall_now(), rewards=tuple(rewards),
                            infos=tuple(infos))


# num_cpus=0: a logical device is not a Ray CPU (cpu-notes.md: an actor reserves one CPU by
# default, and a third one on a 2-CPU machine would hang); max_restarts=0: the executor replaces
# a dead device worker itself (it knows which requests were lost).
# concurrency_groups: "control" (publish, and an offload beside another pipeline's call) runs
# beside the default group's one call at a time, so a weight sync does not wait behind another
# pipeline's rollout slice on the same device.
DeviceActor = ray.remote(num_cpus=0, max_restarts=0,
                         concurrency_groups={"control": 1})(DeviceWorker)
RewardActor = ray.remote(num_cpus=0, max_restarts=0)(RewardWorker)
