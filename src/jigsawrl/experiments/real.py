"""Real multi-pipeline runs: config -> Experiment -> ``Driver(policy, RayExecutor)`` -> summary.

What: :func:`resolve_real` turns a config whose pipelines name *engine* presets (``qwen2-1m``)
and *real* tasks (``arithmetic``, ``calculator``, ...) into the same
:class:`~jigsawrl.workload.experiment.Experiment` the simulator runs, using the CPU presets of
:mod:`jigsawrl.workload.realpresets`; :func:`run_real` runs it with the configured scheduler
through :class:`~jigsawrl.executors.raycluster.RayExecutor` and summarises the events with the
metrics code the simulator uses (``executor: "ray"`` in the summary).

Why: DESIGN.md §3 — one scheduler, two executors. ``engine/run.py`` runs pipelines one at a time
(the solo reference); here several real pipelines share the logical devices under a policy.

Simplification: a real pipeline's ``task``/``sampler`` fields hold a neutral stub
:class:`~jigsawrl.workload.task_presets.TaskSpec` named after the real task. The driver and the
policies read only ``spec`` and ``model`` (plus the simulator task table, where a real task name
is absent, so ``jigsaw`` falls back to ``max_response_tokens // 4`` as its length prior); the
sampler is never sampled, because true lengths come from the engine.

``ray`` and ``torch`` are imported only inside :func:`run_real` (and by ``engine_model_spec``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jigsawrl.config import ExperimentConfig, dump_config
from jigsawrl.costmodel import CostModel
from jigsawrl.costmodel.cpu import cpu_worker_params
from jigsawrl.errors import ConfigError
from jigsawrl.events import Event
from jigsawrl.experiments.core import drive, make_policy, run_info, summarize_run
from jigsawrl.experiments.loggers import StepFeed, Tracking, log_step_timings
from jigsawrl.experiments.resolve import resolve_real
from jigsawrl.stages import Stage
from jigsawrl.workload.experiment import Experiment

log = logging.getLogger(__name__)

RewardFn = Callable[[str, Any], float]


def real_belief(exp: Experiment, profile: str | Path | None = None, *,
                threads_per_device: int | None = None,
                speed_factor: float = 1.0) -> CostModel:
    """The cost model of a real pool: a ``jigsawrl profile`` of this machine (noise off), or the
    built-in, unmeasured ``cpu-worker`` preset when ``profile`` is None; ``speed_factor``: the
    profiled machine that many times slower (:func:`jigsawrl.costmodel.speed.slower`);
    ``threads_per_device``: the run's, which the profile's full share must equal
    (:func:`~jigsawrl.costmodel.profile.check_full_share`; None: not checked).

    The policies of a real run believe it (``run_real``'s ``profile``), as a simulated run's
    policies believe the simulator's cost model without its noise: a profile is measured before
    the run, what a user would hand the scheduler. The preset was ~3× off this machine's stage
    times and made jigsaw's first decision pick its own plan on the real bench where the queue of
    single-device jobs was faster (docs/BENCHMARKS.md, 2026-12-04). The simulator's prediction of
    the run takes the profile as its truth (``experiments/calibrate.py``).

    Raises:
        InputError: an unreadable profile.
    """
    per_node = exp.config.cluster.accelerators_per_node
    if profile is None:
        return CostModel(exp.accelerator, params=cpu_worker_params(per_node))
    from jigsawrl.costmodel.profile import load_profile
    from jigsawrl.costmodel.speed import slower

    accel, params = load_profile(profile, threads_per_device)
    if speed_factor != 1.0:
        accel, params = slower(accel, params, speed_factor)
    return CostModel(accel, params=dataclasses.replace(params, devices_per_node=per_node))


def checkpoint_offsets(cfg: ExperimentConfig, out_dir: Path | None) -> dict[str, int]:
    """Steps each pipeline already completed, from its latest checkpoint under
    ``out_dir/checkpoints/<pipeline>`` (read from ``meta.json``; no torch needed).

    Raises:
        InputError: no ``out_dir``, or no checkpoint at all under it.
    """
    import json

    from jigsawrl.errors import InputError

    if out_dir is None:
        raise InputError("--resume needs the run folder", where="--out",
                         fix="pass --out DIR of the run to resume")
    offsets: dict[str, int] = {}
    for p in cfg.pipelines:
        root = Path(out_dir) / CHECKPOINTS / p.name
        marker = root / "latest"
        if marker.is_file():
            meta = root / marker.read_text().strip() / "meta.json"
            offsets[p.name] = int(json.loads(meta.read_text())["step"])
    if not offsets:
        raise InputError(f"no checkpoint under {Path(out_dir) / CHECKPOINTS}", where="--resume",
                         fix="point --out at the folder of the interrupted run, or drop --resume")
    return offsets


CHECKPOINTS = "checkpoints"
# Driver-kill drills (tests/executors/test_ray_driver_killed.py): "STAGE:N:PATH" makes the driver
# write PATH and stop right after submitting its N-th worker call of STAGE, to be killed there;
# "STAGE@STEP:N:PATH" counts only the calls of pipeline step STEP (a rollout's slice count
# depends on the machine's speed, a step's first slice does not).
FREEZE_ENV = "JIGSAWRL_DRILL_FREEZE"
FREEZE_S = 3600.0


def freeze_drill(spec: str) -> Callable[[Any], None]:
    """The executor hook of a driver-kill drill (:data:`FREEZE_ENV`): at the N-th worker call
    of STAGE (of step STEP, when given) the driver writes PATH (``"STAGE N"``) and sleeps, its
    calls still running on the workers (a rollout slice, an update, a checkpoint being
    written), until it is killed."""
    stage_name, nth, path = spec.split(":", 2)
    stage_name, _, step_name = stage_name.partition("@")
    stage, count = Stage(stage_name), int(nth)
    only_step = int(step_name) if step_name else None
    seen = [0]

    def install(executor: Any) -> None:
        before = executor.on_call

        def on_call(call: Any) -> None:
            if before is not None:
                before(call)
            if call.stage != stage or only_step not in (None, call.step):
                return
            seen[0] += 1
            if seen[0] == count:
                Path(path).write_text(f"{stage} {count}\n")
                log.warning("drill: driver stopped at %s call %d, waiting to be killed",
                            stage, count)
                time.sleep(FREEZE_S)

        executor.on_call = on_call

    return install


def _remaining(cfg: ExperimentConfig, offsets: Mapping[str, int]) -> ExperimentConfig | None:
    """``cfg`` with each pipeline's steps reduced by its completed steps; finished pipelines
    are dropped (None when nothing is left)."""
    left = [p.model_copy(update={"steps": p.steps - offsets.get(p.name, 0)})
            for p in cfg.pipelines if p.steps - offsets.get(p.name, 0) > 0]
    return cfg.model_copy(update={"pipelines": left}) if left else None


def run_real(cfg: ExperimentConfig, *, policy: str | None = None, address: str | None = None,
             out_dir: Path | None = None, cache_dir: Path | None = None,
             threads_per_device: int = 1, reward_fns: Mapping[str, RewardFn] | None = None,
             strict_rewards: bool = False, resume: bool = False,
             on_progress: Callable[[int, int], None] | None = None,
             executor_hook: Callable[[Any], None] | None = None,
             profile: str | Path | None = None,
             ) -> tuple[dict[str, Any], list[Event]]:
    """Run ``cfg``'s real pipelines together under one policy on Ray.

    Args:
        cfg: the experiment (``cluster.accelerator: cpu-worker``, engine presets, real tasks).
        policy: scheduler name (default ``cfg.scheduler.name``, with its params).
        address: a running Ray cluster; None starts a local one for the run.
        out_dir: write the run folder (summary, events, trace, timeline), the pipelines'
            checkpoints (``checkpoints/<pipeline>``, every ``train.checkpoint_every`` steps and
            at the end) and the ``trainer.logger`` output (``tb/<pipeline>/``, ``wandb/``;
            :mod:`jigsawrl.experiments.loggers`) there.
        cache_dir: warm-start cache (None: ``$JIGSAWRL_CACHE`` or ``~/.cache/jigsawrl``).
        threads_per_device: torch threads a full share of one logical device maps to.
        reward_fns: test hook — pipeline name -> reward function replacing its task's reward.
        strict_rewards: False (the default, as verl does): a reward function that raises or
            returns a non-number scores that sample 0, the reason counted in the step's metrics
            (``reward/errors``, ``reward/errors/<kind>``). True: it stops its pipeline (the
            others go on).
        resume: continue every pipeline from its latest checkpoint under ``out_dir``.
        on_progress: called with ``(steps done, steps total)`` after every finished step.
        executor_hook: test hook, called with the started executor's instance (fault drills).
        profile: a ``jigsawrl profile`` of this machine, measured at a full share of
            ``threads_per_device`` threads: the policy's belief cost model (:func:`real_belief`;
            None: the built-in preset). The summary's ``belief_profile``
            names it, so that the run's prediction gives its policy the same belief.

    Returns:
        ``(summary, events)``; the summary adds ``startup_s`` (Ray + workers + warm starts, not
        part of the makespan), ``wall_s``, ``scheduler_decision_ms_p99``, ``pipeline_metrics``
        (per pipeline, per step: reward mean, losses), ``memory_moves`` (measured offloads and
        onloads), ``resumed_from``, ``replaced_devices``, ``recovered`` (requests of dead
        workers resumed from checkpoints / regenerated, and the sampled tokens kept) and
        ``speed_probes_s`` / ``speed_probes_end_s`` (each device worker's speed probe before
        the clock and once the run ended: ``engine/speedprobe.py``) and ``pass_breakdown`` (per pipeline and model pass, the
        calls' wall, CPU, garbage-collection, pass, onload and batch-build seconds:
        ``raycluster/callclock.py``).

    Raises:
        ConfigError: see :func:`resolve_real`; also ``verl`` (auto), which needs two runs, and
            ``trainer.logger: [wandb]`` without wandb installed.
        InputError: ``resume`` without a checkpoint; a profile of another full share.
        jigsawrl.driver.loop.SchedulerStalled: the policy started nothing while nothing ran.
    """
    from jigsawrl.executors.raycluster import RayExecutor

    t0 = time.monotonic()
    full_cfg = cfg
    offsets = checkpoint_offsets(cfg, out_dir) if resume else {}
    left = _remaining(cfg, offsets)
    if left is None:
        raise ConfigError("every pipeline already finished its steps", where="--resume",
                          fix="raise pipelines.N.steps to train further, or drop --resume")
    cfg = left
    exp = resolve_real(cfg)
    name = policy or cfg.scheduler.name
    pol = make_policy(cfg, name)
    if len(pol.variants()) > 1:
        raise ConfigError(f"{name!r} compares several placements, one real run each",
                          where="scheduler.name",
                          fix="name one placement (verl-sized, verl-queue-K, verl-split, "
                              "verl-serial), or jigsaw, whose fallback runs the best verl "
                              "placement it predicts; `jigsawrl bench real` runs every one")
    # before Ray starts: a profile of another full share fails here (InputError)
    belief = real_belief(exp, profile, threads_per_device=threads_per_device)
    tracking = Tracking.from_config(full_cfg, out_dir, run_name=cfg.name or "real-run")
    executor = RayExecutor(exp, address=address, threads_per_device=threads_per_device,
                           cache_dir=cache_dir, reward_fns=reward_fns,
                           strict_rewards=strict_rewards,
                           ckpt_dir=Path(out_dir) / CHECKPOINTS if out_dir else None,
                           offsets=offsets)
    if executor_hook is not None:
        executor_hook(executor)
    if os.environ.get(FREEZE_ENV):
        freeze_drill(os.environ[FREEZE_ENV])(executor)
    feed = StepFeed(tracking)

    def progress(done: int, total: int) -> None:
        feed.feed(executor.synced_metrics)
        if on_progress is not None:
            on_progress(done, total)

    try:
        result = drive(exp, pol, executor, belief, progress=progress)
        feed.feed(executor.synced_metrics)
        log_step_timings(tracking, result.events, offsets)
    finally:
        tracking.close()
    info = run_info(exp, name, executor="ray", name=cfg.name or "real-run")
    summary = summarize_run(result, info)
    summary["startup_s"] = executor.startup_s
    summary["wall_s"] = time.monotonic() - t0
    summary["pipeline_metrics"] = executor.pipeline_metrics
    summary["memory_moves"] = executor.moves
    summary["resumed_from"] = offsets
    summary["replaced_devices"] = executor.replaced_devices
    summary["recovered"] = dict(executor.recovered)
    summary["threads_per_device"] = threads_per_device
    summary["belief_profile"] = None if profile is None else str(profile)
    summary["speed_probes_s"] = executor.speed_probes_s
    summary["speed_probes_end_s"] = executor.speed_probes_end_s
    summary["pass_breakdown"] = executor.pass_breakdown
    if report := pol.report():
        summary["policy_report"] = report
    log.info("real run %s under %s: makespan %.1f s, start-up %.1f s, %.0f tokens/s", info.name,
             name, summary["makespan_s"], executor.startup_s,
             summary["throughput_tokens_per_s"] or 0.0)
    if out_dir is not None:
        from jigsawrl.metrics.rundir import write_run

        write_run(Path(out_dir), events=result.events, summary=summary, info=info,
                  config_yaml=dump_config(full_cfg))
    return summary, result.events
