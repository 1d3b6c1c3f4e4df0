"""The Ray executor's fleet: one device worker per logical device, one reward worker per pipeline.

What: :meth:`Fleet.start` starts (or joins) Ray, places one
:class:`~jigsawrl.executors.raycluster.worker.DeviceWorker` per device on its placement-group
bundle, builds every pipeline's train state (warm start or checkpoint) in host memory, starts the
reward workers and hands every device every pipeline's first weights; :meth:`Fleet.replace`
starts a new worker on a dead one's bundle; :meth:`Fleet.close` stops them all.

Why everything happens before the run clock starts: worker start-up (importing torch, building
datasets, a first engine) measured ~0.4 s per kind of first use; paid here, it never lands in a
rollout slice of the run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ray

from jigsawrl.executors.raycluster.placement import Reservation, connect
from jigsawrl.executors.raycluster.records import BYTES_PER_PARAM_TRAIN, Dev, Pipe, RunState
from jigsawrl.executors.raycluster.worker import DeviceActor, RewardActor
from jigsawrl.workload.experiment import Experiment

log = logging.getLogger(__name__)


def first_line(exc: BaseException) -> str:
    """The useful line of a Ray error (its message repeats the remote traceback)."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    tail = [ln for ln in lines if not ln.startswith((" ", "Traceback"))]
    return (tail[-1] if tail else (lines[-1] if lines else repr(exc)))[:500]


