"""The experiment config tree: typed, validated, loaded from YAML with dotted overrides.

One tree describes an experiment for both executors (DESIGN.md §5 "one config tree"): the cluster,
the pipelines, the scheduler and the seed. Simulation reads the model/task presets of
``workload/``; a real run (``jigsawrl run``) reads the engine presets and each pipeline's
``rollout`` / ``train`` sections. Schema errors are raised here as one
:class:`~jigsawrl.errors.ConfigError` naming each bad key, what it means and its valid range:
unknown keys (with a "did you mean"), wrong types, empty names, NaN / ±inf anywhere (free-form
``params`` included), and numbers outside the documented range every numeric field declares
(``Field(ge=..., le=..., description=...)``; the upper bounds are sanity limits). Semantic
checks that need presets or files (unknown model, does not fit in memory, a missing
``length_trace``, a workload over the request budget) live in ``experiments/resolve.py``.
:func:`iter_fields` walks the schema (tests and docs derive the list of keys from it).

Example::

    cluster: {accelerator: h100-80gb, num_nodes: 1, accelerators_per_node: 8}
    pipelines:
      - {name: a, model: qwen3-4b, task: gsm8k, batch_size: 64, group_size: 4}
    scheduler: {name: verl, params: {}}
    seed: 0
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from jigsawrl.errors import ConfigError

# Upper bounds are sanity limits (far beyond any real setup; they turn a typo such as an extra
# "000" into a clear error instead of an out-of-memory crash). The number of requests a whole
# config samples is bounded separately, by the resolvers (experiments/resolve.py).
MAX_DEVICES_PER_NODE = 64
MAX_NODES = 4096
MAX_BATCH = 1_000_000
MAX_GROUP = 1024
MAX_STEPS = 1_000_000
MAX_TOKENS = 1_048_576
MAX_TP = 64
MAX_PIPELINES = 1024
MAX_SEED = 2**32 - 1
NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


class _Strict(BaseModel):
    # allow_inf_nan=False: NaN and ±inf are refused for every float and int field.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _finite_tree(value: Any, path: str = "") -> Any:
    """Refuse NaN / ±inf anywhere inside a free-form mapping (policy or task params)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path or 'value'} must be a finite number, got {value}")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite_tree(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _finite_tree(v, f"{path}.{i}" if path else str(i))
    return value


class ClusterSpec(_Strict):
    """The accelerator pool. ``accelerator`` is a preset name (``jigsawrl list accelerators``)."""

    accelerator: str = Field("h100-80gb", min_length=1,
                             description="accelerator preset: jigsawrl list accelerators")
    num_nodes: int = Field(1, ge=1, le=MAX_NODES, description="nodes in the pool")
    accelerators_per_node: int = Field(8, ge=1, le=MAX_DEVICES_PER_NODE,
                                       description="devices per node")
    price_per_hour: float | None = Field(None, ge=0, le=1000,
                                         description="override of the preset's $/h per device")

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.accelerators_per_node


