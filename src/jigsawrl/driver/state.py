"""The driver's bookkeeping (a *State*, owned by the driver) and the read-only *View* it builds.

The state tracks what a real single controller can know: which stages of which step are done,
what runs where with which share and memory, and the observed token counts of finished rollouts.
It enforces the pool's invariants on every action — no device over its memory, no device's
compute shares summing above 1 — so a policy bug fails loudly instead of producing a number.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType

from jigsawrl.graph.predict import StepObservation
from jigsawrl.scheduler.base import DeviceView, PipelineView, RunningTask, View
from jigsawrl.stages import Stage
from jigsawrl.workload.experiment import Experiment, ResolvedPipeline

EPS = 1e-9


class InvariantError(RuntimeError):
    """A policy asked for something the pool cannot do (memory or share over capacity)."""


@dataclass(slots=True)
class PipelineState:
    res: ResolvedPipeline
    done: dict[int, set[str]] = field(default_factory=dict)
    steps_completed: int = 0
    running: dict[str, RunningTask] = field(default_factory=dict)
    history: list[StepObservation] = field(default_factory=list)
    step_start_s: dict[int, float] = field(default_factory=dict)  # when the step became ready
    stage_s: dict[int, dict[str, float]] = field(default_factory=dict)
    unfinished: dict[str, list[int]] = field(default_factory=dict)  # rollout tid -> per rank
    ctx_tokens: dict[str, list[int]] = field(default_factory=dict)  # rollout tid -> per rank
    failed: str | None = None
    _cached: PipelineView | None = None
    # task id -> (task, counts, contexts, its view) of the last view built (``_task_view``)
    _task_views: dict[str, tuple[RunningTask, tuple[int, ...], tuple[int, ...], RunningTask]] = \
        field(default_factory=dict)

    sync_end_s: dict[int, float] = field(default_factory=dict)  # step -> weight sync end

    def ready_since(self, step: int) -> float:
        """When ``step``'s rollout became allowed: the weight sync of step - 1 - η (AReaL's
        staleness bound; η = 0 for sync), or the pipeline's start."""
        spec = self.res.spec
        eta = spec.max_staleness if spec.mode == "async" else 0
        return self.sync_end_s.get(step - 1 - eta, spec.start_s)

    def touch(self) -> None:
        """Invalidate the cached view (call after any change)."""
        self._cached = None

    def view(self) -> PipelineView:
        if self._cached is None:
            self._cached = self._build_view()
        return self._cached

    def _build_view(self) -> PipelineView:
        running = tuple(self._task_view(t) for t in self.running.values())
        if len(self._task_views) > len(self.running):  # forget finished tasks
            self._task_views = {k: v for k, v in self._task_views.items() if k in self.running}
        done = MappingProxyType({k: frozenset(v) for k, v in self.done.items()})
        return PipelineView(self.res.spec.name, self.res.index, self.res.spec, self.res.model,
                            done, self.steps_completed, running, tuple(self.history),
                            self.failed is not None)

    def _task_view(self, t: RunningTask) -> RunningTask:
        """``t`` with its per-rank counts; the one built last time while neither changed (a
        progress report changes one task's counts, and the view is rebuilt after each)."""
        unfinished = tuple(self.unfinished.get(t.task_id, ()))
        ctx = tuple(self.ctx_tokens.get(t.task_id, ()))
        got = self._task_views.get(t.task_id)
        if got is not None and got[0] is t and got[1] == unfinished and got[2] == ctx:
            return got[3]
        view = replace(t, unfinished_per_rank=unfinished, ctx_tokens_per_rank=ctx)
        self._task_views[t.task_id] = (t, unfinished, ctx, view)
        return view


@dataclass(slots=True)
class DeviceState:
    index: int
    node: int
    capacity: float
    resident: dict[str, float] = field(default_factory=dict)  # pipeline -> bytes
    working: dict[str, float] = field(default_factory=dict)  # task id -> bytes
    shares: dict[str, float] = field(default_factory=dict)  # task id -> compute share
    _cached: DeviceView | None = None
    _resident_view: MappingProxyType[str, float] | None = None  # rebuilt when resident changes

    @property
    def used(self) -> float:
        return sum(self.resident.values()) + sum(self.working.values())

    @property
    def share_used(self) -> float:
        return sum(self.shares.values())

    def view(self) -> DeviceView:
        if self._cached is None:
            self._cached = self._build_view()
        return self._cached

    def _build_view(self) -> DeviceView:
        if self._resident_view is None:
            self._resident_view = MappingProxyType(dict(self.resident))
        return DeviceView(self.index, self.node, self.capacity, self.used, self.share_used,
                          tuple(self.shares), self._resident_view)


