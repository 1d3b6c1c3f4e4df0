"""One real GRPO pipeline on one local device (the CPU, or a CUDA GPU), one method per sub-stage.

What: :class:`RealPipeline` owns the actor, the rollout engine (with its own copy of the weights),
the optional frozen reference, the task and the datasets. A step is::

    data = p.rollout(step)    # timing_s/gen          sample batch_size × group_size responses
    p.reward(data)            # timing_s/reward       score, group-normalised advantages
    p.old_logprob(data)       # timing_s/old_log_prob recompute the behaviour log-probs
    p.ref_logprob(data)       # timing_s/ref          only when kl_coef > 0
    p.update(data)            # timing_s/update_actor PPO-clip AdamW step(s)
    p.weight_sync()           # timing_s/update_weights actor -> rollout engine

Why this shape: a later Ray runtime calls these methods one by one on workers and puts other
pipelines' sub-stages in between, so each method reads and writes only ``self`` and the
:class:`StepData` it is given, and :meth:`run_step` is just the six calls, timed.

Device: ``train.device`` (default ``auto``: a CUDA GPU when torch sees one) picks where the
models, the KV cache and the batches live (:mod:`jigsawrl.engine.device`); what leaves the
pipeline (weights, train states) is copied to the CPU first. The GPU path is untested until a GPU
machine is lent (``scripts/gpu-check.sh``).

Determinism: the prompts of step ``s`` and every request's sampling seed derive from
``(seed, s)`` only, so a resumed run (model + optimizer restored) repeats the steps it would
have taken (tested). Simplification: the reference model is built only when ``kl_coef > 0``
(verl's GRPO recipes run with the KL off; computing log-probs nobody reads would only cost time).

The user's own RL: the task comes from :func:`jigsawrl.tasks.build_task` (a registered task, the
user's data files, a reward function from a file); a data task's chat prompts are rendered for
the model's tokenizer and checked against it before the model is built
(:mod:`jigsawrl.engine.prompts`, :func:`check_pipeline`); its training pool is every row of
``data.train_files`` and its eval set the first ``train.eval_size`` rows of ``data.val_files``
(none: no eval, NaN); without demonstrations (no response field) the warm start is skipped
with a note in ``warm_info``.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from jigsawrl.config import PipelineSpec
from jigsawrl.engine.agent import AgentLoop
from jigsawrl.engine.checkpoint import (
    apply_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from jigsawrl.engine.device import resolve_device, to_device, to_host
from jigsawrl.engine.prompts import check_data, render_examples
from jigsawrl.engine.trainer import (
    GRPOConfig,
    GRPOTrainer,
    TrainBatch,
    build_batch,
    group_advantages,
)
from jigsawrl.engine.trajectory import RESPONSE_END, Trajectory, encode_prompt
from jigsawrl.engine.warmstart import WarmStartSpec, warm_start

log = logging.getLogger(__name__)

POOL_SIZE = 2048  # training prompts drawn once; each step samples batch_size of them


@dataclass
class StepData:
    """What flows between the sub-stages of one step."""

    step: int
    trajectories: list[Trajectory]
    rewards: torch.Tensor | None = None
    reward_infos: list[dict[str, Any]] = field(default_factory=list)
    batch: TrainBatch | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def build_model_and_tokenizer(model: str, seed: int, where: str = "pipelines.model",
                              device: torch.device | None = None) -> tuple[torch.nn.Module, Any]:
    """An ``ENGINE_MODELS`` preset (random init, char tokenizer) or a local HF model folder,
    built on the CPU and then moved to ``device`` (None: left on the CPU)."""
    from jigsawrl.engine.models import ENGINE_MODELS, build_model, load_local_model
    from jigsawrl.errors import ConfigError

    if model in ENGINE_MODELS or Path(model).is_dir():
        net, tokenizer = (build_model(model, seed=seed) if model in ENGINE_MODELS
                          else load_local_model(model))
        return (net if device is None else net.to(device)), tokenizer
    raise ConfigError(f"unknown engine model {model!r}", where=where,
                      fix=f"use a preset ({', '.join(ENGINE_MODELS)}) or a local model folder")


def grpo_config(tr: Any) -> GRPOConfig:
    """The trainer's hyper-parameters from a pipeline's ``train`` spec (``TrainSpec``)."""
    return GRPOConfig(lr=tr.lr, clip_eps=tr.clip_eps, kl_coef=tr.kl_coef, grad_clip=tr.grad_clip,
                      micro_batch_size=tr.micro_batch_size, ppo_epochs=tr.ppo_epochs,
                      recompute_old_logprobs=tr.recompute_old_logprobs, autocast=tr.autocast)


def is_own_model(model: str) -> bool:
    """Whether ``model`` names a local folder (a user's model) rather than an engine preset."""
    from jigsawrl.engine.models import ENGINE_MODELS

    return model not in ENGINE_MODELS


def check_pipeline(spec: PipelineSpec, where: str | None = None) -> Any:
    """Build ``spec``'s task and check its data against the model's tokenizer and config,
    without building the model (what a run does for every pipeline before it starts one).

    Returns:
        The task (hand it to :class:`RealPipeline` to skip building it again).

    Raises:
        ConfigError: a bad task, model name, reward file, or a chat prompt for an own model
            without a chat template.
        InputError: a missing or bad data file (file, line, field), a model folder that is
            broken or whose tokenizer does not fit its vocab_size, a prompt that does not fit.
    """
    from jigsawrl.tasks import build_task

    where = where or f"pipelines[{spec.name}]"
    tokenizer, positions = pipeline_tokenizer(spec, where)
    task = build_task(spec, where)
    check_data(task, tokenizer, own_model=is_own_model(spec.model), max_positions=positions,
               max_batch_tokens=spec.rollout.max_batch_tokens,
               unknown_chars=spec.data.unknown_chars if spec.data else "unk", where=where)
    return task


def pipeline_tokenizer(spec: PipelineSpec, where: str | None = None) -> tuple[Any, int]:
    """The tokenizer of ``spec``'s model and its position limit, without building the model:
    the presets' character tokenizer, or a local folder's own.

    Raises:
        ConfigError: neither a preset nor a model folder.
        InputError: a model folder that is broken.
    """
    from jigsawrl.engine.models import ENGINE_MODELS, inspect_local_model
    from jigsawrl.engine.tokenizer import build_char_tokenizer
    from jigsawrl.errors import ConfigError

    where = where or f"pipelines[{spec.name}]"
    if spec.model in ENGINE_MODELS:
        return build_char_tokenizer(), ENGINE_MODELS[spec.model].max_position_embeddings
    if Path(spec.model).is_dir():
        tokenizer, config = inspect_local_model(spec.model)
        return tokenizer, int(getattr(config, "max_position_embeddings", 0) or 2048)
    raise ConfigError(f"unknown engine model {spec.model!r}", where=f"{where}.model",
                      fix=f"use a preset ({', '.join(ENGINE_MODELS)}) or a local model "
                          "folder (config.json, *.safetensors, tokenizer files)")


PROMPT_SAMPLE = 64  # prompts of the training split measured for the schedulers' prior


def mean_prompt_tokens(spec: PipelineSpec, task: Any, seed: int) -> int:
    """Mean prompt length, in the pipeline's own tokens, of the first ``PROMPT_SAMPLE`` prompts
    of ``task``'s training split, rendered and encoded as the engine will (BOS included).

    Why: a real task has no preset, and the schedulers' prior of one step (``scheduler/
    verl_placements.prior_prompt_tokens``) needs its prompt length before the first step; the
    prompts are inputs, known before anything is generated. Measured when a real run resolves
    (``experiments/resolve.resolve_real``).
    """
    tokenizer, _ = pipeline_tokenizer(spec)
    examples = render_examples(tokenizer, task.make_dataset(PROMPT_SAMPLE, seed, "train"))
    if not examples:
        raise ValueError(f"task of pipeline {spec.name!r} made no prompts")
    total = sum(len(encode_prompt(tokenizer, ex.prompt)) for ex in examples)
    return max(1, round(total / len(examples)))


class RealPipeline:
    """A GRPO pipeline on one local device, the CPU or a CUDA GPU (see module docstring).

    Args:
        spec: the pipeline's config section.
        seed: experiment seed.
        cache_dir: warm-start cache folder (None: the default).
        reward_fn: optional ``fn(solution_str, example) -> float`` replacing the task's reward
            (a reward that raises or returns a non-number gives 0 with the reason logged).
        task: the pipeline's task already built and checked by :func:`check_pipeline`
            (None: :meth:`start` builds and checks it).
        device: where models, KV cache and batches live (None: ``spec.train.device`` resolved
            by :func:`~jigsawrl.engine.device.resolve_device`; a Ray worker passes its own).
    """

    def __init__(self, spec: PipelineSpec, seed: int = 0, *, cache_dir: Path | None = None,
                 reward_fn: Any = None, task: Any = None,
                 device: torch.device | None = None) -> None:
        self.spec = spec
        self.device = device or resolve_device(spec.train.device,
                                               where=f"pipelines[{spec.name}].train.device")
        self.seed = seed
        self.cache_dir = cache_dir
        self.reward_fn = reward_fn
        self.checked_task = task
        self.started = False
        self.warm_info: dict[str, Any] = {}

    # ------------------------------------------------------------------ set-up

    def start(self, *, train: bool = True) -> None:
        """Build task, model, datasets and rollout engine; with ``train`` also the warm start,
        the reference and the trainer (the slow part).

        ``train=False`` builds a *rollout-only* copy (what a Ray device worker hosts for a
        pipeline whose train state lives elsewhere): its engine keeps the preset's random
        weights (:meth:`new_engine` makes engines with given weights), and
        :meth:`import_train_state` can add the trainer later.
        """
        from jigsawrl.engine.rollout import RolloutEngine

        spec, tr = self.spec, self.spec.train
        torch.set_num_threads(tr.threads or os.cpu_count() or 1)
        torch.manual_seed(self.seed)
        self.task = self.checked_task
        if self.task is None:
            self.task = check_pipeline(spec)
        self.model, self.tokenizer = build_model_and_tokenizer(
            spec.model, self.seed, where=f"pipeline {spec.name!r}: model", device=self.device)
        size = getattr(self.task, "size", None)
        pool_size = size("train") if callable(size) else POOL_SIZE
        self.pool = render_examples(self.tokenizer,
                                    self.task.make_dataset(pool_size, self.seed, "train"))
        self.eval_set = render_examples(self.tokenizer,
                                        self.task.make_dataset(tr.eval_size, self.seed, "test"))
        if train:
            self.warm_info = self._warm_start()
            self._make_trainer(self.model)
        else:
            self.trainer = None
        self.engine = RolloutEngine(copy.deepcopy(self.model).eval(), self.tokenizer,
                                    max_batch_tokens=spec.rollout.max_batch_tokens,
                                    max_num_seqs=spec.rollout.max_num_seqs)
        if not train:
            self.model = None  # the rollout-only copy keeps no actor
        self.max_new_tokens = min(spec.max_response_tokens, int(self.task.max_response_chars))
        self.started = True

    def _warm_start(self) -> dict[str, Any]:
        """The supervised warm start on the pool's demonstrations (skipped, with the reason in
        the returned info, when the data has none)."""
        spec, tr = self.spec, self.spec.train
        if tr.warmup_steps and not any(getattr(ex, "demo", "") for ex in self.pool):
            reason = ("no demonstrations: the data has no response field (data.response_key, "
                      "default extra_info.answer), so the warm start is skipped and RL starts "
                      "from the model as it is")
            log.warning("pipeline %s: %s", spec.name, reason)
            return {"cached": False, "duration_s": 0.0, "path": "", "skipped": reason}
        model_key = spec.model
        if is_own_model(spec.model):
            from jigsawrl.engine.models import folder_fingerprint

            model_key = f"{Path(spec.model).resolve()}@{folder_fingerprint(spec.model)}"
        task_key = getattr(self.task, "cache_key", None) or \
            f"{spec.task}{spec.rollout.task_params}"
        ws = WarmStartSpec(model_key=model_key, task_key=task_key, seed=self.seed,
                           steps=tr.warmup_steps, lr=tr.warmup_lr,
                           batch_size=tr.warmup_batch_size)
        return warm_start(self.model, self.tokenizer, self.pool, ws, self.cache_dir,
                          task=self.task)

    def _make_trainer(self, model: torch.nn.Module) -> None:
        tr = self.spec.train
        ref = copy.deepcopy(model) if tr.kl_coef > 0 else None
        self.trainer = GRPOTrainer(model, grpo_config(tr), ref_model=ref)

    # ------------------------------------------------------------------ state that moves

    @property
    def has_trainer(self) -> bool:
        return self.trainer is not None

    def export_train_state(self) -> dict[str, Any]:
        """Hand over the train state (actor, optimizer moments, reference) and drop it here.

        What the Ray executor's offload moves to host memory (the object store) and an onload
        brings back, possibly to another worker. Raises ``RuntimeError`` without a trainer.
        """
        if self.trainer is None:
            raise RuntimeError(f"{self.spec.name}: no train state here to export")
        ref = self.trainer.ref_model  # host copies: the state leaves the device (offload)
        state = {"model": to_host(self.model.state_dict(), copy=True),
                 "optimizer": to_host(self.trainer.optimizer.state_dict()),
                 "ref": None if ref is None else to_host(ref.state_dict())}
        self.trainer, self.model = None, None
        return state

    def import_train_state(self, state: dict[str, Any]) -> None:
        """Rebuild the actor, optimizer and reference here from :meth:`export_train_state`
        (the actor's architecture from the rollout engine's config, uninitialised, then filled:
        :func:`~jigsawrl.engine.models.empty_model`)."""
        from jigsawrl.engine.models import empty_model

        model = empty_model(self.engine.model.config, self.device)
        model.load_state_dict(state["model"])
        self.model = model
        self._make_trainer(model)
        assert self.trainer is not None
        self.trainer.optimizer.load_state_dict(state["optimizer"])
        if state.get("ref") is not None and self.trainer.ref_model is not None:
            self.trainer.ref_model.load_state_dict(state["ref"])

    def actor_weights(self) -> dict[str, torch.Tensor]:
        """A host copy of the actor's weights (what a weight sync broadcasts)."""
        if self.model is None:
            raise RuntimeError(f"{self.spec.name}: no actor here")
        return to_host(self.model.state_dict(), copy=True)

    def new_engine(self, weights: dict[str, torch.Tensor]) -> Any:
        """A fresh rollout engine holding ``weights`` (one per rollout rank on a Ray worker, so
        that ranks of different steps of an async pipeline keep their own weights version)."""
        from jigsawrl.engine.rollout import RolloutEngine

        ro = self.spec.rollout
        engine = RolloutEngine(copy.deepcopy(self.engine.model).eval(), self.tokenizer,
                               max_batch_tokens=ro.max_batch_tokens, max_num_seqs=ro.max_num_seqs)
        engine.load_weights(weights)
        return engine

    def _params(self, temperature: float, top_p: float, seed: int | None) -> Any:
        from jigsawrl.engine.rollout import SamplingParams

        end = getattr(self.task, "response_end", RESPONSE_END)  # None: EOS or length only
        stop = tuple(dict.fromkeys((*self.task.stop, *((end,) if end else ()))))
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=temperature,
                              top_p=top_p, stop=stop, seed=seed)

    def _generate(self, examples: list[Any], ids: list[str], params: list[Any]) -> list[Trajectory]:
        from jigsawrl.engine.rollout import GenerationRequest

        reqs = [(ex, GenerationRequest(rid, encode_prompt(self.tokenizer, ex.prompt), p))
                for ex, rid, p in zip(examples, ids, params, strict=True)]
        loop = AgentLoop(self.engine, self.tokenizer, self.task,
                         extra_latency_s=self.spec.rollout.tool_latency_s)
        return loop.run(reqs)

    # ------------------------------------------------------------------ sub-stages

    def prompts_for(self, step: int) -> list[Any]:
        """The ``batch_size`` prompts of ``step`` (a function of seed and step only)."""
        rng = np.random.default_rng([self.seed, step])
        n = self.spec.batch_size
        idx = rng.choice(len(self.pool), size=n, replace=n > len(self.pool))
        return [self.pool[int(i)] for i in idx]

    def step_requests(self, step: int) -> list[tuple[Any, Any]]:
        """The ``(example, GenerationRequest)`` pairs of ``step``, groups contiguous (a
        function of seed and step only, so any worker builds the same requests)."""
        from jigsawrl.engine.rollout import GenerationRequest

        g, ro = self.spec.group_size, self.spec.rollout
        out = []
        for i, ex in enumerate(self.prompts_for(step)):
            for j in range(g):
                seed = (self.seed * 1_000_003 + step * 10_007 + i * g + j) % 2**31
                out.append((ex, GenerationRequest(
                    f"{self.spec.name}/{step}/{i}/{j}",
                    encode_prompt(self.tokenizer, ex.prompt),
                    self._params(ro.temperature, ro.top_p, seed))))
        return out

    def rollout(self, step: int) -> StepData:
        """Sample ``group_size`` responses per prompt (groups contiguous)."""
        loop = AgentLoop(self.engine, self.tokenizer, self.task,
                         extra_latency_s=self.spec.rollout.tool_latency_s)
        return StepData(step, loop.run(self.step_requests(step)))

    def score(self, traj: Trajectory) -> tuple[float, dict[str, Any]]:
        """The reward of one trajectory; never raises (bad rewards give 0, reason logged)."""
        from jigsawrl.tasks import safe_score

        if self.reward_fn is None:
            return safe_score(self.task, traj.response_text, traj.example)
        fn = self.reward_fn
        shim = SimpleNamespace(name=self.spec.task,
                               compute_score=lambda *_a, **_k: fn(traj.response_text, traj.example))
        return safe_score(shim, traj.response_text, traj.example)  # type: ignore[arg-type]

    def reward(self, data: StepData) -> None:
        """Score every response, compute advantages and build the training batch."""
        scored = [self.score(t) for t in data.trajectories]
        self.prepare(data, [s for s, _ in scored], [info for _, info in scored])

    def prepare(self, data: StepData, rewards: list[float],
                infos: list[dict[str, Any]]) -> None:
        """Attach rewards scored elsewhere (a Ray reward worker), compute the group advantages
        and build the training batch."""
        data.rewards = torch.tensor(rewards, dtype=torch.float32)
        data.reward_infos = list(infos)
        adv = group_advantages(data.rewards, self.spec.group_size)
        seqs = [(t.prompt_ids, t.response_ids, t.response_mask) for t in data.trajectories]
        data.batch = to_device(build_batch(seqs, adv, self.tokenizer.pad_token_id), self.device)

    def old_logprob(self, data: StepData) -> None:
        """Recompute the behaviour log-probs (skipped when the trainer's on-policy shortcut
        applies: ``recompute_old_logprobs: false`` with one PPO epoch)."""
        assert data.batch is not None, "run reward() first"
        if not self.trainer.on_policy_shortcut:  # a batch from host memory is moved back first
            lp = self.trainer.old_logprobs(to_device(data.batch, self.device))
            data.batch.old_logprobs = lp.to(self.device)

    def ref_logprob(self, data: StepData) -> None:
        assert data.batch is not None, "run reward() first"
        if self.trainer.ref_model is not None:
            lp = self.trainer.ref_logprobs(to_device(data.batch, self.device))
            data.batch.ref_logprobs = lp.to(self.device)

    def update(self, data: StepData) -> dict[str, float]:
        assert data.batch is not None, "run reward() first"
        metrics = self.trainer.update(to_device(data.batch, self.device))
        data.metrics.update(metrics)
        return metrics

    def weight_sync(self) -> None:
        """Copy the actor's weights into the rollout engine."""
        self.engine.load_weights({k: v.detach() for k, v in self.model.state_dict().items()})

    # ------------------------------------------------------------------ a whole step

    def run_step(self, step: int) -> dict[str, float]:
        """Run the six sub-stages of ``step``; return its verl-named metrics."""
        timings: dict[str, float] = {}
        t_step = time.perf_counter()

        def timed(name: str, fn: Any, *args: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args)
            timings[f"timing_s/{name}"] = time.perf_counter() - t0
            return out

        data: StepData = timed("gen", self.rollout, step)
        timed("reward", self.reward, data)
        timed("old_log_prob", self.old_logprob, data)
        timed("ref", self.ref_logprob, data)
        timed("update_actor", self.update, data)
        timed("update_weights", self.weight_sync)
        timings["timing_s/step"] = time.perf_counter() - t_step
        return {**rollout_metrics(data, timings["timing_s/step"]), **data.metrics, **timings}

    def evaluate(self, n: int | None = None) -> float:
        """Mean reward of greedy responses to the held-out prompts."""
        examples = self.eval_set[: n or len(self.eval_set)]
        if not examples:
            return float("nan")
        ids = [f"{self.spec.name}/eval/{i}" for i in range(len(examples))]
        params = [self._params(0.0, 1.0, 0) for _ in examples]
        trajs = self._generate(examples, ids, params)
        return float(np.mean([self.score(t)[0] for t in trajs]))

    # ------------------------------------------------------------------ checkpoints

    def save(self, root: Path, step: int, meta: dict[str, Any] | None = None) -> Path:
        return save_checkpoint(root, step, self.model, self.trainer.optimizer, meta)

    def restore(self, root: Path) -> dict[str, Any] | None:
        """Load the latest checkpoint under ``root`` (and sync the engine); its meta or None."""
        path = latest_checkpoint(root)
        if path is None:
            return None
        ckpt = load_checkpoint(path)
        apply_checkpoint(ckpt, self.model, self.trainer.optimizer)
        self.weight_sync()
        log.info("resumed %s from %s (step %d)", self.spec.name, path, ckpt.step)
        return ckpt.meta


