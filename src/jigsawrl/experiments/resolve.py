"""From a validated config to a resolved :class:`~jigsawrl.workload.experiment.Experiment`:
presets looked up, feasibility checked — for simulated runs (:func:`resolve`) and real runs on
Ray (:func:`resolve_real`).

Schema errors are caught in ``config.py``; here we catch what needs the presets or the file
system: unknown accelerator / model / task / scheduler names (with a "did you mean"), a
``length_trace`` that cannot be read, TP larger than a node, a model that cannot fit, a pipeline
that asks for more devices than the cluster has, and a workload larger than the *request budget*.
Each error names the key and the fix.

The request budget: a config samples Σ batch_size × group_size × steps requests over its
pipelines, all held in memory by the simulator (~0.5 KB each). Both resolvers refuse a config over
the budget — :data:`DEFAULT_MAX_REQUESTS`, sized for a laptop; the largest shipped config samples
~20,000 — *before* anything is sampled, with the size, the budget and the fix. ``jigsawrl
--max-requests N`` (or ``JIGSAWRL_MAX_REQUESTS``) raises it for one command
(:func:`request_budget`).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jigsawrl.config import ExperimentConfig, PipelineSpec
from jigsawrl.costmodel.memory import response_kv_room
from jigsawrl.errors import ConfigError, InputError
from jigsawrl.workload.accelerators import ACCELERATORS, AcceleratorSpec
from jigsawrl.workload.engine_models import ENGINE_MODELS
from jigsawrl.workload.experiment import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    Experiment,
    ResolvedPipeline,
)
from jigsawrl.workload.models import MODELS, ModelSpec
from jigsawrl.workload.realpresets import REAL_ACCELERATORS, engine_model_spec
from jigsawrl.workload.task_presets import TASKS, RequestSampler, TaskSpec, load_length_trace

log = logging.getLogger(__name__)

# Requests (prompts × responses × steps, all pipelines) a config may sample: 100x the largest
# shipped config (configs/scale-64.yaml, configs/real/arithmetic.yaml: 20,480), about 1 GB of
# sampled requests — a laptop's worth.
DEFAULT_MAX_REQUESTS = 2_000_000
MAX_REQUESTS_ENV = "JIGSAWRL_MAX_REQUESTS"
# The budget in force: a module value rather than a context variable, so that every thread of a
# command sees the budget its CLI flag set (request_budget restores the old value on exit).
_max_requests = DEFAULT_MAX_REQUESTS


def max_requests() -> int:
    """The request budget in force (:data:`DEFAULT_MAX_REQUESTS` unless raised)."""
    return _max_requests


@contextmanager
def request_budget(limit: int | None) -> Iterator[None]:
    """Run the block with a request budget of ``limit`` (None: the default).

    Raises:
        ConfigError: ``limit`` below 1.
    """
    global _max_requests
    if limit is not None and limit < 1:
        raise ConfigError(f"the request budget must be at least 1, got {limit}",
                          where="--max-requests")
    before = _max_requests
    _max_requests = DEFAULT_MAX_REQUESTS if limit is None else limit
    try:
        yield
    finally:
        _max_requests = before


def sampled_requests(cfg: ExperimentConfig) -> int:
    """How many requests ``cfg`` samples: Σ batch_size × group_size × steps over pipelines."""
    return sum(p.batch_size * p.group_size * p.steps for p in cfg.pipelines)


def check_request_budget(cfg: ExperimentConfig, limit: int | None = None) -> None:
    """Refuse a config that samples more requests than the budget, before anything is sampled.

    Raises:
        ConfigError: with the size, the budget, the largest pipeline and the fix.
    """
    limit = max_requests() if limit is None else limit
    total = sampled_requests(cfg)
    if total <= limit:
        return
    i, p = max(enumerate(cfg.pipelines),
               key=lambda ip: ip[1].batch_size * ip[1].group_size * ip[1].steps)
    raise ConfigError(
        f"this config samples {total:,} requests (batch_size × group_size × steps, summed over "
        f"{len(cfg.pipelines)} pipeline(s)), over the budget of {limit:,}; the largest is "
        f"pipelines.{i} ({p.name!r}): {p.batch_size:,} × {p.group_size:,} × {p.steps:,}",
        where="pipelines",
        fix=f"lower batch_size, group_size or steps, or raise the budget for one command: "
            f"jigsawrl --max-requests {_round_up(total)} ... (or {MAX_REQUESTS_ENV}; each request "
            f"is held in memory, ~0.5 KB)")


def _round_up(n: int) -> int:
    """``n`` rounded up to two significant digits (a budget to suggest)."""
    step = 10 ** max(0, len(str(n)) - 2)
    return -(-n // step) * step


def _lookup(table: Iterable[str] | dict[str, Any], name: str, where: str, what: str,
            listing: str | None = None):  # noqa: ANN202
    """``table[name]`` (or ``name`` for a list), else a ConfigError with a "did you mean"."""
    if name in table:
        return table[name] if isinstance(table, dict) else name
    close = difflib.get_close_matches(name, list(table), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    listing = listing or f"jigsawrl list {what}s"
    raise ConfigError(f"unknown {what} {name!r}", where=where,
                      fix=f"{hint}known: {', '.join(sorted(table))} (see `{listing}`)")


def check_policy(name: str, where: str = "scheduler.name") -> str:
    """``name`` if it is a registered policy, else a ConfigError with a "did you mean".

    ``unknown scheduler`` is the wording ``scheduler.base.get_policy`` uses too.
    """
    from jigsawrl.scheduler import list_policies

    return _lookup(list_policies(), name, where, "scheduler")


def _load_trace(where: str, path: str) -> list[tuple[int, int]]:
    """The length trace of ``where`` (a file problem is a ConfigError naming the key)."""
    try:
        return load_length_trace(path)
    except InputError as exc:
        first = str(exc).splitlines()[0].removeprefix(f"{exc.where}: ")
        rel = "" if path.startswith("/") else " (a relative path is read from the current folder)"
        raise ConfigError(f"{path!r}: {first}", where=f"{where}.length_trace",
                          fix=f"{exc.fix or 'fix the file'}{rel}") from None


def resolve(cfg: ExperimentConfig, cost_factory=None) -> Experiment:  # noqa: ANN001
    """Look up presets and check feasibility.

    Args:
        cfg: a schema-valid config.
        cost_factory: ``accel -> CostModel`` used for memory checks (default: the roofline model).

    Raises:
        ConfigError: naming the key and the fix (an over-budget workload included, see
            :func:`check_request_budget`).
    """
    accel = _lookup(ACCELERATORS, cfg.cluster.accelerator, "cluster.accelerator", "accelerator")
    check_request_budget(cfg)
    if cost_factory is None:
        from jigsawrl.costmodel import CostModel

        cost_factory = CostModel
    cost = cost_factory(accel)
    pipes = tuple(_resolve_pipeline(cfg, i, p, accel, cost) for i, p in enumerate(cfg.pipelines))
    return Experiment(cfg, accel, pipes)


def _resolve_pipeline(cfg: ExperimentConfig, i: int, p: PipelineSpec, accel: AcceleratorSpec,
                      cost) -> ResolvedPipeline:  # noqa: ANN001
    where = f"pipelines.{i}"
    model = _lookup(MODELS, p.model, f"{where}.model", "model")
    task = _sim_task(where, p)
    per_node = cfg.cluster.accelerators_per_node
    for key in ("rollout_tp", "train_tp"):
        tp = getattr(p, key)
        if tp > per_node:
            raise ConfigError(f"{key}={tp} is larger than a node ({per_node} accelerators)",
                              where=f"{where}.{key}",
                              fix=f"use {key} <= {per_node} (tensor parallelism stays in a node)")
    n = _num_devices(cfg, i, p)
    if n % p.rollout_tp:
        raise ConfigError(f"num_devices={n} is not a multiple of rollout_tp={p.rollout_tp}",
                          where=f"{where}.num_devices")
    _check_memory(where, p, model, accel, cost, n)
    trace = _load_trace(where, p.length_trace) if p.length_trace else None
    sampler = RequestSampler(task, group_size=p.group_size,
                             max_response_tokens=p.max_response_tokens,
                             drift_per_step=p.length_drift_per_step, trace=trace)
    return ResolvedPipeline(i, p, model, task, sampler)


def _sim_task(where: str, p: PipelineSpec) -> TaskSpec:
    """The length distribution a simulated pipeline samples: its task preset; for a pipeline
    that reads data files (``data:``) and names no preset, a stub replayed from its
    ``length_trace`` (the simulator does not read the data).

    Raises:
        ConfigError: an unknown task preset, or a data pipeline with neither preset nor trace.
    """
    if p.data is not None and (p.task is None or p.task not in TASKS):
        if p.length_trace:
            return stub_task(p)
        raise ConfigError(
            "this pipeline reads its prompts from data files, and the simulator samples lengths, "
            "not data: it needs a task preset or a length_trace for them", where=f"{where}.data",
            fix=f"set {where}.task to a preset whose lengths are alike ({', '.join(sorted(TASKS))}"
                f"; `jigsawrl list tasks`), or {where}.length_trace to a file of "
                "'prompt_tokens,response_tokens' lines (e.g. measured by a real run)")
    if p.task is None:  # the config refuses a pipeline with neither task nor data
        raise ConfigError("no task", where=f"{where}.task", fix="name a task preset")
    return _lookup(TASKS, p.task, f"{where}.task", "task")


def _num_devices(cfg: ExperimentConfig, i: int, p: PipelineSpec) -> int:
    """The devices pipeline ``i`` may use (its ``num_devices``, else the whole cluster)."""
    n = p.num_devices or cfg.cluster.num_devices
    if n > cfg.cluster.num_devices:
        raise ConfigError(f"num_devices={n} but the cluster has {cfg.cluster.num_devices}",
                          where=f"pipelines.{i}.num_devices", fix="lower it or grow the cluster")
    return n


def _check_memory(where: str, p: PipelineSpec, model: ModelSpec, accel: AcceleratorSpec,
                  cost, n: int) -> None:  # noqa: ANN001
    ok, why = cost.fits_training(model, n)
    if not ok:
        raise ConfigError(f"{p.model} cannot train on {n} x {accel.name}: {why}",
                          where=f"{where}.model",
                          fix="use more devices (cluster size or num_devices) or a smaller model")
    budget, need = response_kv_room(cost, model, p.rollout_tp, p.max_response_tokens,
                                    accel.hbm_bytes, DEFAULT_GPU_MEMORY_UTILIZATION)
    if budget < need:
        raise ConfigError(
            f"{p.model} with rollout_tp={p.rollout_tp} leaves {budget / 1e9:.1f} GB for the KV "
            f"cache per device, less than one {p.max_response_tokens}-token response needs "
            f"({need / 1e9:.2f} GB)", where=f"{where}.rollout_tp",
            fix="raise rollout_tp or lower max_response_tokens")


# ---------------------------------------------------------------- real runs (Ray, CPU presets)
def stub_task(p: PipelineSpec) -> TaskSpec:
    """A neutral TaskSpec for a real task (never sampled; see the module docstring)."""
    return TaskSpec(name=p.task or p.name, prompt_mean=32, prompt_std=0, response_median=max(
        1, p.max_response_tokens // 4), response_sigma=0.0, prompt_difficulty_sigma=0.0,
        description="stub of a real task: lengths are observed from the engine")


def resolve_real(cfg: ExperimentConfig) -> Experiment:
    """Resolve a real-run config against the CPU presets.

    Raises:
        ConfigError: an accelerator that is not a CPU preset, an unknown engine model, task or
            scheduler, bad task params, a reward file that is missing, cannot be imported or
            lacks its function (``custom_reward_function``), tensor parallelism (the CPU engine
            has none), more devices than the cluster has, an unreadable ``length_trace``, or a
            workload over the request budget.
        InputError: a data file that is missing or holds a bad row (file, line, field).
    """
    from jigsawrl.tasks import build_task, list_tasks

    if cfg.cluster.accelerator not in REAL_ACCELERATORS:
        close = difflib.get_close_matches(cfg.cluster.accelerator, list(REAL_ACCELERATORS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{cfg.cluster.accelerator!r} is not a real-run accelerator",
                          where="cluster.accelerator",
                          fix=f"{hint}use one of {sorted(REAL_ACCELERATORS)} for real runs")
    accel = REAL_ACCELERATORS[cfg.cluster.accelerator]
    check_policy(cfg.scheduler.name)
    check_request_budget(cfg)
    pipes = []
    specs: list[PipelineSpec] = []  # with the prompt lengths measured
    for i, p in enumerate(cfg.pipelines):
        where = f"pipelines.{i}"
        if p.task is not None:
            _lookup(list_tasks(), p.task, f"{where}.task", "real task", "jigsawrl list tasks")
        own_model = p.model not in ENGINE_MODELS and Path(p.model).is_dir()
        if not own_model:
            _lookup(ENGINE_MODELS, p.model, f"{where}.model", "engine model preset",
                    "jigsawrl list models (or a local Hugging Face folder)")
        try:  # bad task params, data files or reward files fail here, not in a Ray worker
            if own_model:  # the folder, its tokenizer against its config and the data too
                from jigsawrl.engine.pipeline import check_pipeline

                built = check_pipeline(p, where)
            else:
                built = build_task(p, where)
        except ConfigError as exc:
            if exc.where != f"{where}.task":
                raise
            message = str(exc).split("\n  fix: ")[0].removeprefix(f"{exc.where}: ")
            raise ConfigError(message, where=f"{where}.rollout.task_params",
                              fix=exc.fix) from None
        if p.rollout_tp != 1 or p.train_tp != 1:
            raise ConfigError("the CPU engine has no tensor parallelism", where=where,
                              fix="set rollout_tp: 1 and train_tp: 1")
        if p.length_trace:  # not replayed (real runs observe their lengths), but checked
            _load_trace(where, p.length_trace)
        _num_devices(cfg, i, p)
        if p.prompt_tokens is None:
            p = p.model_copy(update={"prompt_tokens": _prompt_tokens(p, built, cfg.seed)})
        p = p.model_copy(update=_tool_priors(p, built))
        specs.append(p)
        task = stub_task(p)
        sampler = RequestSampler(task, group_size=p.group_size,
                                 max_response_tokens=p.max_response_tokens)
        pipes.append(ResolvedPipeline(i, p, engine_model_spec(p.model), task, sampler))
    return Experiment(cfg.model_copy(update={"pipelines": specs}), accel, tuple(pipes))


def _tool_priors(p: PipelineSpec, task: Any) -> dict[str, Any]:
    """The task's own estimate of its tool calls per response and of one result's tokens
    (``tasks/base.py``), for the schedulers' priors, where the config does not set them: a
    multi-turn task's tool waits are known before anything is generated, as its prompts are,
    and a prior without them sees a tool-bound job as short (the four-pipeline real bench:
    jigsaw then fell back to a queue that measured 0.88x its own plan)."""
    out: dict[str, Any] = {}
    if p.prior_tool_calls is None:
        calls = getattr(task, "expected_tool_calls", None)
        if isinstance(calls, int | float) and calls >= 0:
            out["prior_tool_calls"] = float(calls)
    if p.prior_tool_result_tokens is None:
        tokens = getattr(task, "expected_tool_result_tokens", None)
        if isinstance(tokens, int) and tokens >= 0:
            out["prior_tool_result_tokens"] = tokens
    return out


def _prompt_tokens(p: PipelineSpec, task: Any, seed: int) -> int | None:
    """The mean prompt length of ``p``'s task (``engine.pipeline.mean_prompt_tokens``), or None
    (the schedulers' default prior) where it cannot be measured here, said in the log."""
    try:
        from jigsawrl.engine.pipeline import mean_prompt_tokens

        return mean_prompt_tokens(p, task, seed)
    except Exception as exc:  # noqa: BLE001 - a prior, not a check: the run goes on
        log.warning("pipeline %r: prompt length not measured (%s); the schedulers assume the "
                    "default", p.name, exc)
        return None
