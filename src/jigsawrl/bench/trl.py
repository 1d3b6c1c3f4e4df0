"""``jigsawrl bench trl``: the same GRPO run through TRL's GRPOTrainer and through jigsawrl.

What: one model preset (warm-started once, from the shared cache, so both start from identical
weights), one task, one batch (``batch_size`` prompts × ``group_size`` samples), the same sampling
settings (temperature, top-p, max new tokens), learning rate, clip ε, KL off, token-level loss
("dapo" in TRL = verl's token-mean), group-normalised advantages, one optimizer step per batch.
Each side runs ``steps`` steps on the same prompts in the same order; the report gives
samples/s (``steps × batch × group`` over the summed step times: generation + reward +
log-probs + update, as TRL's own ``step_time`` measures it), samples/s over the whole training
wall time (TRL's includes its trainer set-up), and the mean sampled reward of the first and last
steps. Both sides run in one process, one after the other, with the same torch thread count.

Why: TRL's ``GRPOTrainer`` is the single-process GRPO most users start with on CPU (see
``reference/peers.md``), so it is the honest peer for the local engine. TRL is an optional extra
(``pip install 'jigsawrl[trl]'``, tested with trl 1.16.0 on torch 2.13 / transformers 5.24); when
it cannot be imported, the TRL side reports why instead of failing.

Honest differences, said here rather than hidden: TRL generates with ``model.generate`` (static
batch, stops on EOS only), jigsawrl with its continuous-batching engine (also stops on the task's
end-of-response newline). Only single-turn tasks are compared (TRL's tool loop differs).
"""

from __future__ import annotations

import copy
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jigsawrl.bench.real import Spread
from jigsawrl.config import PipelineSpec, RolloutSpec, TrainSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchTrlSpec:
    """The shared settings of both sides."""

    model: str = "qwen2-1m"
    task: str = "arithmetic"
    batch_size: int = 16
    group_size: int = 4
    steps: int = 20
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 3e-4
    clip_eps: float = 0.2
    warmup_steps: int = 40
    seed: int = 0
    threads: int = 1
    recompute_old_logprobs: bool = False  # TRL with num_iterations=1 does not recompute either
    share_prompt: bool = True  # jigsawrl's shared-prompt forward (exact; off = plain forward)
    autocast: str = "off"  # "bf16": both sides train with bf16 autocast (TRL's bf16=True)


def trl_available() -> tuple[bool, str]:
    """Whether TRL imports here; otherwise the reason and how to fix it."""
    try:
        import trl  # noqa: F401
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable"
        return False, (f"TRL is not usable here ({type(exc).__name__}: {exc}); install the "
                       "optional extra without touching torch: pip install 'trl==1.16.0' "
                       "-c constraints.txt (with torch==2.13.0 pinned in constraints.txt)")
    return True, f"trl {trl.__version__}"


def pipeline_spec(b: BenchTrlSpec) -> PipelineSpec:
    """The jigsawrl side's pipeline config."""
    return PipelineSpec(
        name="jigsawrl", model=b.model, task=b.task, batch_size=b.batch_size,
        group_size=b.group_size, steps=b.steps, use_ref=False,
        rollout=RolloutSpec(temperature=b.temperature, top_p=b.top_p),
        train=TrainSpec(lr=b.lr, clip_eps=b.clip_eps, kl_coef=0.0, warmup_steps=b.warmup_steps,
                        micro_batch_size=b.batch_size * b.group_size, threads=b.threads,
                        eval_size=0, recompute_old_logprobs=b.recompute_old_logprobs,
                        autocast=b.autocast))