def rollout_metrics(data: StepData, step_s: float) -> dict[str, float]:
    """Score, length, tool-call and throughput metrics of a step (verl names where they exist)."""
    trajs = data.trajectories
    rewards = data.rewards if data.rewards is not None else torch.zeros(len(trajs))
    resp = np.array([len(t.response_ids) for t in trajs], dtype=float)
    prompt = np.array([len(t.prompt_ids) for t in trajs], dtype=float)
    tokens = float(resp.sum() + prompt.sum())
    from jigsawrl.tasks import reward_error_metrics

    return {
        "critic/score/mean": float(rewards.mean()), "critic/score/max": float(rewards.max()),
        "critic/score/min": float(rewards.min()),
        "response_length/mean": float(resp.mean()), "response_length/max": float(resp.max()),
        "response_length/clip_ratio": float(np.mean([t.finish_reason == "length" for t in trajs])),
        "prompt_length/mean": float(prompt.mean()),
        "env/tool_calls_per_sample": float(np.mean([t.num_tool_calls for t in trajs])),
        "env/tool_wait_s": float(sum(t.tool_wait_s for t in trajs)),
        **reward_error_metrics(data.reward_infos),
        "perf/total_num_tokens": tokens,
        "perf/throughput": tokens / step_s if step_s > 0 else 0.0,
        "perf/samples_per_s": len(trajs) / step_s if step_s > 0 else 0.0,
    }