class RolloutSpec(_Strict):
    """Sampling settings of a real rollout engine (ignored by the simulator, except
    ``enforce_eager``, which the simulator's cost model charges for)."""

    temperature: float = Field(1.0, ge=0, le=10, description="sampling temperature, 0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus-sampling mass")
    max_batch_tokens: int = Field(
        4096, ge=1, le=10_000_000,
        description="the engine's KV budget in tokens (running requests and those paused for a "
                    "tool); size it to hold max_num_seqs requests at their longest, or the engine "
                    "evicts and re-prefills contexts (docs/BENCHMARKS.md, \"The engine's limits\")")
    tool_latency_s: float = Field(0.0, ge=0, le=3600,
                                  description="extra latency added to each tool call")
    max_num_seqs: int = Field(64, ge=1, le=100_000, description="most requests decoding at once")
    enforce_eager: bool = Field(
        False, description="verl's rollout.enforce_eager: decode without CUDA graphs (the "
                           "simulator charges a per-layer launch cost on every decode iteration)")
    task_params: dict[str, Any] = Field(default_factory=dict,
                                        description="task constructor params, e.g. difficulty")

    @field_validator("task_params")
    @classmethod
    def _finite(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _finite_tree(value)


class TrainSpec(_Strict):
    """Trainer settings of a real pipeline (ignored by the simulator, except ``ppo_epochs``,
    ``micro_batch_size`` and the offload flags, which the simulator's cost model charges for:
    ``costmodel/deploy.py``)."""

    lr: float = Field(5e-5, gt=0, le=1, description="RL learning rate")
    kl_coef: float = Field(0.0, ge=0, le=100, description="KL penalty to the reference")
    clip_eps: float = Field(0.2, gt=0, le=10, description="PPO/GRPO ratio clip")
    micro_batch_size: int = Field(64, ge=1, le=100_000, description="samples per backward pass")
    ppo_epochs: int = Field(1, ge=1, le=100, description="update passes over a step's batch")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="gradient-norm clip")
    warmup_steps: int = Field(150, ge=0, le=MAX_STEPS,
                              description="supervised warm-start steps before RL")
    warmup_lr: float = Field(1e-3, gt=0, le=1, description="warm-start learning rate")
    warmup_batch_size: int = Field(32, ge=1, le=100_000,
                                   description="demos per supervised warm-start step")
    eval_size: int = Field(64, ge=0, le=MAX_BATCH,
                           description="held-out prompts for greedy eval before/after")
    recompute_old_logprobs: bool = Field(
        True, description="separate old-log-prob pass; False reuses the update's own forward "
                          "when ppo_epochs is 1 (exactly on-policy, as TRL does)")
    param_offload: bool = Field(
        False, description="verl's actor fsdp_config.param_offload: actor parameters live in "
                           "host memory between calls (loaded and offloaded around each "
                           "log-prob, update and weight sync)")
    optimizer_offload: bool = Field(
        False, description="verl's actor fsdp_config.optimizer_offload: Adam state lives in host "
                           "memory between updates (loaded and offloaded around each update)")
    ref_param_offload: bool = Field(
        False, description="verl's ref fsdp_config.param_offload: the reference model's "
                           "parameters stay in host memory and are copied in for every "
                           "micro-batch of the ref log-prob pass (FSDP CPU offload)")
    threads: int = Field(0, ge=0, le=1024, description="torch threads; 0 = all cores")
    autocast: Literal["off", "bf16"] = Field(
        "off", description="bf16 autocast of the trainer's forward passes (update and log-prob "
                           "passes; weights and optimizer stay fp32). Fast on GPUs and on CPUs "
                           "with AVX512-BF16/AMX; emulated, ~12x slower, on AVX2-only CPUs")
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
        description="where the engine runs: auto (a CUDA GPU when torch sees one; under Ray, "
                    "when Ray assigned the worker a GPU), cpu, cuda or cuda:N "
                    "(engine/device.py; the GPU path is untested until a GPU machine is lent)")
    checkpoint_every: int = Field(0, ge=0, le=MAX_STEPS,
                                  description="steps between checkpoints; 0 = only at end")


class DataSpec(_Strict):
    """A real pipeline's own data, as verl holds it: JSON lines (``.jsonl``) or parquet files
    of rows with ``prompt`` (a string or chat messages), ``reward_model.ground_truth``,
    ``data_source`` and ``extra_info`` (read by ``tasks/dataset.py``; relative paths are read
    from the current folder)."""

    train_files: list[str] = Field(default_factory=list, max_length=1000,
                                   description="training data files (.jsonl, .json or .parquet)")
    val_files: list[str] = Field(default_factory=list, max_length=1000,
                                 description="held-out data files for the greedy eval")
    prompt_key: str = Field("prompt", min_length=1, description="the row field of the prompt")
    response_key: str | None = Field(
        None, min_length=1, description="dotted row field of a correct response for the warm "
        "start, e.g. extra_info.answer (the default, used when rows have it)")
    unknown_chars: Literal["unk", "error"] = Field(
        "unk", description="characters the tokenizer cannot encode: unk (map to its unknown "
                           "token, one warning) or error (refuse, naming file, line, character)")

    @field_validator("train_files", "val_files")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        if any(not isinstance(v, str) or not v for v in value):
            raise ValueError("each file must be a non-empty path")
        return value

    @model_validator(mode="after")
    def _has_train(self) -> DataSpec:
        if not self.train_files:
            raise ValueError("train_files is empty: list at least one data file")
        return self