class Fleet:
    """The workers of one run (see the module docstring).

    Args:
        exp: the resolved experiment.
        state: the executor's shared state (its ``devs`` and ``pipes`` are filled here).
        address: a running Ray cluster; None starts a local one.
        num_cpus: CPUs a local Ray declares (None: ``os.cpu_count()``).
        cache_dir: warm-start cache passed to every worker.
        reward_fns: pipeline name -> reward function override.
        strict_rewards: a reward that raises fails its pipeline; False scores it 0 (counted).
    """

    def __init__(self, exp: Experiment, state: RunState, *, address: str | None,
                 num_cpus: int | None, cache_dir: Path | None,
                 reward_fns: Mapping[str, Callable[[str, Any], float]],
                 strict_rewards: bool) -> None:
        self.exp = exp
        self.state = state
        self.address = address
        self.num_cpus = num_cpus
        self.cache_dir = cache_dir
        self.reward_fns = dict(reward_fns)
        self.strict_rewards = strict_rewards
        self.node_ids: list[str] = []
        self.replaced: list[int] = []
        self.speed_probes_s: list[float] = []
        self.speed_probes_end_s: list[float] = []  # again once the run's last step ended
        self._started_ray = False
        self._res: Reservation | None = None

    def start(self) -> None:
        """Start every worker and every pipeline's train state (see the module docstring)."""
        self._started_ray = connect(self.address, self.exp.num_devices, self.num_cpus)
        self._res = Reservation(self.exp.num_devices)
        devs = self.state.devs = [self._new_device(i) for i in range(self.exp.num_devices)]
        for dev, info in zip(devs, ray.get([d.actor.ready.remote() for d in devs]), strict=True):
            dev.node_id = info.node_id
        self.node_ids = [d.node_id for d in devs]
        self._init_pipelines()
        rewards_up = [(p, p.reward.ready.remote()) for p in self.state.pipes.values()]
        ray.get([d.actor.warm.remote() for d in devs])
        self._await_rewards(rewards_up)
        self._preload_weights()
        # last, once nothing of the start-up runs: every worker's speed probe, together (as
        # the run's calls run), the machine's speed for this run (engine/speedprobe.py)
        self.speed_probes_s = self._probe_all()

    def probe_end(self, timeout_s: float = 30.0) -> None:
        """Every worker's speed probe again, together, once the run has ended (after the
        clock): with the one before the clock, how fast the machine ran at both ends of the
        run (this VM drifts within minutes: engine/speedprobe.py). Left empty where a worker
        does not answer (a failed run ends without it)."""
        try:
            self.speed_probes_end_s = self._probe_all(timeout_s)
        except Exception as exc:  # noqa: BLE001 - a dead or stuck worker: no end probe
            log.warning("no end-of-run speed probe: %s: %s", type(exc).__name__, exc)
            self.speed_probes_end_s = []

    def _probe_all(self, timeout_s: float | None = None) -> list[float]:
        """Every device worker's speed probe, run together; seconds each."""
        return ray.get([d.actor.probe.remote() for d in self.state.devs], timeout=timeout_s)

    def _new_device(self, index: int) -> Dev:
        assert self._res is not None
        specs = {p.spec.name: p.spec.model_dump_json() for p in self.exp.pipelines}
        actor = DeviceActor.options(**self._res.options(index)).remote(
            index, specs, self.exp.config.seed, str(self.cache_dir) if self.cache_dir else None,
            self.state.settings.offsets)
        return Dev(index, actor)

    def _init_pipelines(self) -> None:
        assert self._res is not None
        settings, devs = self.state.settings, self.state.devs
        offsets, ckpt_dir = settings.offsets, settings.ckpt_dir
        pending = []
        for i, p in enumerate(self.exp.pipelines):
            name = p.spec.name
            pipe = self.state.pipes[name] = Pipe(name, p.spec, p.model.num_params,
                                                 offset=offsets.get(name, 0))
            pipe.version = pipe.offset
            pipe.state_bytes = p.model.num_params * BYTES_PER_PARAM_TRAIN
            pipe.reward = RewardActor.options(**self._res.host_options()).remote(
                p.spec.model_dump_json(), self.reward_fns.get(name), self.strict_rewards)
            ckpt = str(ckpt_dir / name) if ckpt_dir and pipe.offset else None
            dev = devs[i % len(devs)]
            info_ref, state_ref = dev.actor.init_train.options(num_returns=2).remote(name, ckpt)
            pipe.host_ref = pipe.weights_ref = pipe.restore_ref = state_ref
            pending.append((pipe, info_ref))
        for pipe, ref in pending:
            try:
                info = ray.get(ref)
                pipe.metrics = {k: dict(m) for k, m in enumerate(info.history)}
                log.info("%s built in %.1f s (resumed at step %d)", pipe.name, info.start_s,
                         info.resumed_step)
            except Exception as exc:  # noqa: BLE001 - reported as this pipeline's failure
                pipe.lost = f"could not start: {first_line(exc)}"
                log.error("pipeline %s %s", pipe.name, pipe.lost)

    def _await_rewards(self, calls: list[tuple[Pipe, Any]]) -> None:
        """Wait until every reward worker's process is up, so that the run clock starts with
        no process still importing (three of them starting measured ~0.4 s added to the first
        rollout slice); one that cannot start fails its pipeline only."""
        for pipe, ref in calls:
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - reported as this pipeline's failure
                pipe.lost = pipe.lost or f"its reward worker could not start: {first_line(exc)}"
                log.error("pipeline %s %s", pipe.name, pipe.lost)

    def _preload_weights(self) -> None:
        """Every device receives every pipeline's first weights now, so that no rollout's
        first slice pays the transfer (measured ~0.4 s for the first one of a worker)."""
        calls = []
        for pipe in self.state.pipes.values():
            if pipe.lost is None:
                for dev in self.state.devs:
                    calls.append(dev.actor.preload.remote(pipe.name, pipe.version,
                                                          pipe.weights_ref))
                    dev.versions[pipe.name] = pipe.version
        ray.get(calls)

    def replace(self, index: int) -> Dev:
        """A device worker died: start a new one on its bundle; returns the dead one's record
        (what was resident there)."""
        old = self.state.devs[index]
        log.error("device %d worker died; replacing it", index)
        self.replaced.append(index)
        new = self.state.devs[index] = self._new_device(index)
        new.node_id = ray.get(new.actor.ready.remote()).node_id
        ray.get(new.actor.warm.remote())
        return old

    def alive(self, index: int) -> bool:
        """Whether device ``index``'s worker still answers."""
        try:
            ray.get(self.state.devs[index].actor.ready.remote(), timeout=10)
            return True
        except Exception:  # noqa: BLE001 - any failure means the worker is gone
            return False

    def kill(self, index: int) -> None:
        ray.kill(self.state.devs[index].actor, no_restart=True)

    def close(self) -> None:
        """Stop the workers; shut Ray down if this fleet started it."""
        actors = [d.actor for d in self.state.devs] + [p.reward for p in
                                                       self.state.pipes.values()]
        for actor in actors:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(actor)
        self.state.devs = []
        if self._res is not None:
            self._res.release()
            self._res = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
