"""The Ray executor: the driver's tasks run for real on one worker actor per logical device.

What: :class:`RayExecutor` implements :class:`~jigsawrl.driver.protocol.Executor` (read
``executors/simulated.py`` for the reference semantics) on
:class:`~jigsawrl.executors.raycluster.worker.DeviceWorker` actors (one per device, pinned to a
placement-group bundle) and one :class:`~jigsawrl.executors.raycluster.worker.RewardWorker`
per pipeline. It is assembled from parts that share one
:class:`~jigsawrl.executors.raycluster.records.RunState`:

- :mod:`.fleet` — the workers: start-up (Ray, placement, warm starts, first weights), close, and
  a new worker in place of a dead one;
- :mod:`.slices` — rollouts: a rollout runs as ``len(devices) // tp`` ranks; each rank advances
  in time slices (``chunk_s``) on its device's worker, and after every slice the executor emits
  the trajectories that finished (``SampleFinished``), a :class:`RankProgress` when the rank's
  unfinished count changed, and a span of the slice's decode band. A rank whose requests all
  wait for tools gives its device back until the first is ready. ``migrate`` aborts the source
  ranks' unfinished requests after their current slice (``gen_export``) and resumes them on the
  destination rank (its next slice takes the exported requests: re-prefill of prompt + generated
  tokens); ``interrupt`` makes every rank reload the pipeline's newest weights at its next slice
  (KV caches dropped, requests re-prefilled). Every ``checkpoint_s`` of a rank's rollout, its
  next slice also returns a snapshot of its unfinished requests; the executor keeps the latest
  one of each request until it finishes;
- :mod:`.training` — ``reward`` runs on the pipeline's reward worker;
  ``old_logprob``/``ref_logprob``/``actor_update`` run on the device holding the pipeline's
  train state; ``weight_sync`` publishes the actor's weights as a new version (and writes a
  checkpoint when due); engines load a newer version at the start of their next slice;
- :mod:`.residency` — ``offload``/``onload`` move the train state between a device and host
  memory for real; a stage on other devices moves it there first (offload to the object store,
  onload), and a device over its memory budget first offloads its least recently used train
  states;
- :mod:`.recovery` — a device worker that dies is replaced on the same bundle and the requests
  it owned go to a live rank of the same rollout: resumed from their latest checkpoint (the
  tokens generated since are generated again), or regenerated from their prompt when they have
  none (``recovered`` counts both); a train state that was on it is rebuilt on the new worker
  from its host copy and the passes run since, and the tasks that died are launched again; any
  other failed call fails only its pipeline.

Worker calls take and return the typed messages of :mod:`.messages`.

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

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ray

from jigsawrl.driver.protocol import Notification, TaskFailed
from jigsawrl.events import Event
from jigsawrl.executors.raycluster.fleet import Fleet
from jigsawrl.executors.raycluster.records import (
    CHECKPOINT_S,
    CHUNK_S,
    Call,
    CallKind,
    RunState,
    Settings,
)
from jigsawrl.executors.raycluster.recovery import Recovery
from jigsawrl.executors.raycluster.residency import Residency
from jigsawrl.executors.raycluster.slices import Rollouts, rollout_band
from jigsawrl.executors.raycluster.training import Training
from jigsawrl.scheduler.base import (
    Interrupt,
    Migrate,
    Regroup,
    SetShare,
    Spread,
    StartRollout,
    StartStage,
    task_id,
)
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.workload.experiment import Experiment

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_S", "CHUNK_S", "RayExecutor", "rollout_band"]

DEAD_WAIT_S = 60.0  # kill_device(wait=True): how long a killed worker's calls may take to fail


class _Setting:
    """An executor attribute kept in its :class:`Settings` (tests and drills set some of them
    between construction and :meth:`RayExecutor.start`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, ex: Any, owner: type | None = None) -> Any:
        return self if ex is None else getattr(ex.settings, self.name)

    def __set__(self, ex: Any, value: Any) -> None:
        setattr(ex.settings, self.name, value)