class DriverState:
    """All pipelines and devices; builds views and checks invariants."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.pipes = {p.spec.name: PipelineState(p) for p in exp.pipelines}
        per = exp.config.cluster.accelerators_per_node
        self.devices = [DeviceState(i, i // per, exp.accelerator.hbm_bytes)
                        for i in range(exp.num_devices)]
        # the device views of the last view, and the devices changed since (rebuilt alone: a
        # decision changes a few devices of a large pool)
        self._device_views: tuple[DeviceView, ...] = ()
        self._changed: set[int] = set(range(len(self.devices)))
        self.can_regroup = False  # the executor's (Driver sets it): views tell the policy
        self.can_spread = False  # likewise

    def _touch_device(self, dev: DeviceState, resident: bool = False) -> None:
        """Invalidate a device's view (after any change; ``resident``: its states moved)."""
        dev._cached = None
        if resident:
            dev._resident_view = None
        self._changed.add(dev.index)

    def view(self, now_s: float, cost: object) -> View:
        if self._changed:
            views = list(self._device_views) or [d.view() for d in self.devices]
            for i in self._changed:
                views[i] = self.devices[i].view()
            self._changed.clear()
            self._device_views = tuple(views)
        return View(now_s, tuple(p.view() for p in self.pipes.values()),
                    self._device_views, self.exp.accelerator,
                    self.exp.config.cluster.accelerators_per_node, cost,
                    can_regroup=self.can_regroup, can_spread=self.can_spread)

    @property
    def all_finished(self) -> bool:
        return all(p.failed or p.steps_completed >= p.res.spec.steps for p in self.pipes.values())

    # ------------------------------------------------------------------ resources
    def set_resident(self, pipeline: str, devices: tuple[int, ...], nbytes: float) -> None:
        for d in devices:
            dev = self._device(d)
            self._touch_device(dev, resident=True)
            old = dev.resident.pop(pipeline, 0.0)
            if nbytes > 0:
                dev.resident[pipeline] = nbytes
            if dev.used > dev.capacity * (1 + EPS):
                dev.resident[pipeline] = old
                raise InvariantError(
                    f"device {d}: {pipeline} state of {nbytes / 1e9:.1f} GB exceeds memory "
                    f"({dev.used / 1e9:.1f} of {dev.capacity / 1e9:.1f} GB)")

    def acquire(self, tid: str, devices: tuple[int, ...], share: float, mem: float,
                host_stage: bool = False) -> None:
        """Reserve ``share`` of compute and ``mem`` bytes on each device for task ``tid``.

        Host-bound stages (transfers: weight sync, offload/onload) may hold a device with share 0:
        they use links and memory bandwidth, not compute.
        """
        low = 0.0 if host_stage else EPS
        if not low <= share <= 1 + EPS:
            raise InvariantError(f"{tid}: compute share {share} is not in (0, 1]")
        for d in devices:
            dev = self._device(d)
            if tid in dev.shares:
                raise InvariantError(f"{tid} already runs on device {d}")
            if dev.share_used + share > 1 + EPS:
                raise InvariantError(f"device {d}: share {share} for {tid} on top of "
                                     f"{dev.share_used:.2f} held by {sorted(dev.shares)}")
            if dev.used + mem > dev.capacity * (1 + EPS):
                raise InvariantError(
                    f"device {d}: {tid} needs {mem / 1e9:.1f} GB, {dev.used / 1e9:.1f} of "
                    f"{dev.capacity / 1e9:.1f} GB in use")
        for d in devices:
            self.devices[d].shares[tid] = share
            self.devices[d].working[tid] = mem
            self._touch_device(self.devices[d])

    def reshare(self, tid: str, share: float, devices: tuple[int, ...] | None = None) -> None:
        devs = [d for d in self.devices if tid in d.shares and (devices is None or d.index in
                                                                 devices)]
        for dev in devs:
            if dev.share_used - dev.shares[tid] + share > 1 + EPS:
                raise InvariantError(f"device {dev.index}: share {share} for {tid} over capacity")
        for dev in devs:
            dev.shares[tid] = share
            self._touch_device(dev)

    def task_mem(self, tid: str) -> float:
        """The memory a running task holds on each of its devices (0 when it holds none)."""
        return next((d.working[tid] for d in self.devices if tid in d.working), 0.0)

    def release_devices(self, tid: str, devices: tuple[int, ...]) -> None:
        """Free ``devices`` of a running task (after a migration moved its work away)."""
        for d in devices:
            dev = self.devices[d]
            if tid in dev.shares:
                del dev.shares[tid]
                dev.working.pop(tid, None)
                self._touch_device(dev)

    def release(self, tid: str) -> None:
        for dev in self.devices:
            if tid in dev.shares:
                del dev.shares[tid]
                dev.working.pop(tid, None)
                self._touch_device(dev)

    def _device(self, d: int) -> DeviceState:
        if not 0 <= d < len(self.devices):
            raise InvariantError(f"device {d} does not exist (cluster has {len(self.devices)})")
        return self.devices[d]

    # ------------------------------------------------------------------ progress
    def observe_rollout(self, name: str, step: int, prompt: tuple[int, ...],
                        resp: tuple[int, ...]) -> None:
        ps = self.pipes[name]
        ps.touch()
        ps.history.append(StepObservation(step, prompt, resp,
                                          MappingProxyType(ps.stage_s.get(step, {}))))
        del ps.history[:-8]  # keep the recent steps only (prediction uses the last few)

    def is_rollout(self, stage: str) -> bool:
        return stage == Stage.ROLLOUT
