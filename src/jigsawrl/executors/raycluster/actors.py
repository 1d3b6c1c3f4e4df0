"""The Ray worker of a real pipeline: one :class:`PipelineActor` holds one ``RealPipeline``.

What: the driver's stages (``rollout``, ``reward``, ``old_logprob``, ``ref_logprob``,
``actor_update``, ``weight_sync``) become calls of :meth:`PipelineActor.run_stage`, which runs the
matching :class:`~jigsawrl.engine.pipeline.RealPipeline` method on the step's
:class:`~jigsawrl.engine.pipeline.StepData` kept inside the actor (rollout creates it, the later
stages consume it; only timings and token counts travel back to the driver).

Why one actor per pipeline (a simplification of this first slice): the pipeline's model, rollout
engine and optimizer live in one process, so no weights move between workers and a step is the
same code ``engine/run.py`` runs. A rollout is *not* split over data-parallel ranks (one engine
per pipeline). Long-tail migration and per-rank compute shares need one worker per device; they
come with per-device worker actors in the next slice.

Actors are created with ``num_cpus=0`` (cpu-notes.md: an actor reserves one CPU by default, so a
third actor on a 2-CPU machine would hang); CPU time is divided by the torch thread count each
call gets (the executor maps a compute share to threads), not by Ray's resource accounting.

This module is imported only where ``ray`` is installed (``executors/raycluster/``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

log = logging.getLogger(__name__)

RewardFn = Callable[[str, Any], float]

# The driver's stage names -> the RealPipeline method each runs.
STAGE_METHODS = {
    "rollout": "rollout", "reward": "reward", "old_logprob": "old_logprob",
    "ref_logprob": "ref_logprob", "actor_update": "update", "weight_sync": "weight_sync",
}


class RewardFailed(RuntimeError):
    """A strict pipeline's reward function failed on some samples (see ``strict_rewards``)."""


class PipelineWorker:
    """The state behind :class:`PipelineActor` (a plain class: callable in-process too).

    Args:
        spec_json: the pipeline's ``PipelineSpec`` as JSON (pydantic models pickle too, but JSON
            keeps the worker independent of the driver's class identity).
        seed: the experiment seed.
        cache_dir: warm-start cache (None: the engine's default).
        reward_fn: optional reward override passed to ``RealPipeline`` (tests inject failures).
        strict_rewards: raise :class:`RewardFailed` when any sample's reward errored.
            ``RealPipeline`` never raises on a bad reward (the sample scores 0 and the reason is
            logged, as verl does); strict mode turns that into a stage failure so that the
            driver stops the pipeline instead of training on zeros.
    """

    def __init__(self, spec_json: str, seed: int, cache_dir: str | None = None,
                 reward_fn: RewardFn | None = None, strict_rewards: bool = False) -> None:
        from jigsawrl.config import PipelineSpec
        from jigsawrl.engine.pipeline import RealPipeline

        t0 = time.perf_counter()
        spec = PipelineSpec.model_validate_json(spec_json)
        self.name = spec.name
        self.strict_rewards = strict_rewards
        self.pipe = RealPipeline(spec, seed, cache_dir=Path(cache_dir) if cache_dir else None,
                                 reward_fn=reward_fn)
        self.pipe.start()
        self.data: dict[int, Any] = {}
        self.start_s = time.perf_counter() - t0
        log.info("pipeline %s ready in %.1f s (pid %d)", self.name, self.start_s, os.getpid())

    def ready(self) -> float:
        """Seconds :meth:`__init__` took (building, warm start); a call to wait on."""
        return self.start_s

    def run_stage(self, stage: str, step: int, threads: int) -> dict[str, Any]:
        """Run one stage of ``step`` with ``threads`` torch threads.

        Returns:
            ``{"compute_s": seconds inside the stage, "threads": threads}``; a rollout adds
            ``"samples": [(sample_id, prompt_tokens, response_tokens, turns), ...]``, an update
            adds ``"metrics"``.

        Raises:
            KeyError: an unknown stage, or a stage whose step has no rollout data here.
            RewardFailed: see ``strict_rewards``.
        """
        import torch

        torch.set_num_threads(max(1, threads))
        t0 = time.perf_counter()
        out: dict[str, Any] = {"threads": threads}
        method = getattr(self.pipe, STAGE_METHODS[stage])
        if stage == "rollout":
            data = self.data[step] = method(step)
            out["samples"] = [(t.request_id, len(t.prompt_ids), len(t.response_ids),
                               1 + t.num_tool_calls) for t in data.trajectories]
        elif stage == "weight_sync":
            method()
            self.data.pop(step, None)  # the step is over: free its trajectories
        else:
            result = method(self.data[step])
            if stage == "reward":
                self._check_rewards(step)
            if stage == "actor_update":
                out["metrics"] = dict(result)
        out["compute_s"] = time.perf_counter() - t0
        return out

    def _check_rewards(self, step: int) -> None:
        if not self.strict_rewards:
            return
        errors = [i["error"] for i in self.data[step].reward_infos if "error" in i]
        if errors:
            raise RewardFailed(f"{self.name} step {step}: reward failed on {len(errors)} "
                               f"sample(s), first: {errors[0]}")


# num_cpus=0: see the module docstring. max_restarts=0: a crashed pipeline stays failed.
PipelineActor = ray.remote(num_cpus=0, max_restarts=0)(PipelineWorker)
