"""The Ray executor: the driver's tasks run for real on one worker actor per logical device.

What: :class:`RayExecutor` implements :class:`~jigsawrl.driver.protocol.Executor` (read
``executors/simulated.py`` for the reference semantics) on
:class:`~jigsawrl.executors.raycluster.worker.DeviceWorker` actors (one per device, pinned to a
placement-group bundle) and one :class:`~jigsawrl.executors.raycluster.worker.RewardWorker`
per pipeline:

- a rollout runs as ``len(devices) // tp`` ranks; each rank advances in time slices
  (``chunk_s``) on its device's worker, and after every slice the executor emits the
  trajectories that finished (``SampleFinished``), a :class:`RankProgress` when the rank's
  unfinished count changed, and a span of the slice's decode band. A rank whose requests all wait
  for tools gives its device back until the first is ready;
- ``migrate`` aborts the source ranks' unfinished requests after their current slice
  (``gen_export``) and resumes them on the destination rank (its next slice takes the exported
  requests: re-prefill of prompt + generated tokens); ``interrupt`` makes every rank reload the
  pipeline's newest weights at its next slice (KV caches dropped, requests re-prefilled);
- ``reward`` runs on the pipeline's reward worker; ``old_logprob``/``ref_logprob``/
  ``actor_update`` run on the device holding the pipeline's train state (moved there first when
  the scheduler chose other devices: offload to the object store, onload); ``weight_sync``
  publishes the actor's weights as a new version (and writes a checkpoint when due); engines
  load a newer version at the start of their next slice; ``offload``/``onload`` move the train
  state between a device and host memory for real, and a device over its memory budget first
  offloads its least recently used train states;
- every ``checkpoint_s`` of a rank's rollout, its next slice also returns a snapshot of its
  unfinished requests; the executor keeps the latest one of each request until it finishes;
- a device worker that dies is replaced on the same bundle and the requests it owned go to a
  live rank of the same rollout: resumed from their latest checkpoint (the tokens generated
  since are generated again), or regenerated from their prompt when they have none
  (``recovered`` counts both); a pipeline whose train state was on it fails with a clear error
  (``--resume`` restarts it from its last checkpoint); any other failed call fails only its
  pipeline.

Compute shares (CPU): ``threads = max(1, round(share × threads_per_device × len(devices)))``
torch threads for the call — the counterpart of an SM share on a GPU (MPS
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / green contexts would take ``share × sm_count``). A
:meth:`set_share` applies from the task's next call (a rollout's next slice); calls of several
pipelines on one device run one after another, so co-located work time-slices the device.

Times: workers report wall-clock start/end of each call; spans use them (queueing on a busy
worker is not counted as busy time). Ray start-up, worker creation and warm starts happen in
:meth:`start` and are excluded from the run clock (``startup_s``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray

from jigsawrl.driver.protocol import Notification, RankProgress, TaskDone, TaskFailed
from jigsawrl.events import Event, SampleFinished, Span
from jigsawrl.executors.raycluster.placement import Reservation, connect
from jigsawrl.executors.raycluster.rollouts import (
    RankRT,
    RolloutRT,
    dispatch,
    request_index,
    shard_bounds,
)
from jigsawrl.executors.raycluster.worker import DeviceActor, RewardActor
from jigsawrl.scheduler.base import (
    ROLLOUT,
    Interrupt,
    Migrate,
    SetShare,
    StartRollout,
    StartStage,
    task_id,
)
from jigsawrl.sim.rollout import decode_band
from jigsawrl.workload.experiment import Experiment

log = logging.getLogger(__name__)

CHUNK_S = 0.2  # a rollout rank's time slice: short enough to react, long vs Ray's ~2 ms a call
# A rank's requests are snapshot for fault recovery about once a second of its rollout: a snapshot
# of 16 requests × 200 tokens costs ~2 ms (+ ~130 KB through Ray; docs/RAY.md), ~1% of a 0.2 s
# slice if taken every slice, ~0.2% this way; a dead worker costs at most ~1 s of decoding.
CHECKPOINT_S = 1.0
TRAIN_STAGES = ("old_logprob", "ref_logprob", "actor_update")
FLOPS_PER_TOKEN = {ROLLOUT: 2.0, "old_logprob": 2.0, "ref_logprob": 2.0, "actor_update": 6.0}
BYTES_PER_PARAM_TRAIN = 16  # fp32 weights + grads + two AdamW moments (estimate until measured)


def rollout_band(decoding: int) -> str:
    """The decode band of a slice whose engine batch held ``decoding`` requests."""
    return decode_band(decoding) if decoding > 0 else "tool_wait"


@dataclass(eq=False)
class _Dev:
    index: int
    actor: Any
    node_id: str = ""
    resident: dict[str, int] = field(default_factory=dict)  # pipeline -> train-state bytes (LRU)
    versions: dict[str, int] = field(default_factory=dict)  # pipeline -> engine weights version


@dataclass(eq=False)
class _Pipe:
    """Where a pipeline's state is and what its steps produced (executor side)."""

    name: str
    spec: Any
    num_params: int
    offset: int = 0  # steps done before this run (resume)
    reward: Any = None
    loc: int | None = None  # device holding the train state; None: host (``host_ref``)
    host_ref: Any = None
    weights_ref: Any = None  # newest weights (or a host train state holding them)
    version: int = 0
    state_bytes: int = 0
    lost: str | None = None
    trajs: dict[int, Any] = field(default_factory=dict)  # step -> ObjectRef of trajectories
    rewards: dict[int, Any] = field(default_factory=dict)  # step -> ObjectRef of reward result
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)  # absolute step -> metrics


