"""The paper's evaluation matrix, run side by side in simulation (``jigsawrl bench paper``).

Why: the JigsawRL paper (arXiv 2604.23838, ``reference/jigsawrl.md``) reports throughput ratios
against verl, RollMux, StreamRL and AReaL over a matrix of pipeline pairs, models and cluster
sizes. This module runs that matrix with our policies and writes the numbers *with* the command,
the machine and the seeds that produced them (DESIGN.md §6), so that our figures can be set
beside the paper's.

The matrix is data: one YAML per group under ``configs/paper/``, an ordinary experiment config
plus a ``bench:`` block that this module removes before validating the rest::

    bench:
      section: sync            # sync | hetero | async | scaling | ablation
      title: "Qwen3-4B GSM8K + MATH, 8x H100"
      quick: true              # part of the reduced matrix of --quick
      policies: [verl, rollmux, jigsaw, jigsaw-depth0]
      variants:                # labels that are a registered policy with params
        jigsaw-depth0: {policy: jigsaw, params: {depth: 0}}
      lead: jigsaw             # the policy whose ratios to the others are reported
      baseline: verl           # the ×base column

Each group is one :func:`~jigsawrl.compare.compare_policies` call: every policy on the same
sampled workloads (seeds ``cfg.seed ..``), sharing one solo-latency reference per seed. A policy
that is not registered yet (the lead and the other helpers add ``jigsaw``, ``greedy``,
``rollmux``, ``muxserve``, ``streamrl``, ``areal`` over time), or that rejects its params, is
skipped with a logged warning; one that does not fit in memory on a group, or whose run breaks an
invariant of the pool (a policy bug), is skipped likewise and its reason shown in the report. Results: ``DIR/<group>/compare.json`` and ``compare.png`` per group, and
``DIR/BENCHMARKS-paper.md`` (see :mod:`jigsawrl.benchpaper_md`).

``--quick`` keeps only the groups marked ``quick: true`` and shrinks them (``QUICK_*`` below) so
that the whole run takes well under a minute on a 2-core machine; its numbers show that the
harness works, not what the paper measures.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jigsawrl.compare import CompareResult, compare_policies, write_compare
from jigsawrl.config import ExperimentConfig, dump_config, validate_config
from jigsawrl.errors import ConfigError
from jigsawrl.scheduler import get_policy, list_policies

log = logging.getLogger(__name__)

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


def runnable(group: BenchGroup) -> tuple[list[str], dict[str, str]]:
    """Split a group's labels into those that can run now and those skipped (with why)."""
    known = set(list_policies())
    ok: list[str] = []
    skipped: dict[str, str] = {}
    for label in group.policies:
        name, params = group.policy_of(label)
        if name not in known:
            skipped[label] = f"policy {name!r} is not registered (yet)"
        else:
            try:
                get_policy(name, params)
            except ConfigError as exc:
                skipped[label] = f"rejected its params {params}: {exc}"
        if label in skipped:
            log.warning("%s: skipping %s: %s", group.name, label, skipped[label])
        else:
            ok.append(label)
    return ok, skipped


@dataclass
class GroupResult:
    """What one group produced (``result`` is None when no policy could run)."""

    group: BenchGroup
    config: ExperimentConfig
    result: CompareResult | None
    skipped: dict[str, str]
    wall_s: float
    out_dir: Path | None = None

    def lead_ratios(self) -> dict[str, float]:
        """Throughput of the lead ÷ each other policy that ran (means over seeds)."""
        if self.result is None or self.group.lead not in self.result.runs:
            return {}
        ratios = self.result.ratios()[self.group.lead]
        return {p: r for p, r in ratios.items() if p != self.group.lead}


def run_group(group: BenchGroup, *, seeds: int, quick: bool = False, out_dir: Path | None = None,
              plots: bool = True, timelines: bool = False,
              on_run: Callable[[], None] | None = None) -> GroupResult:
    """Compare the group's runnable policies side by side; write its folder under ``out_dir``."""
    cfg = quick_config(group.config) if quick else group.config
    labels, skipped = runnable(group)
    t0 = time.perf_counter()
    if not labels:
        log.warning("%s: no policy can run; group skipped", group.name)
        return GroupResult(group, cfg, None, skipped, 0.0)
    base = group.baseline if group.baseline in labels else labels[0]
    result = compare_policies(cfg, labels, seeds=seeds, on_run=on_run, baseline=base,
                              keep_events=timelines, skip_failed=True,
                              variants={k: group.policy_of(k) for k in labels})
    skipped.update(result.skipped)
    folder = None
    if out_dir is not None:
        folder = Path(out_dir) / group.name
        write_compare(folder, result, config_yaml=dump_config(cfg), title=group.title,
                      highlight=group.lead, plots=plots)
    return GroupResult(group, cfg, result, skipped, time.perf_counter() - t0, folder)


def machine_info() -> dict[str, Any]:
    """Platform, CPU model and core count of this machine (for the report header)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"platform": platform.platform(), "cpu": cpu, "cores": cores,
            "python": platform.python_version()}


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


def run_paper(matrix: Path = MATRIX_DIR, *, quick: bool = False, seeds: int | None = None,
              out_dir: Path | None = None, command: str = "", only: list[str] | None = None,
              timelines: bool = False, on_group: Callable[[GroupResult], None] | None = None,
              on_run: Callable[[], None] | None = None) -> PaperRun:
    """Run the matrix group by group; rewrite ``out_dir/BENCHMARKS-paper.md`` after each group.

    Args:
        matrix: the folder of matrix files.
        quick: the reduced matrix (quick groups, shrunk; :func:`quick_config`).
        seeds: seeds per policy (default 3, or 1 with ``quick``).
        out_dir: where results go (nothing is written when None).
        command: the command line that produced the run (written at the top of the report).
        only: run just these groups (by name).
        timelines: also write each policy's first-seed run folder with a timeline.
        on_group: called with each finished group (the CLI prints its table).
        on_run: called after each simulated policy run (progress).

    Raises:
        ConfigError: a bad matrix file or group name.
    """
    from jigsawrl.benchpaper_md import render_markdown

    groups = load_matrix(matrix, quick=quick, only=only)
    n_seeds = seeds or (QUICK_SEEDS if quick else DEFAULT_SEEDS)
    run = PaperRun(command, quick, n_seeds, machine_info(),
                   time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    t0 = time.perf_counter()
    for g in groups:
        log.info("group %s (%s)", g.name, g.section)
        res = run_group(g, seeds=n_seeds, quick=quick, out_dir=out_dir, timelines=timelines,
                        on_run=on_run)
        run.groups.append(res)
        run.wall_s = time.perf_counter() - t0
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / REPORT_FILE).write_text(render_markdown(run))
        if on_group is not None:
            on_group(res)
    return run