def _result(b: BenchTrlSpec, step_s: list[float], wall: float, rewards: list[float],
            stages: dict[str, float]) -> dict[str, Any]:
    samples = b.steps * b.batch_size * b.group_size
    return {"samples_per_s": samples / sum(step_s), "wall_samples_per_s": samples / wall,
            "wall_s": wall, "step_s": step_s, "reward_per_step": rewards,
            "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            "stage_s_per_step": stages}


_JIGSAWRL_STAGES = {"gen": "timing_s/gen", "reward": "timing_s/reward",
                    "log_probs": ("timing_s/old_log_prob", "timing_s/ref"),
                    "update": ("timing_s/update_actor", "timing_s/update_weights")}


def run_jigsawrl(b: BenchTrlSpec, pipe: Any) -> dict[str, Any]:
    """Run the steps through :class:`RealPipeline`; throughput, rewards, per-stage times."""
    rewards, step_s = [], []
    stages = dict.fromkeys(_JIGSAWRL_STAGES, 0.0)
    t0 = time.perf_counter()
    for step in range(b.steps):
        m = pipe.run_step(step)
        rewards.append(m["critic/score/mean"])
        step_s.append(m["timing_s/step"])
        for stage, keys in _JIGSAWRL_STAGES.items():
            for key in (keys,) if isinstance(keys, str) else keys:
                stages[stage] += m.get(key, 0.0) / b.steps
    return _result(b, step_s, time.perf_counter() - t0, rewards, stages)


def run_trl(b: BenchTrlSpec, pipe: Any, model: Any) -> dict[str, Any]:
    """Run the same steps through TRL's GRPOTrainer on a copy of the warm-started model."""
    ok, why = trl_available()
    if not ok:
        return {"error": why}
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    examples = [ex for step in range(b.steps) for ex in pipe.prompts_for(step)]
    bos = pipe.tokenizer.bos_token
    rows = [{"prompt": bos + ex.prompt, "idx": i} for i, ex in enumerate(examples)]

    def reward(completions: list[str], idx: list[int], **_: Any) -> list[float]:
        from jigsawrl.tasks import safe_score

        return [safe_score(pipe.task, c, examples[i])[0] for c, i in zip(completions, idx,
                                                                          strict=True)]

    gen_s: list[float] = []

    class TimedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        """TRL's trainer, timing its generate-and-score half (the rest of a step is the
        update: forward, backward; TRL's ``step_time`` leaves the optimizer step out)."""

        def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            out = super()._generate_and_score_completions(*args, **kwargs)
            gen_s.append(time.perf_counter() - t)
            return out

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, use_cpu=True, bf16=b.autocast == "bf16", report_to="none",
            save_strategy="no",
            logging_steps=1, max_steps=b.steps, learning_rate=b.lr, lr_scheduler_type="constant",
            warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
            per_device_train_batch_size=b.batch_size * b.group_size,
            gradient_accumulation_steps=1, num_generations=b.group_size, steps_per_generation=1,
            num_iterations=1, max_completion_length=pipe.max_new_tokens,
            temperature=b.temperature, top_p=b.top_p, top_k=0, beta=0.0, epsilon=b.clip_eps,
            loss_type="dapo", scale_rewards="group", shuffle_dataset=False, seed=b.seed,
            dataloader_num_workers=0, disable_dropout=True, disable_tqdm=True)
        trainer = TimedGRPOTrainer(model=model, reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_list(rows),
                              processing_class=pipe.tokenizer)
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # its per-step dicts would flood the console
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
    logs = [h for h in trainer.state.log_history if "reward" in h]
    step_s = [float(h["step_time"]) for h in logs]
    gen = statistics.fmean(gen_s) if gen_s else 0.0
    stages = {"gen+reward": gen, "update": max(statistics.fmean(step_s) - gen, 0.0)}
    return _result(b, step_s, wall, [float(h["reward"]) for h in logs], stages)


def run_bench_trl(b: BenchTrlSpec, cache_dir: Path | None = None) -> dict[str, Any]:
    """Both sides, jigsawrl first; a dict with ``jigsawrl``, ``trl`` and ``speedup``."""
    import torch

    from jigsawrl.engine.pipeline import RealPipeline

    pipe = RealPipeline(pipeline_spec(b), b.seed, cache_dir=cache_dir)
    pipe.start()
    pipe.trainer.config = replace(pipe.trainer.config, share_prompt=b.share_prompt)  # warm start (cached); the model TRL gets is a copy of these weights
    torch.set_num_threads(b.threads)
    trl_model = copy.deepcopy(pipe.model)
    ours = run_jigsawrl(b, pipe)
    theirs = run_trl(b, pipe, trl_model)
    out: dict[str, Any] = {"spec": b.__dict__, "jigsawrl": ours, "trl": theirs,
                           "torch_threads": torch.get_num_threads()}
    if "samples_per_s" in theirs:
        out["speedup"] = ours["samples_per_s"] / theirs["samples_per_s"]
    return out


def run_bench_trl_repeats(b: BenchTrlSpec, repeats: int, cache_dir: Path | None = None,
                          on_run: Callable[[int, dict[str, Any]], None] | None = None,
                          ) -> dict[str, Any]:
    """``repeats`` runs of :func:`run_bench_trl` at seeds ``seed, seed+1, ...`` (each seed its
    own warm start, prompts and samples, the same on both sides); the median and range of the
    speed-up and of each side's samples/s and mean sampled reward over all steps."""
    runs = []
    for r in range(repeats):
        run = run_bench_trl(replace(b, seed=b.seed + r), cache_dir)
        runs.append(run)
        if on_run is not None:
            on_run(r, run)
    out: dict[str, Any] = {"spec": b.__dict__, "repeats": repeats, "runs": runs}
    for side in ("jigsawrl", "trl"):
        ok = [run[side] for run in runs if "samples_per_s" in run[side]]
        if ok:
            out[side] = {"samples_per_s": Spread.json_of([x["samples_per_s"] for x in ok]),
                         "wall_samples_per_s": Spread.json_of([x["wall_samples_per_s"] for x in ok]),
                         "reward_mean": Spread.json_of([x["reward_mean"] for x in ok])}
    speedups = [run["speedup"] for run in runs if "speedup" in run]
    if speedups:
        out["speedup"] = Spread.json_of(speedups)
        out["wall_speedup"] = Spread.json_of([run["jigsawrl"]["wall_samples_per_s"]
                                       / run["trl"]["wall_samples_per_s"] for run in runs
                                       if "speedup" in run])
    return out
