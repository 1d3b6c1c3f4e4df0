"""The paper's evaluation matrix as data: matrix files (``configs/paper/*.yaml``: an experiment
config plus a ``bench:`` block), the groups read from them, and the results of a matrix run.

Read by :mod:`jigsawrl.bench.paper` (which runs the groups) and
:mod:`jigsawrl.bench.paper_report` (which renders them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jigsawrl.config import ExperimentConfig, validate_config
from jigsawrl.errors import ConfigError
from jigsawrl.experiments.compare import CompareResult
from jigsawrl.experiments.resolve import check_request_budget
from jigsawrl.scheduler import list_policies

MATRIX_DIR = Path("configs/paper")
REPORT_FILE = "BENCHMARKS-paper.md"
SECTIONS = ("sync", "hetero", "async", "scaling", "ablation")
# Sections whose pipelines are synchronous: the paper's "vs Verl on synchronous RL" matrix.
SYNC_SECTIONS = ("sync", "hetero", "scaling")
# --quick shrinks each pipeline to at most this (steps, prompts per step, max response tokens).
QUICK_STEPS, QUICK_BATCH, QUICK_MAX_RESPONSE = 3, 16, 4096
DEFAULT_SEEDS, QUICK_SEEDS = 3, 1


class _Variant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    policy: str
    params: dict[str, Any] = Field(default_factory=dict)


class _BenchBlock(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    section: Literal["sync", "hetero", "async", "scaling", "ablation"]
    title: str = ""
    quick: bool = False
    policies: list[str] = Field(min_length=1)
    variants: dict[str, _Variant] = Field(default_factory=dict)
    lead: str = "jigsaw"
    baseline: str = "verl"


@dataclass(frozen=True)
class BenchGroup:
    """One cell of the matrix: a config and the policies (labels) compared on it."""

    name: str
    path: Path
    section: str
    title: str
    quick: bool
    config: ExperimentConfig
    policies: tuple[str, ...]
    variants: dict[str, tuple[str, dict[str, Any]]]
    lead: str
    baseline: str

    def policy_of(self, label: str) -> tuple[str, dict[str, Any]]:
        """The registered policy name and params a label stands for."""
        return self.variants.get(label, (label, {}))


def load_group(path: Path) -> BenchGroup:
    """Read one matrix file (experiment config + ``bench:`` block).

    Raises:
        ConfigError: unreadable YAML, a missing or malformed ``bench:`` block, or an invalid
            experiment config (each names the file).
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read matrix file: {exc}", where=str(path)) from None
    if not isinstance(raw, dict) or "bench" not in raw:
        raise ConfigError("a matrix file needs a 'bench:' block", where=str(path),
                          fix="add bench: {section: sync, policies: [verl, jigsaw]}")
    try:
        block = _BenchBlock.model_validate(raw.pop("bench"))
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"bad bench block: {msgs}", where=str(path)) from None
    cfg = validate_config(raw, source=str(path))
    check_request_budget(cfg)  # an over-budget matrix file fails at load, not at its turn
    name = cfg.name or path.stem
    return BenchGroup(
        name=name, path=path, section=block.section, title=block.title or name,
        quick=block.quick, config=cfg.model_copy(update={"name": name}),
        policies=tuple(block.policies),
        variants={k: (v.policy, dict(v.params)) for k, v in block.variants.items()},
        lead=block.lead, baseline=block.baseline)


def load_matrix(folder: Path = MATRIX_DIR, *, quick: bool = False,
                only: list[str] | None = None) -> list[BenchGroup]:
    """The groups of ``folder/*.yaml`` in section order, then by name.

    ``only`` (group names) wins over ``quick``; else ``quick`` keeps the groups marked quick.

    Raises:
        ConfigError: no matrix files, a bad file, or a name in ``only`` that is not a group.
    """
    files = sorted(Path(folder).glob("*.yaml"))
    if not files:
        raise ConfigError("no matrix files (*.yaml)", where=str(folder),
                          fix="run from the repository root or pass --matrix")
    groups = [load_group(f) for f in files]
    if only:
        unknown = sorted(set(only) - {g.name for g in groups})
        if unknown:
            raise ConfigError(f"unknown group(s): {', '.join(unknown)}", where="--only",
                              fix=f"use names from: {', '.join(g.name for g in groups)}")
        groups = [g for g in groups if g.name in only]
    elif quick:
        groups = [g for g in groups if g.quick]
    return sorted(groups, key=lambda g: (SECTIONS.index(g.section), g.name))


def quick_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with every pipeline shrunk to the quick sizes (``QUICK_*``)."""
    pipes = [p.model_copy(update={
        "steps": min(p.steps, QUICK_STEPS), "batch_size": min(p.batch_size, QUICK_BATCH),
        "max_response_tokens": min(p.max_response_tokens, QUICK_MAX_RESPONSE)})
        for p in cfg.pipelines]
    return cfg.model_copy(update={"pipelines": pipes})


@dataclass
class GroupResult:
    """What one group produced (``result`` is None when no policy could run)."""

    group: BenchGroup
    config: ExperimentConfig
    result: CompareResult | None
    skipped: dict[str, str]
    wall_s: float
    out_dir: Path | None = None
    # assumption changed -> baseline -> lead ÷ baseline (:mod:`jigsawrl.bench.paper_sensitivity`)
    sensitivity: dict[str, dict[str, float]] = field(default_factory=dict)

    def lead_ratios(self) -> dict[str, float]:
        """Throughput of the lead ÷ each other policy that ran (means over seeds)."""
        if self.result is None or self.group.lead not in self.result.runs:
            return {}
        ratios = self.result.ratios()[self.group.lead]
        return {p: r for p, r in ratios.items() if p != self.group.lead}


@dataclass
class PaperRun:
    """The whole matrix run: its groups and what is needed to reproduce it."""

    command: str
    quick: bool
    seeds: int
    machine: dict[str, Any]
    started_utc: str
    groups: list[GroupResult] = field(default_factory=list)
    wall_s: float = 0.0
    registered: list[str] = field(default_factory=lambda: sorted(list_policies()))


