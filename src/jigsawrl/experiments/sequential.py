"""``run_experiment``: run each pipeline of a config for real on the local CPU, one at a time.

What: first every pipeline is checked — its task built (a registered task, the user's data files,
a reward function from a file: :func:`jigsawrl.tasks.build_task`) and its data checked against
its model's tokenizer (:func:`~jigsawrl.engine.pipeline.check_pipeline`) — so that a missing
file, a bad row or a broken reward file fails before any model is built. Then, for every
pipeline, build a :class:`~jigsawrl.engine.pipeline.RealPipeline` (model preset or local HF
folder, task, warm start), evaluate it greedily on held-out prompts, run its GRPO steps,
evaluate again. With ``out_dir`` it writes

- ``tb/<pipeline>/``: TensorBoard scalars under verl's names (``critic/score/mean``,
  ``actor/pg_loss``, ``timing_s/gen``, ``perf/throughput``, ...), and the other loggers of
  ``trainer.logger`` (console, W&B: :mod:`jigsawrl.experiments.loggers`);
- ``checkpoints/<pipeline>/step-NNNNNN/``: model, optimizer, RNG and the metric history, every
  ``train.checkpoint_every`` steps and at the end (``resume=True`` continues from the latest);
- ``summary.json``: throughput, makespan and per-pipeline per-step curves;
- ``reward_curve.png`` and the resolved ``config.yaml``.

Why one at a time: multiplexing pipelines on shared devices is the scheduler's job (the Ray
runtime will call the same sub-stage methods); this loop is the solo baseline and the reference
that those runs are compared with.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jigsawrl.config import ExperimentConfig, PipelineSpec, dump_config
from jigsawrl.engine.pipeline import RealPipeline, check_pipeline
from jigsawrl.errors import InputError
from jigsawrl.experiments.loggers import Tracking

StepCallback = Callable[[dict[str, Any]], None]


def run_experiment(cfg: ExperimentConfig, out_dir: Path | None, *, resume: bool = False,
                   on_step: StepCallback | None = None,
                   cache_dir: Path | None = None) -> dict[str, Any]:
    """Run every pipeline of ``cfg`` in turn; return (and write) the summary.

    Args:
        cfg: the experiment config (each pipeline's ``model`` is an engine preset or a folder).
        out_dir: where results go; None keeps everything in memory (no checkpoints).
        resume: continue each pipeline from its latest checkpoint under ``out_dir``.
        on_step: called after each step (and at phase changes) with a dict carrying
            ``event`` (``"phase"`` | ``"step"``), ``pipeline``, ``step``, ``steps`` and ``metrics``.
        cache_dir: warm-start cache (None: ``$JIGSAWRL_CACHE`` or ``~/.cache/jigsawrl``).

    Raises:
        ConfigError: unknown model preset or task, bad task params, a broken reward file,
            ``trainer.logger: [wandb]`` without wandb (before any pipeline runs).
        InputError: ``resume`` without ``out_dir``, an unreadable checkpoint, a missing or bad
            data file, a model folder that does not fit its tokenizer (before any pipeline runs).
    """
    if resume and out_dir is None:
        raise InputError("--resume needs the run folder", where="--out",
                         fix="pass --out DIR of the run to resume")
    tasks = [check_pipeline(spec, f"pipelines.{i}") for i, spec in enumerate(cfg.pipelines)]
    t0 = time.perf_counter()
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(dump_config(cfg))
    results = []
    with Tracking.from_config(cfg, out_dir) as tracking:
        for spec, task in zip(cfg.pipelines, tasks, strict=True):
            results.append(_run_pipeline(spec, task, cfg.seed, out_dir, resume, on_step,
                                         cache_dir, tracking))
    total_tokens = sum(r["total_tokens"] for r in results)
    total_step_s = sum(r["total_step_s"] for r in results)
    summary = {
        "name": cfg.name, "seed": cfg.seed,
        "throughput_tokens_per_s": total_tokens / total_step_s if total_step_s else 0.0,
        "makespan_s": time.perf_counter() - t0,
        "pipelines": results,
    }
    if out_dir is not None:
        (out_dir / "summary.json").write_text(json.dumps(_jsonable(summary), indent=1))
        plot_rewards(summary, out_dir / "reward_curve.png")
    return summary


def _emit(on_step: StepCallback | None, **event: Any) -> None:
    if on_step is not None:
        on_step(event)


def _run_pipeline(spec: PipelineSpec, task: Any, seed: int, out_dir: Path | None, resume: bool,
                  on_step: StepCallback | None, cache_dir: Path | None,
                  tracking: Tracking) -> dict[str, Any]:
    """Warm start, eval, steps (with checkpoints and the loggers), eval; the pipeline summary."""
    _emit(on_step, event="phase", pipeline=spec.name, step=0, steps=spec.steps,
          phase="warm start", metrics={})
    pipe = RealPipeline(spec, seed, cache_dir=cache_dir, task=task)
    pipe.start()
    ckpt_root = out_dir / "checkpoints" / spec.name if out_dir is not None else None
    meta = pipe.restore(ckpt_root) if resume and ckpt_root is not None else None
    history: list[dict[str, float]] = list(meta.get("history", [])) if meta else []
    first = int(meta["step"]) if meta else 0
    if meta and "eval_reward_before" in meta:
        eval_before = float(meta["eval_reward_before"])
    else:
        _emit(on_step, event="phase", pipeline=spec.name, step=0, steps=spec.steps,
              phase="eval", metrics={})
        eval_before = pipe.evaluate()
    for step in range(first, spec.steps):
        metrics = pipe.run_step(step)
        history.append(metrics)
        tracking.log(spec.name, step, metrics)
        _emit(on_step, event="step", pipeline=spec.name, step=step + 1, steps=spec.steps,
              metrics=metrics)
        every = spec.train.checkpoint_every
        if ckpt_root is not None and (step + 1 == spec.steps or
                                      (every and (step + 1) % every == 0)):
            pipe.save(ckpt_root, step + 1, {"history": history,
                                            "eval_reward_before": eval_before,
                                            "warm_start": pipe.warm_info})
    _emit(on_step, event="phase", pipeline=spec.name, step=spec.steps, steps=spec.steps,
          phase="eval", metrics={})
    eval_after = pipe.evaluate()
    return pipeline_summary(spec, history, eval_before, eval_after, pipe)


def pipeline_summary(spec: PipelineSpec, history: list[dict[str, float]], eval_before: float,
                     eval_after: float, pipe: RealPipeline) -> dict[str, Any]:
    """The per-pipeline entry of ``summary.json``."""
    step_s = [h["timing_s/step"] for h in history]
    tokens = [h["perf/total_num_tokens"] for h in history]
    out: dict[str, Any] = {
        "name": spec.name, "model": spec.model, "task": spec.task or pipe.task.name,
        "steps": len(history),
        "batch_size": spec.batch_size, "group_size": spec.group_size,
        "mean_step_latency_s": sum(step_s) / len(step_s) if step_s else 0.0,
        "tokens_per_s": sum(tokens) / sum(step_s) if step_s else 0.0,
        "samples_per_s": (len(history) * spec.batch_size * spec.group_size / sum(step_s)
                          if step_s else 0.0),
        "total_tokens": sum(tokens), "total_step_s": sum(step_s),
        "reward_mean_per_step": [h["critic/score/mean"] for h in history],
        "response_length_mean_per_step": [h["response_length/mean"] for h in history],
        "step_latency_s_per_step": step_s,
        "eval_reward_before": eval_before, "eval_reward_after": eval_after,
        "warm_start": {k: v for k, v in pipe.warm_info.items() if k != "path"},
    }
    if pipe.task.multi_turn:
        out["tool_calls_per_sample_per_step"] = [h["env/tool_calls_per_sample"] for h in history]
    if spec.data is not None:
        out["data"] = {"train_files": list(spec.data.train_files),
                       "val_files": list(spec.data.val_files),
                       "train_rows": len(pipe.pool), "val_rows": len(pipe.eval_set)}
    if spec.custom_reward_function is not None and spec.custom_reward_function.path:
        out["reward_function"] = (f"{spec.custom_reward_function.path}:"
                                  f"{spec.custom_reward_function.name}")
    out["reward_errors"] = reward_errors(history)
    return out


def reward_errors(history: list[dict[str, float]]) -> dict[str, Any]:
    """Samples whose reward failed (scored 0), in all and by reason (``reward/errors/<kind>``:
    the exception's type, ``not_a_number``, ``no_score``, ``not_finite``)."""
    by: dict[str, float] = {}
    for h in history:
        for key, value in h.items():
            if key.startswith("reward/errors/"):
                kind = key.removeprefix("reward/errors/")
                by[kind] = by.get(kind, 0.0) + value
    return {"total": int(sum(h.get("reward/errors", 0.0) for h in history)),
            "by_reason": {k: int(v) for k, v in sorted(by.items())}}


def _jsonable(obj: Any) -> Any:
    """NaN/inf become None so that summary.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def plot_rewards(summary: dict[str, Any], path: Path) -> None:
    """Mean sampled reward per step of every pipeline (and eval before/after) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for p in summary["pipelines"]:
        curve = p["reward_mean_per_step"]
        ax.plot(range(1, len(curve) + 1), curve, label=f"{p['name']} ({p['task']})")
        ax.scatter([0, len(curve)], [p["eval_reward_before"], p["eval_reward_after"]],
                   marker="x", label=f"{p['name']} greedy eval")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