@dataclass(eq=False)
class _Call:
    """One in-flight worker call the executor waits on."""

    kind: str  # "chunk" | "stage" | "move"
    pipeline: str
    step: int
    stage: str
    devices: tuple[int, ...]
    share: float
    tid: str | None = None
    rollout: RolloutRT | None = None
    rank: RankRT | None = None
    extra: Any = None


class RayExecutor:
    """Runs an experiment's tasks on Ray device workers (see the module docstring).

    Args:
        exp: the resolved experiment (``experiments.resolve.resolve_real``).
        address: a running Ray cluster (``"auto"`` or ``host:port``); None starts a local one.
        threads_per_device: torch threads a full share of one logical device maps to.
        cache_dir: warm-start cache passed to every worker (None: the engine's default).
        reward_fns: pipeline name -> reward function override (tests inject failures).
        strict_rewards: a reward that raises fails its pipeline (default); False scores it 0.
        num_cpus: CPUs a local Ray declares (None: ``os.cpu_count()``); workers ask for none.
        ckpt_dir: checkpoints go to ``ckpt_dir/<pipeline>`` (None: no checkpoints).
        offsets: pipeline -> steps already done (resume: each restores its latest checkpoint).
        device_mem_bytes: per-device memory budget for train states (default: the accelerator's).
        chunk_s: a rollout rank's time slice.
        checkpoint_s: how often (seconds of a rank's rollout) a slice also returns a snapshot of
            the rank's unfinished requests (0: every slice).
        data_parallel: split log-prob and update stages over their devices' workers (False:
            one worker with all the devices' threads).
    """

    def __init__(self, exp: Experiment, *, address: str | None = None, threads_per_device: int = 1,
                 cache_dir: Path | None = None,
                 reward_fns: Mapping[str, Callable[[str, Any], float]] | None = None,
                 strict_rewards: bool = True, num_cpus: int | None = None,
                 ckpt_dir: Path | None = None, offsets: Mapping[str, int] | None = None,
                 device_mem_bytes: float | None = None, chunk_s: float = CHUNK_S,
                 checkpoint_s: float = CHECKPOINT_S, data_parallel: bool = True) -> None:
        if threads_per_device < 1:
            raise ValueError(f"threads_per_device must be >= 1, got {threads_per_device}")
        if chunk_s <= 0:
            raise ValueError(f"chunk_s must be > 0, got {chunk_s}")
        if checkpoint_s < 0:
            raise ValueError(f"checkpoint_s must be >= 0, got {checkpoint_s}")
        self.exp = exp
        self.address = address
        self.threads_per_device = threads_per_device
        self.cache_dir = cache_dir
        self.reward_fns = dict(reward_fns or {})
        self.strict_rewards = strict_rewards
        self.num_cpus = num_cpus
        self.ckpt_dir = ckpt_dir
        self.offsets = dict(offsets or {})
        self.mem_budget = float(device_mem_bytes or exp.accelerator.hbm_bytes)
        self.chunk_s = chunk_s
        self.checkpoint_s = checkpoint_s
        self.data_parallel = data_parallel
        self.startup_s = 0.0
        self.moves: list[dict[str, Any]] = []  # measured offload/onload: bytes, seconds
        self.replaced_devices: list[int] = []
        # requests of dead workers: resumed from a checkpoint, regenerated from the prompt, and
        # the sampled tokens the resumed ones kept
        self.recovered = {"resumed": 0, "regenerated": 0, "tokens_kept": 0}
        self._t0: float | None = None
        self._t0_wall = 0.0
        self._started_ray = False
        self._res: Reservation | None = None
        self._devs: list[_Dev] = []
        self._node_ids: list[str] = []
        self._pipes: dict[str, _Pipe] = {}
        self._calls: dict[Any, _Call] = {}  # info ObjectRef -> call
        self._rollouts: dict[str, RolloutRT] = {}
        self._instant: list[Notification] = []
        self._notes: list[Notification] = []
        self._events: list[Event] = []

    # ------------------------------------------------------------------ lifecycle
    @property
    def now_s(self) -> float:
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    @property
    def pipeline_metrics(self) -> dict[str, list[dict[str, float]]]:
        """Per pipeline, the metrics of each finished step (absolute step numbers)."""
        return {n: [{"step": s, **m} for s, m in sorted(p.metrics.items())]
                for n, p in self._pipes.items()}

    def device_nodes(self) -> list[str]:
        """The Ray node id of each device's worker (as placed at start)."""
        return list(self._node_ids)

    def start(self) -> None:
        """Start (or join) Ray, place one worker per device, build every pipeline's train state
        (warm start or checkpoint) in host memory. A pipeline that cannot be built fails at its
        first task; if Ray itself fails, what was started is stopped and the error raised."""
        t0 = time.monotonic()
        try:
            self._started_ray = connect(self.address, self.exp.num_devices, self.num_cpus)
            self._res = Reservation(self.exp.num_devices)
            self._devs = [self._new_device(i) for i in range(self.exp.num_devices)]
            for dev, info in zip(self._devs, ray.get([d.actor.ready.remote()
                                                      for d in self._devs]), strict=True):
                dev.node_id = info["node_id"]
            self._node_ids = [d.node_id for d in self._devs]
            self._init_pipelines()
            rewards_up = [(p, p.reward.ready.remote()) for p in self._pipes.values()]
            ray.get([d.actor.warm.remote() for d in self._devs])
            self._await_rewards(rewards_up)
            self._preload_weights()
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - t0
        self._t0 = time.monotonic()
        self._t0_wall = time.time()
        log.info("ray executor ready: %d device workers, %d pipelines in %.1f s",
                 len(self._devs), len(self._pipes), self.startup_s)

    def _new_device(self, index: int) -> _Dev:
        assert self._res is not None
        specs = {p.spec.name: p.spec.model_dump_json() for p in self.exp.pipelines}
        actor = DeviceActor.options(**self._res.options(index)).remote(
            index, specs, self.exp.config.seed, str(self.cache_dir) if self.cache_dir else None,
            self.offsets)
        return _Dev(index, actor)

    def _init_pipelines(self) -> None:
        assert self._res is not None
        pending = []
        for i, p in enumerate(self.exp.pipelines):
            name = p.spec.name
            pipe = self._pipes[name] = _Pipe(name, p.spec, p.model.num_params,
                                             offset=self.offsets.get(name, 0))
            pipe.version = pipe.offset
            pipe.state_bytes = p.model.num_params * BYTES_PER_PARAM_TRAIN
            pipe.reward = RewardActor.options(**self._res.host_options()).remote(
                p.spec.model_dump_json(), self.reward_fns.get(name), self.strict_rewards)
            ckpt = str(self.ckpt_dir / name) if self.ckpt_dir and pipe.offset else None
            dev = self._devs[i % len(self._devs)]
            info_ref, state_ref = dev.actor.init_train.options(num_returns=2).remote(name, ckpt)
            pipe.host_ref = pipe.weights_ref = state_ref
            pending.append((pipe, info_ref))
        for pipe, ref in pending:
            try:
                info = ray.get(ref)
                pipe.metrics = {k: dict(m) for k, m in enumerate(info["history"])}
                log.info("%s built in %.1f s (resumed at step %d)", pipe.name, info["start_s"],
                         info["resumed_step"])
            except Exception as exc:  # noqa: BLE001 - reported as this pipeline's failure
                pipe.lost = f"could not start: {_first_line(exc)}"
                log.error("pipeline %s %s", pipe.name, pipe.lost)

    def _await_rewards(self, calls: list[tuple[_Pipe, Any]]) -> None:
        """Wait until every reward worker's process is up, so that the run clock starts with
        no process still importing (three of them starting measured ~0.4 s added to the first
        rollout slice); one that cannot start fails its pipeline only."""
        for pipe, ref in calls:
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - reported as this pipeline's failure
                pipe.lost = pipe.lost or f"its reward worker could not start: {_first_line(exc)}"
                log.error("pipeline %s %s", pipe.name, pipe.lost)

    def _preload_weights(self) -> None:
        """Every device receives every pipeline's first weights now, so that no rollout's
        first slice pays the transfer (measured ~0.4 s for the first one of a worker)."""
        calls = []
        for pipe in self._pipes.values():
            if pipe.lost is None:
                for dev in self._devs:
                    calls.append(dev.actor.preload.remote(pipe.name, pipe.version,
                                                          pipe.weights_ref))
                    dev.versions[pipe.name] = pipe.version
        ray.get(calls)

    def close(self) -> None:
        """Stop the workers; shut Ray down if this executor started it."""
        for actor in [d.actor for d in self._devs] + [p.reward for p in self._pipes.values()]:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(actor)
        self._devs = []
        if self._res is not None:
            self._res.release()
            self._res = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def kill_device(self, index: int) -> None:
        """Kill a device's worker process (fault-injection hook for tests and drills)."""
        ray.kill(self._devs[index].actor, no_restart=True)

    # ------------------------------------------------------------------ actions
    def launch(self, action: StartRollout | StartStage) -> None:
        stage = ROLLOUT if isinstance(action, StartRollout) else action.stage
        tid = task_id(action.pipeline, action.step, stage)
        pipe = self._pipes[action.pipeline]
        if pipe.lost is not None:
            self._instant.append(TaskFailed(tid, pipe.name, action.step, stage, self.now_s,
                                            pipe.lost))
            return
        if isinstance(action, StartRollout):
            self._launch_rollout(action, tid)
        elif stage == "reward":
            ref = pipe.reward.score.remote(action.step, pipe.trajs[action.step])
            pipe.rewards[action.step] = ref
            self._track(ref, _Call("stage", pipe.name, action.step, stage, (), 0.0, tid))
        elif stage in TRAIN_STAGES:
            self._launch_train(pipe, action, tid)
        elif stage == "weight_sync":
            self._launch_sync(pipe, action, tid)
        elif stage == "offload":
            self._launch_offload(pipe, action, tid)
        elif stage == "onload":
            self._launch_onload(pipe, action, tid)
        else:
            raise ValueError(f"{tid}: unknown stage {stage!r}")

    def _track(self, ref: Any, call: _Call) -> None:
        self._calls[ref] = call

    def threads_for(self, share: float, num_devices: int) -> int:
        """Torch threads of a call holding ``share`` of ``num_devices`` devices (module doc)."""
        return max(1, round(share * self.threads_per_device * num_devices))

    def _launch_rollout(self, a: StartRollout, tid: str) -> None:
        spec = self._pipes[a.pipeline].spec
        n = spec.batch_size * spec.group_size
        ranks = [RankRT(r, a.devices[r * a.tp:(r + 1) * a.tp], a.share,
                        checkpoint_at=self.now_s) for r in range(len(a.devices) // a.tp)]
        ro = RolloutRT(tid, a.pipeline, a.step, n, ranks)
        for r, idx in enumerate(dispatch(n, spec.group_size, len(ranks), a.dispatch)):
            ro.assign(r, idx)
        self._rollouts[tid] = ro
        for rank in ranks:
            self._submit_chunk(ro, rank)

    def _submit_chunk(self, ro: RolloutRT, rank: RankRT) -> None:
        pipe, dev = self._pipes[ro.pipeline], self._devs[rank.device]
        weights = pipe.weights_ref if dev.versions.get(pipe.name) != pipe.version else None
        threads = self.threads_for(rank.share, len(rank.devices))
        checkpoint = self.now_s - rank.checkpoint_at >= self.checkpoint_s
        if checkpoint:
            rank.checkpoint_at = self.now_s
        ref = dev.actor.gen_run.remote(pipe.name, ro.step, rank.index, self.chunk_s, threads,
                                       rank.fresh, weights, pipe.version, rank.force_reload,
                                       checkpoint, *rank.incoming)
        dev.versions[pipe.name] = pipe.version
        rank.fresh, rank.incoming, rank.force_reload, rank.timer_at = [], [], False, None
        rank.inflight = ref
        self._track(ref, _Call("chunk", pipe.name, ro.step, ROLLOUT, rank.devices, rank.share,
                               ro.tid, ro, rank))

    def _launch_train(self, pipe: _Pipe, a: StartStage, tid: str) -> None:
        """A compute stage: on the train-state holder, data-parallel over the stage's other
        devices when the stage allows it (:meth:`_dp_devices`)."""
        target = pipe.loc if pipe.loc in a.devices else (a.devices[0] if a.devices else 0)
        state = self._move_state_to(pipe, target)
        actor = self._devs[target].actor
        trajs, rewards = pipe.trajs[a.step], pipe.rewards[a.step]
        others = self._dp_devices(pipe, a.stage, a.devices, target)
        threads = self.threads_for(a.share, 1 if others else max(1, len(a.devices)))
        helpers, bounds = None, None
        if others:
            n = pipe.spec.batch_size * pipe.spec.group_size
            bounds = shard_bounds(n, 1 + len(others))
            _, payload = actor.dp_export.options(num_returns=2).remote(
                pipe.name, a.stage, a.step, state, trajs, rewards)
            state = None  # dp_export onloaded it
            helpers = [[self._devs[d].actor.dp_shard.remote(pipe.name, a.stage, lo, hi,
                                                            threads, payload)
                        for d, (lo, hi) in zip(others, bounds[1:], strict=True)]]
        ref = actor.train_stage.remote(pipe.name, a.stage, a.step, threads, state, trajs,
                                       rewards, helpers, bounds)
        self._track(ref, _Call("stage", pipe.name, a.step, a.stage, (target,), a.share, tid,
                               extra=others))

    def _dp_devices(self, pipe: _Pipe, stage: str, devices: tuple[int, ...],
                    target: int) -> tuple[int, ...]:
        """The helpers of a data-parallel stage: the stage's devices other than ``target`` (at
        most one shard per request row), or () where data parallelism does not apply: an update
        with several PPO epochs, old log-probs skipped by the on-policy shortcut, reference
        log-probs without a reference (those run on the holder alone)."""
        tr = pipe.spec.train
        if len(devices) < 2 or not self.data_parallel:
            return ()
        if stage == "actor_update" and tr.ppo_epochs != 1:
            return ()
        if stage == "old_logprob" and not tr.recompute_old_logprobs and tr.ppo_epochs == 1:
            return ()
        if stage == "ref_logprob" and tr.kl_coef <= 0:
            return ()
        rows = pipe.spec.batch_size * pipe.spec.group_size
        return tuple(d for d in devices if d != target)[:max(0, rows - 1)]

    def _launch_sync(self, pipe: _Pipe, a: StartStage, tid: str) -> None:
        done = pipe.offset + a.step + 1
        every = pipe.spec.train.checkpoint_every
        due = self.ckpt_dir is not None and (done == pipe.offset + pipe.spec.steps or
                                              bool(every and done % every == 0))
        meta = {"history": [m for _, m in sorted(pipe.metrics.items())]}
        where = pipe.loc if pipe.loc is not None else 0
        state = None if pipe.loc is not None else pipe.host_ref
        info, weights = self._devs[where].actor.publish.options(
            num_returns=2, concurrency_group="control").remote(
            pipe.name, done, state, str(self.ckpt_dir / pipe.name) if due else None, due, meta)
        self._track(info, _Call("stage", pipe.name, a.step, a.stage, (), 0.0, tid,
                                extra=weights))

    def _launch_offload(self, pipe: _Pipe, a: StartStage, tid: str) -> None:
        if pipe.loc is None:
            self._instant.append(TaskDone(tid, pipe.name, a.step, a.stage, self.now_s))
            return
        info = self._offload(pipe)
        self._track(info, _Call("stage", pipe.name, a.step, a.stage, (), 0.0, tid, extra="move"))

    def _launch_onload(self, pipe: _Pipe, a: StartStage, tid: str) -> None:
        """Onload onto the listed device holding the fewest train states (a stage on several
        devices later runs where the state is, data-parallel over the others)."""
        devices = a.devices or (0,)
        target = min(devices, key=lambda d: (sum(self._devs[d].resident.values()), d))
        if pipe.loc is not None:
            self._instant.append(TaskDone(tid, pipe.name, a.step, a.stage, self.now_s))
            return
        state = self._move_state_to(pipe, target)
        info = self._devs[target].actor.onload.remote(pipe.name, state)
        self._track(info, _Call("stage", pipe.name, a.step, a.stage, (target,), 0.0, tid,
                                extra="move"))

    def _offload(self, pipe: _Pipe) -> Any:
        """Submit the offload of ``pipe``'s train state from its device; returns the info ref."""
        assert pipe.loc is not None
        dev = self._devs[pipe.loc]
        # Nothing of this pipeline queued or running there: the offload runs in the worker's
        # "control" group, beside whatever another pipeline runs there, instead of behind it
        # (a log-prob moving to an idle device waited 0.5 s for another pipeline's update).
        group = "control" if not self._busy_on(pipe.name, pipe.loc) else None
        info, state = dev.actor.offload.options(num_returns=2,
                                                concurrency_group=group).remote(pipe.name)
        dev.resident.pop(pipe.name, None)
        pipe.loc, pipe.host_ref = None, state
        return info

    def _busy_on(self, name: str, device: int) -> bool:
        """Whether a call of pipeline ``name`` is queued or running on ``device``'s worker."""
        for c in self._calls.values():
            helpers = c.extra if c.stage in TRAIN_STAGES and isinstance(c.extra, tuple) else ()
            if c.pipeline == name and (device in c.devices or device in helpers):
                return True
        return False

    def _move_state_to(self, pipe: _Pipe, target: int) -> Any:
        """Make ``target`` the train state's device; the host state to onload there, or None
        when it is already there. A device over its memory budget first offloads its least
        recently used other train states (each a real, measured move)."""
        dev = self._devs[target]
        if pipe.loc == target:
            dev.resident[pipe.name] = dev.resident.pop(pipe.name)  # most recently used
            return None
        if pipe.loc is not None:  # on another device: through host memory
            info = self._offload(pipe)
            self._track(info, _Call("move", pipe.name, -1, "offload", (), 0.0))
        while dev.resident and sum(dev.resident.values()) + pipe.state_bytes > self.mem_budget:
            victim = self._pipes[next(iter(dev.resident))]
            log.info("device %d over its %.2f GB budget: offloading %s", target,
                     self.mem_budget / 1e9, victim.name)
            info = self._offload(victim)
            self._track(info, _Call("move", victim.name, -1, "offload", (), 0.0))
        dev.resident[pipe.name] = pipe.state_bytes
        pipe.loc = target
        return pipe.host_ref

    def set_share(self, action: SetShare) -> None:
        """A new share: a rollout rank's next slice (or the task's next call) uses it."""
        ro = self._rollouts.get(action.task_id)
        if ro is None:
            if not any(c.tid == action.task_id for c in self._calls.values()):
                raise KeyError(f"set_share: no running task {action.task_id!r}")
            return  # a single call: it keeps its threads until it returns
        for rank in ro.ranks if action.rank is None else [ro.ranks[action.rank]]:
            rank.share = action.share

    def migrate(self, action: Migrate) -> None:
        """Abort the source ranks' unfinished requests and resume them on ``dst_rank``."""
        ro = self._rollouts[action.task_id]
        dst = ro.ranks[action.dst_rank]
        for r in action.src_ranks:
            src = ro.ranks[r]
            if src.done:
                continue
            moved = ro.move(src.index, dst.index)
            dst.fresh.extend(src.fresh)  # not started yet: start them on dst
            src.fresh = []
            export = self._devs[src.device].actor.gen_export.remote(ro.pipeline, ro.step,
                                                                    src.index)
            dst.incoming.append(export)
            src.migrate_to = dst.index
            log.debug("%s: migrating %d requests rank %d -> %d", ro.tid, moved, src.index,
                      dst.index)
        if dst.done or (dst.inflight is None and dst.timer_at is not None):
            dst.done = False
            self._submit_chunk(ro, dst)

    def interrupt(self, action: Interrupt) -> None:
        """Every rank reloads the newest weights at its next slice (AReaL's interruption)."""
        for rank in self._rollouts[action.task_id].ranks:
            rank.force_reload = not rank.done

    # ------------------------------------------------------------------ progress
    def busy(self) -> bool:
        return bool(self._calls or self._instant or any(
            r.timer_at is not None for ro in self._rollouts.values() for r in ro.ranks))

    def advance(self) -> list[Notification]:
        """Wait until a call returns (or a tool-waiting rank is due); report what happened."""
        while True:
            notes, self._instant = self._instant, []
            self._fire_timers()
            if notes or not self._calls:
                return notes + self._take_notes()
            timers = [r.timer_at for ro in self._rollouts.values() for r in ro.ranks
                      if r.timer_at is not None]
            timeout = max(0.0, min(timers) - self.now_s) if timers else None
            refs = list(self._calls)
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                self._finish(ref, self._calls.pop(ref))
            out = self._take_notes()
            if out:
                return out

    def _take_notes(self) -> list[Notification]:
        out, self._notes = self._notes, []
        return out

    def _fire_timers(self) -> None:
        now = self.now_s
        for ro in list(self._rollouts.values()):
            for rank in ro.ranks:
                if rank.timer_at is not None and rank.timer_at <= now and rank.inflight is None:
                    self._submit_chunk(ro, rank)

    def drain_events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    # ------------------------------------------------------------------ results
    def _finish(self, ref: Any, call: _Call) -> None:
        try:
            result = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - a remote error or a dead worker
            self._failed(call, exc)
            return
        if call.kind == "chunk":
            self._chunk_done(call, result)
        elif call.kind == "move":
            self._move_done(call, result)
        else:
            self._stage_done(call, result)

    def _t(self, wall: float) -> float:
        return max(0.0, wall - self._t0_wall)

    def _span(self, call: _Call, stage: str, result: dict[str, Any], rank: int = 0,
              share: float | None = None) -> None:
        tokens = int(result.get("tokens", 0))
        flops = FLOPS_PER_TOKEN.get(call.stage, 0.0) * self._pipes[call.pipeline].num_params
        self._events.append(Span(call.pipeline, call.step, stage, rank, call.devices,
                                 self._t(result["t_start"]), self._t(result["t_end"]),
                                 call.share if share is None else share, flops * tokens, tokens))

    def _chunk_done(self, call: _Call, res: dict[str, Any]) -> None:
        ro, rank = call.rollout, call.rank
        assert ro is not None and rank is not None
        rank.inflight = None
        g = self._pipes[ro.pipeline].spec.group_size
        self._span(call, rollout_band(res["width"] if res["tokens"] else 0), res, rank.index)
        t_end = self._t(res["t_end"])
        for traj, version in zip(res["trajectories"], res["versions"], strict=True):
            prompt, sample = request_index(traj.request_id)
            if ro.finished(prompt * g + sample, traj, version):
                self._events.append(SampleFinished(
                    ro.pipeline, ro.step, traj.request_id, t_end, len(traj.prompt_ids),
                    len(traj.response_ids), 1 + traj.num_tool_calls, version,
                    int(sum(traj.response_mask))))
        for item, version in res["checkpoint"]:
            prompt, sample = request_index(item.state.request_id)
            ro.keep_checkpoint(prompt * g + sample, item, version)
        self._after_chunk(ro, rank, res)

    def _after_chunk(self, ro: RolloutRT, rank: RankRT, res: dict[str, Any]) -> None:
        unfinished = 0 if rank.migrate_to is not None else res["unfinished"]
        if rank.migrate_to is not None or (unfinished == 0 and not rank.incoming
                                           and not rank.fresh):
            rank.done = True
        elif res["decoding"] == 0 and res["next_ready_s"] > 0 and not (rank.incoming or
                                                                        rank.fresh):
            rank.timer_at = self.now_s + res["next_ready_s"]
        else:
            self._submit_chunk(ro, rank)
        if unfinished != rank.unfinished:
            rank.unfinished = unfinished
            band = "done" if rank.done else rollout_band(res["decoding"])
            self._notes.append(RankProgress(ro.tid, rank.index, unfinished, band, self.now_s,
                                            0 if rank.done else res["ctx_tokens"]))
        if ro.complete:
            self._rollout_done(ro)

    def _rollout_done(self, ro: RolloutRT) -> None:
        del self._rollouts[ro.tid]
        ordered = ro.ordered()
        trajs = [t for t, _ in ordered]
        self._pipes[ro.pipeline].trajs[ro.step] = ray.put(trajs)
        self._notes.append(TaskDone(ro.tid, ro.pipeline, ro.step, ROLLOUT, self.now_s,
                                    tuple(len(t.prompt_ids) for t in trajs),
                                    tuple(len(t.response_ids) for t in trajs)))

    def _stage_done(self, call: _Call, res: dict[str, Any]) -> None:
        pipe = self._pipes[call.pipeline]
        self._span(call, call.stage, res)
        if call.stage in TRAIN_STAGES:  # data-parallel helpers: a span on each one's device
            for rank, (dev, helper) in enumerate(zip(call.extra or (), res.get("helpers", ()),
                                                     strict=False), start=1):
                self._span(replace(call, devices=(dev,)), call.stage, helper, rank)
        absolute = pipe.offset + call.step
        if call.stage == "reward":
            scores = res["rewards"]
            pipe.metrics.setdefault(absolute, {}).update(
                {"critic/score/mean": sum(scores) / max(1, len(scores)),
                 "reward/errors": float(sum("error" in i for i in res["infos"]))})
        elif call.stage == "actor_update":
            pipe.metrics.setdefault(absolute, {}).update(res.get("metrics", {}))
        elif call.stage == "weight_sync":
            pipe.weights_ref, pipe.version = call.extra, pipe.offset + call.step + 1
            pipe.trajs.pop(call.step, None)
            pipe.rewards.pop(call.step, None)
        if call.extra == "move":
            self._record_move(call, res)
        assert call.tid is not None
        self._notes.append(TaskDone(call.tid, call.pipeline, call.step, call.stage, self.now_s))

    def _move_done(self, call: _Call, res: dict[str, Any]) -> None:
        self._span(call, call.stage, res, share=0.0)
        self._record_move(call, res)

    def _record_move(self, call: _Call, res: dict[str, Any]) -> None:
        if "bytes" in res:
            self._pipes[call.pipeline].state_bytes = int(res["bytes"])
            self.moves.append({"pipeline": call.pipeline, "stage": call.stage,
                               "bytes": int(res["bytes"]),
                               "seconds": res["t_end"] - res["t_start"]})

    # ------------------------------------------------------------------ failures
    def _failed(self, call: _Call, exc: BaseException) -> None:
        dead = [d for d in self._devs if call.devices and d.index == call.devices[0]
                and not _alive(d.actor)]
        if dead:
            self._replace_device(dead[0].index)
        if call.kind == "chunk" and dead:
            return  # its requests were re-dispatched by _replace_device
        error = f"{type(exc).__name__}: {_first_line(exc)}"
        log.error("%s/%d/%s failed: %s", call.pipeline, call.step, call.stage, error)
        self._fail_pipeline(call.pipeline, call.step, call.stage, error)

    def _fail_pipeline(self, name: str, step: int, stage: str, error: str) -> None:
        pipe = self._pipes[name]
        pipe.lost = pipe.lost or error
        for ref, c in list(self._calls.items()):
            if c.pipeline == name:
                del self._calls[ref]
        for tid in [t for t, ro in self._rollouts.items() if ro.pipeline == name]:
            del self._rollouts[tid]
        self._notes.append(TaskFailed(task_id(name, step, stage), name, step, stage, self.now_s,
                                      error))

    def _replace_device(self, index: int) -> None:
        """A device worker died: start a new one on its bundle and recover what it held."""
        old = self._devs[index]
        log.error("device %d worker died; replacing it", index)
        self.replaced_devices.append(index)
        self._devs[index] = self._new_device(index)
        self._devs[index].node_id = ray.get(self._devs[index].actor.ready.remote())["node_id"]
        ray.get(self._devs[index].actor.warm.remote())
        for name in old.resident:
            pipe = self._pipes[name]
            pipe.loc = None
            pipe.lost = (f"its train state was on device {index}, whose worker died; rerun "
                         "with --resume to continue from the last checkpoint")
        for ref, c in list(self._calls.items()):  # its other in-flight calls died with it
            if c.kind == "chunk" and c.rank is not None and c.rank.device == index:
                del self._calls[ref]
                c.rank.inflight = None
        for ro in list(self._rollouts.values()):
            for rank in ro.ranks:
                if rank.device == index and not rank.done:
                    self._redispatch(ro, rank)

    def _redispatch(self, ro: RolloutRT, rank: RankRT) -> None:
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
        kept = sum(item.state.num_generated for item, _ in resume)
        self.recovered["resumed"] += len(resume)
        self.recovered["regenerated"] += len(fresh)
        self.recovered["tokens_kept"] += kept
        log.warning("%s: requests of rank %d moved to rank %d: %d resumed from checkpoints "
                    "(%d sampled tokens kept), %d regenerated from their prompts", ro.tid,
                    rank.index, target.index, len(resume), kept, len(fresh))
        if target.inflight is None:
            target.done = False
            self._submit_chunk(ro, target)
        if target is not rank:
            self._notes.append(RankProgress(ro.tid, rank.index, 0, "done", self.now_s, 0))


def _alive(actor: Any) -> bool:
    try:
        ray.get(actor.ready.remote(), timeout=10)
        return True
    except Exception:  # noqa: BLE001 - any failure means the worker is gone
        return False


def _first_line(exc: BaseException) -> str:
    """The useful line of a Ray error (its message repeats the remote traceback)."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    tail = [ln for ln in lines if not ln.startswith((" ", "Traceback"))]
    return (tail[-1] if tail else (lines[-1] if lines else repr(exc)))[:500]
