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

Each group is one :func:`~jigsawrl.experiments.compare.compare_policies` call: every policy on the same
sampled workloads (seeds ``cfg.seed ..``), sharing one solo-latency reference per seed. A policy
that is not registered yet (the lead and the other helpers add ``jigsaw``, ``greedy``,
``rollmux``, ``muxserve``, ``streamrl``, ``areal`` over time), or that rejects its params, is
skipped with a logged warning; one that does not fit in memory on a group, or whose run breaks an
invariant of the pool (a policy bug), is skipped likewise and its reason shown in the report. Results: ``DIR/<group>/compare.json`` and ``compare.png`` per group, and
``DIR/BENCHMARKS-paper.md`` (see :mod:`jigsawrl.bench.paper_report`).

``--quick`` keeps only the groups marked ``quick: true`` and shrinks them (``QUICK_*`` below) so
that the whole run takes well under a minute on a 2-core machine; its numbers show that the
harness works, not what the paper measures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from jigsawrl.bench.paper_matrix import (
    DEFAULT_SEEDS,
    MATRIX_DIR,
    QUICK_SEEDS,
    REPORT_FILE,
    BenchGroup,
    GroupResult,
    PaperRun,
    load_matrix,
    quick_config,
)
from jigsawrl.bench.paper_report import render_markdown
from jigsawrl.bench.paper_sensitivity import run_sensitivity
from jigsawrl.config import dump_config
from jigsawrl.errors import ConfigError
from jigsawrl.experiments.compare import compare_policies, write_compare
from jigsawrl.experiments.machine import machine_info
from jigsawrl.scheduler import get_policy, list_policies

log = logging.getLogger(__name__)

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
    try:
        result = compare_policies(cfg, labels, seeds=seeds, on_run=on_run, baseline=base,
                                  keep_events=timelines, skip_failed=True,
                                  variants={k: group.policy_of(k) for k in labels})
    except ConfigError as exc:  # no policy could run: the group is skipped, the matrix goes on
        log.warning("%s: no policy can run; group skipped", group.name)
        return GroupResult(group, cfg, None, {**skipped, "all": str(exc)}, 0.0)
    skipped.update(result.skipped)
    folder = None
    if out_dir is not None:
        folder = Path(out_dir) / group.name
        write_compare(folder, result, config_yaml=dump_config(cfg), title=group.title,
                      highlight=group.lead, plots=plots)
    return GroupResult(group, cfg, result, skipped, time.perf_counter() - t0, folder)


def run_paper(matrix: Path = MATRIX_DIR, *, quick: bool = False, seeds: int | None = None,
              out_dir: Path | None = None, command: str = "", only: list[str] | None = None,
              timelines: bool = False, on_group: Callable[[GroupResult], None] | None = None,
              on_run: Callable[[], None] | None = None, sensitivity: bool = True) -> PaperRun:
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
        sensitivity: also re-run each group's lead and headline baselines under costly
            co-location and with offload on (:mod:`jigsawrl.bench.paper_sensitivity`).

    Raises:
        ConfigError: a bad matrix file or group name.
    """
    groups = load_matrix(matrix, quick=quick, only=only)
    n_seeds = seeds or (QUICK_SEEDS if quick else DEFAULT_SEEDS)
    run = PaperRun(command, quick, n_seeds, machine_info(),
                   time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    t0 = time.perf_counter()
    for g in groups:
        log.info("group %s (%s)", g.name, g.section)
        res = run_group(g, seeds=n_seeds, quick=quick, out_dir=out_dir, timelines=timelines,
                        on_run=on_run)
        if sensitivity:
            res.sensitivity = run_sensitivity(res, on_run=on_run)
        run.groups.append(res)
        run.wall_s = time.perf_counter() - t0
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / REPORT_FILE).write_text(render_markdown(run))
        if on_group is not None:
            on_group(res)
    return run