class RayExecutor:
    """Runs an experiment's tasks on Ray device workers (see the module docstring).

    Args:
        exp: the resolved experiment (``experiments.resolve.resolve_real``).
        address: a running Ray cluster (``"auto"`` or ``host:port``); None starts a local one.
        threads_per_device: torch threads a full share of one logical device maps to.
        cache_dir: warm-start cache passed to every worker (None: the engine's default).
        reward_fns: pipeline name -> reward function override (tests inject failures).
        strict_rewards: a reward that raises fails its pipeline; False (default) scores it 0.
        num_cpus: CPUs a local Ray declares (None: ``os.cpu_count()``); workers ask for none.
        ckpt_dir: checkpoints go to ``ckpt_dir/<pipeline>`` (None: no checkpoints).
        offsets: pipeline -> steps already done (resume: each restores its latest checkpoint).
        device_mem_bytes: per-device memory budget for train states (default: the accelerator's).
        chunk_s: a rollout rank's time slice.
        checkpoint_s: how often (seconds of a rank's rollout) a slice also returns a snapshot of
            the rank's unfinished requests (0: every slice).
        data_parallel: split log-prob and update stages over their devices' workers (False:
            one worker with all the devices' threads).
        regroup: run ``Regroup`` actions and tell policies so (``can_regroup``): a rank's
            engine goes on with the threads of every regrouped rank's device. Off by default:
            the views' ``can_regroup`` also lets jigsaw search rollout TPs, and a CPU profile
            times one thread per device, so its choices of wider groups would rest on costs
            nobody measured (and the simulator's model of these one-call-at-a-time workers
            cannot regroup; docs/RAY.md).
    """

    threads_per_device = _Setting()
    chunk_s = _Setting()
    checkpoint_s = _Setting()
    data_parallel = _Setting()
    mem_budget = _Setting()
    ckpt_dir = _Setting()
    offsets = _Setting()

    def __init__(self, exp: Experiment, *, address: str | None = None, threads_per_device: int = 1,
                 cache_dir: Path | None = None,
                 reward_fns: Mapping[str, Callable[[str, Any], float]] | None = None,
                 strict_rewards: bool = False, num_cpus: int | None = None,
                 ckpt_dir: Path | None = None, offsets: Mapping[str, int] | None = None,
                 device_mem_bytes: float | None = None, chunk_s: float = CHUNK_S,
                 checkpoint_s: float = CHECKPOINT_S, data_parallel: bool = True,
                 regroup: bool = False) -> None:
        if threads_per_device < 1:
            raise ValueError(f"threads_per_device must be >= 1, got {threads_per_device}")
        if chunk_s <= 0:
            raise ValueError(f"chunk_s must be > 0, got {chunk_s}")
        if checkpoint_s < 0:
            raise ValueError(f"checkpoint_s must be >= 0, got {checkpoint_s}")
        self.exp = exp
        self.settings = Settings(threads_per_device, chunk_s, checkpoint_s, data_parallel,
                                 float(device_mem_bytes or exp.accelerator.hbm_bytes), ckpt_dir,
                                 dict(offsets or {}))
        self.can_regroup = regroup
        self.startup_s = 0.0
        self.state = RunState(self.settings)
        self.fleet = Fleet(exp, self.state, address=address, num_cpus=num_cpus,
                           cache_dir=cache_dir, reward_fns=reward_fns or {},
                           strict_rewards=strict_rewards)
        self.residency = Residency(self.state)
        self.rollouts = Rollouts(self.state)
        self.training = Training(self.state, self.residency, self.rollouts.tail)
        self.recovery = Recovery(self.state, self.fleet, self.rollouts, self.residency,
                                 self.launch)

    # ------------------------------------------------------------------ what a run reports
    @property
    def now_s(self) -> float:
        return self.state.now_s

    @property
    def pipeline_metrics(self) -> dict[str, list[dict[str, float]]]:
        """Per pipeline, the metrics of each finished step (absolute step numbers)."""
        return {n: [{"step": s, **m} for s, m in sorted(p.metrics.items())]
                for n, p in self.state.pipes.items()}

    @property
    def synced_metrics(self) -> dict[str, list[dict[str, float]]]:
        """:attr:`pipeline_metrics` of the steps whose weights are synced (the last stage of a
        step, so their rows are complete): what per-step loggers may log while a run goes on."""
        return {n: [{"step": s, **m} for s, m in sorted(p.metrics.items()) if s < p.version]
                for n, p in self.state.pipes.items()}

    @property
    def moves(self) -> list[dict[str, Any]]:
        """Measured offloads and onloads: pipeline, stage, bytes, seconds."""
        return self.residency.moves

    @property
    def replaced_devices(self) -> list[int]:
        """The devices whose worker died and was replaced, in order."""
        return self.fleet.replaced

    @property
    def pass_breakdown(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per pipeline and model-pass stage, where the calls' wall time went on their
        holders (:class:`~jigsawrl.executors.raycluster.callclock.Clocks`)."""
        return self.training.clocks.to_json()

    @property
    def speed_probes_s(self) -> list[float]:
        """Each device worker's speed probe before the run clock (engine/speedprobe.py)."""
        return list(self.fleet.speed_probes_s)

    @property
    def speed_probes_end_s(self) -> list[float]:
        """Each device worker's speed probe once the run had ended (:meth:`finish`; empty
        where the run did not end or a worker did not answer)."""
        return list(self.fleet.speed_probes_end_s)

    @property
    def recovered(self) -> dict[str, int]:
        """Requests of dead workers: ``resumed`` from a checkpoint, ``regenerated`` from their
        prompt, and the sampled ``tokens_kept`` by the resumed ones."""
        return self.rollouts.recovered

    def device_nodes(self) -> list[str]:
        """The Ray node id of each device's worker (as placed at start)."""
        return list(self.fleet.node_ids)

    def train_state_device(self, pipeline: str) -> int | None:
        """The device holding ``pipeline``'s train state now (None: host memory)."""
        return self.residency.holder(pipeline)

    def threads_for(self, share: float, num_devices: int) -> int:
        """Torch threads of a call holding ``share`` of ``num_devices`` devices (module doc)."""
        return self.settings.threads_for(share, num_devices)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start (or join) Ray, place one worker per device, build every pipeline's train state
        (warm start or checkpoint) in host memory. A pipeline that cannot be built fails at its
        first task; if Ray itself fails, what was started is stopped and the error raised."""
        t0 = time.monotonic()
        try:
            self.fleet.start()
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - t0
        self.state.start_clock()
        log.info("ray executor ready: %d device workers, %d pipelines in %.1f s",
                 len(self.state.devs), len(self.state.pipes), self.startup_s)

    def finish(self) -> None:
        """The run ended (every pipeline finished): the workers' speed probes once more, after
        the clock (:meth:`Fleet.probe_end`)."""
        self.fleet.probe_end()

    def close(self) -> None:
        """Stop the workers; shut Ray down if this executor started it."""
        self.fleet.close()

    def kill_device(self, index: int, wait: bool = False) -> None:
        """Kill a device's worker process (fault-injection hook for tests and drills).

        With ``wait``, return once the worker no longer answers and every call in flight on it
        has failed, so that the executor reads all those failures in one batch (a
        deterministic drill)."""
        refs = self.state.on_worker(index)
        actor = self.state.devs[index].actor
        self.fleet.kill(index)
        if not wait:
            return
        deadline = time.monotonic() + DEAD_WAIT_S
        while time.monotonic() < deadline:
            try:
                ray.get(actor.ready.remote(), timeout=5)
            except Exception:  # noqa: BLE001 - any failure: it is gone
                break
            time.sleep(0.05)
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=DEAD_WAIT_S)

    @property
    def on_call(self) -> Callable[[Call], None] | None:
        """Test and drill hook: called with every worker call right after its submission."""
        return self.state.on_call

    @on_call.setter
    def on_call(self, hook: Callable[[Call], None] | None) -> None:
        self.state.on_call = hook

    # ------------------------------------------------------------------ actions
    def launch(self, action: StartRollout | StartStage) -> None:
        stage = Stage.ROLLOUT if isinstance(action, StartRollout) else action.stage
        tid = task_id(action.pipeline, action.step, stage)
        pipe = self.state.pipes[action.pipeline]
        if pipe.lost is not None:
            self.state.instant.append(TaskFailed(tid, pipe.name, action.step, stage,
                                                 self.now_s, pipe.lost))
            return
        self.state.launching = action
        try:
            self._dispatch(pipe, action, stage, tid)
        finally:
            self.state.launching = None

    def _dispatch(self, pipe: Any, action: StartRollout | StartStage, stage: str,
                  tid: str) -> None:
        if isinstance(action, StartRollout):
            self.rollouts.launch(action, tid)
        elif stage == Stage.REWARD:
            self.training.launch_reward(pipe, action, tid)
        elif stage in MODEL_PASSES:
            self.training.launch_pass(pipe, action, tid)
        elif stage == Stage.WEIGHT_SYNC:
            self.training.launch_sync(pipe, action, tid)
        elif stage == Stage.OFFLOAD:
            self.residency.launch_offload(pipe, action, tid)
        elif stage == Stage.ONLOAD:
            self.residency.launch_onload(pipe, action, tid)
        else:
            raise ValueError(f"{tid}: unknown stage {stage!r}")

    def set_share(self, action: SetShare) -> None:
        """A new share: a rollout rank's next slice (or the task's next call) uses it."""
        self.rollouts.set_share(action)

    def migrate(self, action: Migrate) -> None:
        """Abort the source ranks' unfinished requests and resume them on ``dst_rank``."""
        self.rollouts.migrate(action)

    can_regroup = False  # by default (an instance built with regroup=True says True)

    def regroup(self, action: Regroup) -> None:
        """One engine for a rollout's tail on several ranks' devices (their threads): only
        when built with ``regroup=True`` (see the class docstring)."""
        if not self.can_regroup:
            raise NotImplementedError(f"{action.task_id}: this Ray executor was built without "
                                      "regroup (RayExecutor(regroup=True))")
        self.rollouts.regroup(action)

    # A rollout grows new ranks on idle workers (Spread): its requests not started yet move as
    # they are, started ones are exported from their rank and resumed on the new one.
    can_spread = True

    def spread(self, action: Spread) -> None:
        """New ranks on ``action.devices``; the rollout's unfinished requests re-dealt."""
        self.rollouts.spread(action)

    def interrupt(self, action: Interrupt) -> None:
        """Every rank reloads the newest weights at its next slice (AReaL's interruption)."""
        self.rollouts.interrupt(action)

    # ------------------------------------------------------------------ progress
    def busy(self) -> bool:
        return bool(self.state.calls or self.state.instant or self.rollouts.timers())

    def advance(self) -> list[Notification]:
        """Wait until a call returns (or a tool-waiting rank is due); report what happened."""
        state = self.state
        while True:
            notes, state.instant = state.instant, []
            self.rollouts.fire_timers()
            if notes or not state.calls:
                return notes + state.take_notes()
            timers = self.rollouts.timers()
            timeout = max(0.0, min(timers) - self.now_s) if timers else None
            refs = list(state.calls)
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                # One dead worker fails all its calls at once: the first one's recovery may drop
                # others of the same batch (the dead worker's slices, the failed pipeline's calls).
                call = state.untrack(ref)
                if call is not None:
                    self._finish(ref, call)
            out = state.take_notes()
            if out:
                return out

    def drain_events(self) -> list[Event]:
        out, self.state.events = self.state.events, []
        return out

    def _finish(self, ref: Any, call: Call) -> None:
        try:
            result = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - a remote error or a dead worker
            self.recovery.failed(call, exc)
            return
        if call.kind == CallKind.CHUNK:
            self.rollouts.chunk_done(call, result)
        elif call.kind == CallKind.MOVE:
            self.residency.move_done(call, result)
        elif call.kind == CallKind.TAIL:
            self.rollouts.tail.done(call, result)
        else:
            self.training.stage_done(call, result)
