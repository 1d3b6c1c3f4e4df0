"""The Ray executor: the driver's tasks run for real, one Ray actor per pipeline.

What: :class:`RayExecutor` implements :class:`~jigsawrl.driver.protocol.Executor` (read
``executors/simulated.py`` for the reference semantics). ``launch`` submits a stage call to the
pipeline's :class:`~jigsawrl.executors.raycluster.actors.PipelineActor`; ``advance`` blocks in
``ray.wait`` until at least one call returns and turns each result into a ``TaskDone`` (with the
observed prompt/response token counts of a rollout) or a ``TaskFailed``, plus the metric records
of :mod:`jigsawrl.events`: a :class:`Span` per stretch of constant compute share on the task's
devices (real wall times, seconds since :meth:`start`) and a :class:`SampleFinished` per sample.

Why: DESIGN.md §3, one scheduler and two executors. The same driver and policies that run in the
simulator multiplex several *real* pipelines here.

Logical devices and shares (CPU): a device is a slice of the machine, not a pinned core. A task's
compute share maps to torch threads for its call::

    threads = max(1, round(share × threads_per_device × len(devices)))

— the CPU counterpart of an SM share on a GPU (MPS ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` /
green contexts would take ``share × sm_count``). Threads are set when a call starts: a
:meth:`set_share` on a running task is recorded (its spans change share from that instant, which
is what the driver's invariants check) but changes threads only from the pipeline's next call.
So when a policy lowers a running call's share to place another task beside it, the device
briefly runs more threads than its share allows (observed under ``jigsaw``: a 2-thread log-prob
pass next to a 1-thread rollout on 2 cores). Live thread changes need the stage to poll its
share between micro-batches / decode iterations: a later slice.

Simplifications of this first slice (said here, as DESIGN.md asks):

- one engine per pipeline: a rollout is not split over DP ranks, so there is no
  :class:`~jigsawrl.driver.protocol.RankProgress`; :meth:`migrate` and :meth:`interrupt` raise
  ``NotImplementedError`` (per-device worker actors come next);
- the engine returns a rollout's samples together, so every ``SampleFinished`` of a step carries
  the rollout's end time, and the rollout is one span (see :func:`rollout_band`);
- ``offload`` / ``onload`` are no-ops: a pipeline's state lives in its actor's memory, and the
  per-worker budget of ``CPU_ACCELERATOR`` is bookkeeping. They complete at once, with no span;
- calls of one pipeline run one after another in its actor (an async pipeline's rollout of step
  k+1 queues behind its training of step k, and its span then includes the wait);
- Ray start-up, actor creation and warm starts happen in :meth:`start` and are excluded from the
  run clock (``startup_s`` records them).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from jigsawrl.driver.protocol import Notification, TaskDone, TaskFailed
from jigsawrl.events import Event, SampleFinished, Span
from jigsawrl.executors.raycluster.actors import PipelineActor
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
from jigsawrl.workload.resolve import Experiment

log = logging.getLogger(__name__)

HOST_NOOPS = frozenset({"offload", "onload"})
def rollout_band(num_samples: int, max_num_seqs: int) -> str:
    """The sub-stage name of a whole-rollout span.

    The engine decodes up to ``max_num_seqs`` requests at once, one token each per iteration, so
    its widest iteration has ``min(num_samples, max_num_seqs)`` tokens; the span takes the band
    (events.py vocabulary) of that width. Prefill and the narrowing tail are folded into it:
    per-iteration bands need engine progress callbacks, which this slice does not have.
    """
    return decode_band(min(num_samples, max_num_seqs))


@dataclass(slots=True, eq=False)
class _Call:
    """One in-flight stage call; ``dev_share`` is the current share on each of its devices."""

    tid: str
    pipeline: str
    step: int
    stage: str
    dev_share: dict[int, float]
    span_start_s: float
    ref: Any = None  # ray.ObjectRef, None for a host no-op
    segments: list[tuple[float, float, dict[int, float]]] = field(default_factory=list)


class RayExecutor:
    """Runs an experiment's stages on Ray actors (see the module docstring).

    Args:
        exp: the resolved experiment (``realrun.resolve_real``).
        address: a running Ray cluster (``"auto"`` or ``host:port``); None starts a local one.
        threads_per_device: torch threads a full share of one logical device maps to.
        cache_dir: warm-start cache passed to every pipeline (None: the engine's default).
        reward_fns: pipeline name -> reward function override (tests inject failures).
        strict_rewards: a reward error fails the stage (see ``PipelineWorker``).
        num_cpus: CPUs a local Ray declares (None: ``os.cpu_count()``); actors ask for none.
    """

    def __init__(self, exp: Experiment, *, address: str | None = None, threads_per_device: int = 1,
                 cache_dir: Path | None = None,
                 reward_fns: Mapping[str, Callable[[str, Any], float]] | None = None,
                 strict_rewards: bool = False, num_cpus: int | None = None) -> None:
        if threads_per_device < 1:
            raise ValueError(f"threads_per_device must be >= 1, got {threads_per_device}")
        self.exp = exp
        self.address = address
        self.threads_per_device = threads_per_device
        self.cache_dir = cache_dir
        self.reward_fns = dict(reward_fns or {})
        self.strict_rewards = strict_rewards
        self.num_cpus = num_cpus
        self.startup_s = 0.0
        self._t0: float | None = None
        self._started_ray = False
        self._actors: dict[str, Any] = {}
        self._calls: dict[str, _Call] = {}
        self._step_tokens: dict[tuple[str, int], int] = {}
        self._events: list[Event] = []

    # ------------------------------------------------------------------ lifecycle
    @property
    def now_s(self) -> float:
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    def start(self) -> None:
        """Start (or join) Ray, create one actor per pipeline and wait until all are built.

        A pipeline whose actor fails to build is logged here and reported as a ``TaskFailed``
        by its first call; if Ray itself fails, what was started is stopped and the error raised.
        """
        t0 = time.monotonic()
        try:
            self._start_actors()
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - t0
        self._t0 = time.monotonic()
        log.info("ray executor ready: %d pipeline actors in %.1f s", len(self._actors),
                 self.startup_s)

    def _start_actors(self) -> None:
        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local runs: no token file
            if self.address is None:
                ray.init(num_cpus=self.num_cpus or os.cpu_count() or 1, include_dashboard=False,
                         logging_level=logging.WARNING)
            else:
                ray.init(address=self.address, logging_level=logging.WARNING)
            self._started_ray = True
        for p in self.exp.pipelines:
            self._actors[p.spec.name] = PipelineActor.remote(
                p.spec.model_dump_json(), self.exp.config.seed,
                str(self.cache_dir) if self.cache_dir else None,
                self.reward_fns.get(p.spec.name), self.strict_rewards)
        for name, actor in self._actors.items():
            try:
                log.info("%s built in %.1f s", name, ray.get(actor.ready.remote()))
            except Exception as exc:  # the first call of this pipeline will fail and report it
                log.error("pipeline %s could not start: %s", name, exc)

    def close(self) -> None:
        """Stop the actors; shut Ray down if this executor started it."""
        for actor in self._actors.values():
            ray.kill(actor)
        self._actors.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    # ------------------------------------------------------------------ actions
    def launch(self, action: StartRollout | StartStage) -> None:
        stage = ROLLOUT if isinstance(action, StartRollout) else action.stage
        tid = task_id(action.pipeline, action.step, stage)
        if tid in self._calls:
            raise RuntimeError(f"{tid} is already running")
        call = _Call(tid, action.pipeline, action.step, stage,
                     {d: action.share for d in action.devices}, self.now_s)
        if stage not in HOST_NOOPS:
            threads = self.threads_for(action.share, len(action.devices))
            call.ref = self._actors[action.pipeline].run_stage.remote(stage, action.step,
                                                                      threads)
        self._calls[tid] = call
        log.debug("launched %s on %s at share %.2f", tid, action.devices, action.share)

    def threads_for(self, share: float, num_devices: int) -> int:
        """Torch threads of a call holding ``share`` of ``num_devices`` devices (module doc)."""
        return max(1, round(share * self.threads_per_device * num_devices))

    def set_share(self, action: SetShare) -> None:
        """Record a share change: the task's spans change share from now (module docstring).

        ``rank`` is accepted for the protocol, but a rollout here is one engine over all its
        devices, so a per-rank share applies to that rank's devices' bookkeeping only.
        """
        call = self._calls.get(action.task_id)
        if call is None:
            raise KeyError(f"set_share: no running task {action.task_id!r}")
        now = self.now_s
        self._cut(call, now)
        devices = sorted(call.dev_share)
        if action.rank is not None:
            tp = self.exp.pipeline(call.pipeline).spec.rollout_tp
            devices = devices[action.rank * tp:(action.rank + 1) * tp]
        for d in devices:
            call.dev_share[d] = action.share
        log.debug("%s: share %.2f on %s from %.3f s (threads unchanged until its next call)",
                  call.tid, action.share, devices, now)

    def migrate(self, action: Migrate) -> None:
        raise NotImplementedError(
            f"migrate {action.task_id}: long-tail migration needs per-device rollout workers, "
            "which the Ray executor does not have yet (one engine per pipeline in this slice); "
            "run jigsaw with migration: false or on the simulated executor")

    def interrupt(self, action: Interrupt) -> None:
        raise NotImplementedError(
            f"interrupt {action.task_id}: interruptible generation (abort + resume on new "
            "weights) is not in the Ray executor yet; use a synchronous policy")

    # ------------------------------------------------------------------ progress
    def busy(self) -> bool:
        return bool(self._calls)

    def advance(self) -> list[Notification]:
        """Wait until at least one call has returned; report every call that has."""
        if not self._calls:
            return []
        done = [c for c in self._calls.values() if c.ref is None]
        if not done:
            refs = [c.ref for c in self._calls.values()]
            ready, _ = ray.wait(refs, num_returns=1)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)  # any that finished too
            ready_set = set(ready)
            done = [c for c in self._calls.values() if c.ref in ready_set]
        return [self._finish(c) for c in done]

    def drain_events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    # ------------------------------------------------------------------ results
    def _finish(self, call: _Call) -> Notification:
        del self._calls[call.tid]
        now = self.now_s
        if call.ref is None:  # host no-op (offload / onload)
            return TaskDone(call.tid, call.pipeline, call.step, call.stage, now)
        try:
            result = ray.get(call.ref)
        except Exception as exc:  # a remote error or a dead actor: the pipeline stops
            self._cut(call, now)
            self._emit_spans(call, self._stage_name(call, 0))
            error = f"{type(exc).__name__}: {_first_line(exc)}"
            log.error("%s failed: %s", call.tid, error)
            return TaskFailed(call.tid, call.pipeline, call.step, call.stage, now, error)
        self._cut(call, now)
        samples = result.get("samples", [])
        if call.stage == ROLLOUT:
            self._step_tokens[(call.pipeline, call.step)] = sum(p + r for _, p, r, _ in samples)
        self._emit_spans(call, self._stage_name(call, len(samples)))
        for sid, p, r, turns in samples:
            self._events.append(SampleFinished(call.pipeline, call.step, sid, now, p, r, turns,
                                               call.step))
        log.debug("%s done in %.3f s (%.3f s computing, %d threads)", call.tid,
                  now - call.segments[0][0], result["compute_s"], result["threads"])
        if call.stage == "weight_sync":
            self._step_tokens.pop((call.pipeline, call.step), None)
        return TaskDone(call.tid, call.pipeline, call.step, call.stage, now,
                        tuple(p for _, p, _, _ in samples), tuple(r for _, _, r, _ in samples))

    def _stage_name(self, call: _Call, num_samples: int) -> str:
        if call.stage != ROLLOUT:
            return call.stage
        spec = self.exp.pipeline(call.pipeline).spec
        n = num_samples or spec.batch_size * spec.group_size
        return rollout_band(n, spec.rollout.max_num_seqs)

    def _cut(self, call: _Call, now: float) -> None:
        """Close the call's current constant-share segment at ``now``."""
        if now > call.span_start_s or not call.segments:
            call.segments.append((call.span_start_s, now, dict(call.dev_share)))
        call.span_start_s = now

    def _emit_spans(self, call: _Call, stage: str) -> None:
        """One span per (segment, share): devices at equal share form one span."""
        tokens = self._step_tokens.get((call.pipeline, call.step), 0)
        flops_total = self._flops(call, tokens)
        if not flops_total:  # reward, weight sync: no model tokens processed
            tokens = 0
        total_s = sum(e - s for s, e, _ in call.segments) or 1.0
        for start, end, shares in call.segments:
            groups: dict[float, list[int]] = {}
            for d, s in sorted(shares.items()):
                groups.setdefault(s, []).append(d)
            if not groups:  # a host stage holding no device
                groups[0.0] = []
            frac = (end - start) / total_s
            for rank, (share, devs) in enumerate(groups.items()):
                part = frac * len(devs) / max(1, len(shares))
                self._events.append(Span(call.pipeline, call.step, stage, rank, tuple(devs),
                                         start, end, share, flops_total * part,
                                         int(tokens * part)))

    def _flops(self, call: _Call, tokens: int) -> float:
        """Useful model FLOPs of a stage: 2·N per token forward, 6·N per token trained."""
        params = self.exp.pipeline(call.pipeline).model.num_params
        factor = {ROLLOUT: 2.0, "old_logprob": 2.0, "ref_logprob": 2.0, "actor_update": 6.0}
        return factor.get(call.stage, 0.0) * params * tokens


def _first_line(exc: BaseException) -> str:
    """The useful line of a Ray error (its message repeats the remote traceback)."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    tail = [ln for ln in lines if not ln.startswith((" ", "Traceback"))]
    return (tail[-1] if tail else (lines[-1] if lines else repr(exc)))[:500]
