"""The experiment config tree: typed, validated, loaded from YAML with dotted overrides.

One tree describes an experiment for both executors (DESIGN.md §5 "one config tree"): the cluster,
the pipelines, the scheduler and the seed. Simulation reads the model/task presets of
``workload/``; a real run (``jigsawrl run``) reads the engine presets and each pipeline's
``rollout`` / ``train`` sections. Schema errors (unknown key, wrong type, negative size) are raised
here as :class:`~jigsawrl.errors.ConfigError` naming the key; semantic checks that need presets
(unknown model, does not fit in memory) live in ``experiments/resolve.py``.

Example::

    cluster: {accelerator: h100-80gb, num_nodes: 1, accelerators_per_node: 8}
    pipelines:
      - {name: a, model: qwen3-4b, task: gsm8k, batch_size: 64, group_size: 4}
    scheduler: {name: verl, params: {}}
    seed: 0
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from jigsawrl.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClusterSpec(_Strict):
    """The accelerator pool. ``accelerator`` is a preset name (``jigsawrl list accelerators``)."""

    accelerator: str = "h100-80gb"
    num_nodes: int = Field(1, ge=1)
    accelerators_per_node: int = Field(8, ge=1)
    price_per_hour: float | None = Field(None, ge=0, description="override of the preset's $/h")

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.accelerators_per_node


class RolloutSpec(_Strict):
    """Sampling settings of a real rollout engine (ignored by the simulator)."""

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_batch_tokens: int = Field(4096, ge=1, description="continuous-batching token budget")
    tool_latency_s: float = Field(0.0, ge=0, description="extra latency added to each tool call")
    max_num_seqs: int = Field(64, ge=1, description="most requests decoding at once")
    task_params: dict[str, Any] = Field(default_factory=dict,
                                        description="task constructor params, e.g. difficulty")


class TrainSpec(_Strict):
    """Trainer settings of a real pipeline (ignored by the simulator)."""

    lr: float = Field(5e-5, gt=0)
    kl_coef: float = Field(0.0, ge=0)
    clip_eps: float = Field(0.2, gt=0)
    micro_batch_size: int = Field(64, ge=1)
    ppo_epochs: int = Field(1, ge=1)
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(150, ge=0, description="supervised warm-start steps before RL")
    warmup_lr: float = Field(1e-3, gt=0)
    warmup_batch_size: int = Field(32, ge=1, description="demos per supervised warm-start step")
    eval_size: int = Field(64, ge=0, description="held-out prompts for greedy eval before/after")
    recompute_old_logprobs: bool = Field(
        True, description="separate old-log-prob pass; False reuses the update's own forward "
                          "when ppo_epochs is 1 (exactly on-policy, as TRL does)")
    threads: int = Field(0, ge=0, description="torch threads; 0 = all cores")
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints; 0 = only at end")


class PipelineSpec(_Strict):
    """One RL pipeline. Sizes are per training step (global batch = batch_size × group_size)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model: str
    task: str
    algorithm: Literal["grpo", "ppo"] = "grpo"
    batch_size: int = Field(64, ge=1, description="prompts per step")
    group_size: int = Field(4, ge=1, description="responses per prompt")
    max_response_tokens: int = Field(8192, ge=1)
    mode: Literal["sync", "async"] = "sync"
    max_staleness: int = Field(0, ge=0)
    steps: int = Field(10, ge=1)
    rollout_tp: int = Field(1, ge=1)
    train_tp: int = Field(1, ge=1)
    num_devices: int | None = Field(None, ge=1, description="devices for this pipeline's own share")
    use_ref: bool = Field(True, description="compute reference log-probs (KL) each step")
    length_trace: str | None = Field(None, description="file of response lengths to replay")
    length_drift_per_step: float = Field(0.0, description="relative growth of lengths per step")
    latency_weight: float = Field(1.0, gt=0, description="scheduler priority weight")
    max_latency_ratio: float | None = Field(None, gt=1.0, description="step-latency bound vs solo")
    start_s: float = Field(0.0, ge=0, description="arrival time of the pipeline")
    rollout: RolloutSpec = RolloutSpec()
    train: TrainSpec = TrainSpec()

    @model_validator(mode="after")
    def _check(self) -> PipelineSpec:
        if self.mode == "sync" and self.max_staleness != 0:
            raise ValueError("max_staleness must be 0 for mode: sync (use mode: async)")
        return self


class SchedulerSpec(_Strict):
    name: str = "verl"
    params: dict[str, Any] = Field(default_factory=dict)


class ExperimentConfig(_Strict):
    cluster: ClusterSpec = ClusterSpec()
    pipelines: list[PipelineSpec] = Field(min_length=1)
    scheduler: SchedulerSpec = SchedulerSpec()
    seed: int = 0
    name: str | None = None

    @model_validator(mode="after")
    def _unique_names(self) -> ExperimentConfig:
        seen: set[str] = set()
        for p in self.pipelines:
            if p.name in seen:
                raise ValueError(f"pipeline name {p.name!r} is used twice; names must be unique")
            seen.add(p.name)
        return self


# --------------------------------------------------------------------------- loading

def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load a config from YAML (or a dict), apply ``key.path=value`` overrides, validate.

    Raises:
        ConfigError: file missing or not YAML, bad override, or schema violation (names the key).
    """
    raw = _read_yaml(Path(path)) if path is not None else dict(data or {})
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
    """Turn pydantic's report into one message per problem, each naming its key and a fix."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        fix = ""
        if err["type"] == "extra_forbidden":
            fix = _suggest_key(err["loc"])
        elif err["type"] == "missing":
            fix = " (add this key)"
        lines.append(f"{loc}: {msg}{fix}")
    return ConfigError("invalid config\n  " + "\n  ".join(lines), where=source)


def _suggest_key(loc: tuple[Any, ...]) -> str:
    model: type[BaseModel] | None = ExperimentConfig
    for part in loc[:-1]:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return ""
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)),
                     None)
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    known = ", ".join(model.model_fields)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {known})"


def dump_config(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML (written next to results)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