class RewardFunctionSpec(_Strict):
    """verl's ``custom_reward_function``: a Python file and the name of its
    ``compute_score(data_source, solution_str, ground_truth, extra_info)`` (imported only when a
    real run starts; ``path: null`` means none, as in verl)."""

    path: str | None = Field(None, min_length=1, description="the Python file of the reward")
    name: str = Field("compute_score", min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                      description="the function's name in that file")
    reward_kwargs: dict[str, Any] = Field(default_factory=dict,
                                          description="extra keyword arguments of every call")

    @field_validator("reward_kwargs")
    @classmethod
    def _finite(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _finite_tree(value)


class PipelineSpec(_Strict):
    """One RL pipeline. Sizes are per training step (global batch = batch_size × group_size)."""

    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN,
                      description="unique pipeline name: letters, digits, _ . -")
    model: str = Field(min_length=1, description="model preset: jigsawrl list models")
    task: str | None = Field(None, min_length=1,
                             description="task preset: jigsawrl list tasks (optional with data:)")
    algorithm: Literal["grpo", "ppo"] = Field("grpo", description="RL algorithm")
    batch_size: int = Field(64, ge=1, le=MAX_BATCH, description="prompts per step")
    group_size: int = Field(4, ge=1, le=MAX_GROUP, description="responses per prompt")
    max_response_tokens: int = Field(8192, ge=1, le=MAX_TOKENS,
                                     description="cap on generated tokens per response")
    prompt_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="mean prompt length, in tokens, that the "
        "schedulers' priors assume for a task without a preset (a real task; default: measured "
        "from the task's prompts when a real run resolves, else 128)")
    prior_tool_calls: float | None = Field(
        None, ge=0, le=1000, description="tool calls per response that the schedulers' priors "
        "assume for a task without a preset (a real task; each waits rollout.tool_latency_s; "
        "default: the task's own estimate when a real run resolves, else 0)")
    prior_tool_result_tokens: int | None = Field(
        None, ge=0, le=MAX_TOKENS, description="tokens of one tool result that the schedulers' "
        "priors assume for a task without a preset (default: the task's own estimate when a "
        "real run resolves, else 0)")
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync, or async: rollouts may lag the policy by max_staleness steps")
    max_staleness: int = Field(0, ge=0, le=1000,
                               description="steps a rollout may lag the policy, async only")
    steps: int = Field(10, ge=1, le=MAX_STEPS, description="training steps")
    rollout_tp: int = Field(1, ge=1, le=MAX_TP, description="rollout tensor parallelism")
    train_tp: int = Field(1, ge=1, le=MAX_TP, description="training tensor parallelism")
    num_devices: int | None = Field(None, ge=1, le=MAX_NODES * MAX_DEVICES_PER_NODE,
                                    description="devices for this pipeline's own share")
    use_ref: bool = Field(True, description="compute reference log-probs (KL) each step")
    length_trace: str | None = Field(None, min_length=1,
                                     description="file of response lengths to replay")
    length_drift_per_step: float = Field(
        0.0, gt=-1, le=1, description="relative growth of response lengths per step: "
        "0.01 = 1% longer each step, negative = shorter, 1 = doubling")
    latency_weight: float = Field(1.0, gt=0, le=1000, description="scheduler priority weight")
    max_latency_ratio: float | None = Field(None, gt=1.0, le=1000,
                                            description="step-latency bound vs solo")
    start_s: float = Field(0.0, ge=0, le=1e7, description="arrival time of the pipeline, s")
    rollout: RolloutSpec = Field(RolloutSpec(), description="real-run rollout settings")
    train: TrainSpec = Field(TrainSpec(), description="real-run trainer settings")
    data: DataSpec | None = Field(None, description="real-run data files, verl's fields")
    custom_reward_function: RewardFunctionSpec | None = Field(
        None, description="real-run reward function from a file, verl's spelling")

    @model_validator(mode="after")
    def _check(self) -> PipelineSpec:
        if self.mode == "sync" and self.max_staleness != 0:
            raise ValueError("max_staleness must be 0 for mode: sync (use mode: async)")
        if self.task is None and self.data is None:
            raise ValueError("no task: name a task (jigsawrl list tasks) or give data: "
                             "{train_files: [...]}")
        if self.train.kl_coef > 0 and not self.use_ref:
            # the schedulers plan no reference pass without use_ref, and the trainer's KL term
            # needs one: a real run failed at its first update (2026-12-07)
            raise ValueError(f"train.kl_coef is {self.train.kl_coef:g} but use_ref is false: "
                             "the KL term needs the reference log-probs; set use_ref: true, or "
                             "train.kl_coef: 0")
        return self


class SchedulerSpec(_Strict):
    name: str = Field("verl", min_length=1, description="policy: jigsawrl list schedulers")
    params: dict[str, Any] = Field(default_factory=dict, description="the policy's parameters")

    @field_validator("params")
    @classmethod
    def _finite(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _finite_tree(value)


LOGGERS = ("console", "tensorboard", "wandb")


class TrainerSpec(_Strict):
    """Run-wide tracking, in verl's spelling (``trainer.logger``, ``trainer.project_name``):
    where each pipeline's per-step metrics go (``experiments/loggers.py``). verl's other
    backends (mlflow, swanlab, ...) are not offered."""

    logger: list[str] = Field(["console", "tensorboard"],
                              description="where each step's metrics go (verl's trainer.logger)")
    project_name: str = Field("jigsawrl", min_length=1, max_length=128,
                              description="the Weights & Biases project")

    @field_validator("logger", mode="before")
    @classmethod
    def _one_or_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value  # verl takes a single name too

    @field_validator("logger")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in LOGGERS:
                close = difflib.get_close_matches(name, LOGGERS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown logger {name!r}{hint}; allowed: {', '.join(LOGGERS)}")
        return list(dict.fromkeys(value))


class ExperimentConfig(_Strict):
    cluster: ClusterSpec = Field(ClusterSpec(), description="the accelerator pool")
    pipelines: list[PipelineSpec] = Field(min_length=1, max_length=MAX_PIPELINES,
                                          description="the RL pipelines")
    scheduler: SchedulerSpec = Field(SchedulerSpec(), description="the multiplexing policy")
    trainer: TrainerSpec = Field(TrainerSpec(), description="metric loggers (verl's trainer.logger)")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the sampled workload")
    name: str | None = Field(None, min_length=1, max_length=128, pattern=NAME_PATTERN,
                             description="run name, default: the config file's stem")

    @model_validator(mode="after")
    def _unique_names(self) -> ExperimentConfig:
        seen: set[str] = set()
        for p in self.pipelines:
            if p.name in seen:
                raise ValueError(f"pipeline name {p.name!r} is used twice; names must be unique")
            seen.add(p.name)
        return self


# --------------------------------------------------------------------------- loading

# The block of a paper-matrix file read by ``jigsawrl bench paper`` (``bench/paper_matrix.py``).
BENCH_KEY = "bench"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load a config from YAML (or a dict), apply ``key.path=value`` overrides, validate.

    Raises:
        ConfigError: file missing or not YAML, bad override, or schema violation (names the key).
    """
    raw = _read_yaml(Path(path)) if path is not None else dict(data or {})
    if path is not None and isinstance(raw.get(BENCH_KEY), dict):
        # a paper-matrix file (configs/paper/): its bench block is jigsawrl bench paper's
        # business; the rest is an ordinary config that simulate and compare can run as is
        raw = {k: v for k, v in raw.items() if k != BENCH_KEY}
    for item in overrides or []:
        apply_override(raw, item)
    return validate_config(raw, source=str(path) if path else "config")


def validate_config(raw: dict[str, Any], source: str = "config") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise _to_config_error(exc, source) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError("config file not found", where=str(path),
                          fix="pass the path of a YAML file, e.g. configs/two-gsm8k.yaml")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", where=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError("the top level must be a mapping (cluster:, pipelines:, ...)",
                          where=str(path))
    return raw


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one ``a.b.0.c=value`` override in place; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} has no '='", where="--set",
                          fix="write key.path=value, e.g. pipelines.0.batch_size=128")
    key, _, text = item.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {item!r} has an empty key", where="--set")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        node = _child(node, part, parts[: i + 1], create=isinstance(node, dict))
    last = parts[-1]
    if isinstance(node, list):
        node[_index(node, last, parts)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"cannot set {key!r}: {'.'.join(parts[:-1])} is not a mapping or list",
                          where="--set")


def _child(node: Any, part: str, path: list[str], create: bool) -> Any:
    if isinstance(node, list):
        return node[_index(node, part, path)]
    if isinstance(node, dict):
        if part not in node or node[part] is None:
            if not create:
                raise ConfigError(f"no key {'.'.join(path)!r}", where="--set")
            node[part] = {}
        return node[part]
    raise ConfigError(f"{'.'.join(path[:-1])!r} is a value, not a mapping or list", where="--set")


def _index(node: list[Any], part: str, path: list[str]) -> int:
    try:
        idx = int(part)
    except ValueError:
        raise ConfigError(f"{'.'.join(path)!r}: {part!r} must be a list index", where="--set",
                          fix=f"use a number between 0 and {len(node) - 1}") from None
    if not -len(node) <= idx < len(node):
        raise ConfigError(f"{'.'.join(path)!r}: index {idx} out of range (list has {len(node)})",
                          where="--set")
    return idx


def _to_config_error(exc: ValidationError, source: str) -> ConfigError:
    """Turn pydantic's report into one message, a line per problem, each naming its key, what
    the key means and its valid range (or a fix)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            hint = _suggest_key(err["loc"])
        elif err["type"] == "missing":
            hint = " (add this key)"
        else:
            hint = _field_hint(err["loc"])
        lines.append(f"{loc}: {msg}{hint}")
    return ConfigError("invalid config\n  " + "\n  ".join(lines), where=source)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The config section a field holds (a model, a list of models, or an optional model)."""
    for a in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _section(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose field ``loc[-1]`` is (list indices in ``loc`` are skipped)."""
    model: type[BaseModel] | None = ExperimentConfig
    for part in loc[:-1]:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        model = None if field is None else _model_of(field.annotation)
    return model


def _suggest_key(loc: tuple[Any, ...]) -> str:
    model = _section(loc)
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    known = ", ".join(model.model_fields)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {known})"


def _field_hint(loc: tuple[Any, ...]) -> str:
    """`` (what the key is; valid: range)`` for the field at ``loc`` ('' when unknown)."""
    if not loc or isinstance(loc[-1], int):
        return ""
    model = _section(loc)
    info = None if model is None else model.model_fields.get(str(loc[-1]))
    if info is None:
        return ""
    parts = [info.description or "", field_range(info)]
    text = "; ".join(p for p in parts if p)
    return f" ({text})" if text else ""


def field_range(info: FieldInfo) -> str:
    """The documented valid range of a numeric field, e.g. ``valid: 1 to 1,000,000``."""
    bounds = {k: getattr(m, k) for m in info.metadata for k in ("ge", "gt", "le", "lt")
              if getattr(m, k, None) is not None}
    if not bounds:
        return ""

    def num(v: float) -> str:
        return f"{v:,}" if isinstance(v, int) else f"{v:g}"

    low = (f"{num(bounds['ge'])}" if "ge" in bounds else
           f"> {num(bounds['gt'])}" if "gt" in bounds else "")
    high = (f"{num(bounds['le'])}" if "le" in bounds else
            f"< {num(bounds['lt'])}" if "lt" in bounds else "")
    if low and high:
        return f"valid: {low} to {high}" if "ge" in bounds else f"valid: {low} and <= {high}"
    return f"valid: {low or high}"


def iter_fields(model: type[BaseModel] = ExperimentConfig,
                prefix: str = "") -> Iterator[tuple[str, FieldInfo, type[BaseModel] | None]]:
    """Every key of the config schema as ``(dotted path, field, section model or None)``.

    A list of sections (``pipelines``) is walked through its first element (``pipelines.0``);
    a section is yielded itself, then its keys. Tests and the docs derive the schema from this,
    so a new field is covered without editing them.
    """
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        sub = _model_of(info.annotation)
        yield path, info, sub
        if sub is not None:
            is_list = getattr(info.annotation, "__origin__", None) is list
            yield from iter_fields(sub, f"{path}.0." if is_list else f"{path}.")


def dump_config(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML (written next to results)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
