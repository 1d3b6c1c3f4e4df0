"""The ``jigsawrl`` command line: simulate, compare, list, report, bench (and run, with the engine).

Only this module (and ``engine/cli.py``) prints. Every user error — bad config, unknown preset,
missing file — is one message on stderr and exit code 2, never a traceback.

Examples::

    jigsawrl simulate configs/two-gsm8k.yaml
    jigsawrl simulate configs/two-gsm8k.yaml --set pipelines.0.batch_size=128 --out runs/big
    jigsawrl compare configs/two-gsm8k.yaml --policies verl-split,verl-serial --seeds 2
    jigsawrl list models
    jigsawrl report runs/two-gsm8k
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from jigsawrl.cli.common import SetOpt, err, fail, out, progress_bar, user_errors

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Multiplex LLM RL post-training pipelines on one accelerator pool.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print measured ratios.")
app.add_typer(bench_app, name="bench")

@app.callback()
def _main(ctx: typer.Context,
          verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logs")] = False,
          max_requests: Annotated[int | None, typer.Option(
              "--max-requests", min=1, envvar="JIGSAWRL_MAX_REQUESTS", show_default=False,
              help="most requests a config may sample (Σ batch_size × group_size × steps over "
                   "its pipelines; default 2,000,000), checked before anything is sampled")
          ] = None) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if max_requests is not None:  # for this command only (restored when it ends)
        from jigsawrl.experiments.resolve import request_budget

        ctx.with_resource(request_budget(max_requests))


# ---------------------------------------------------------------------------- simulate
@app.command()
@user_errors
def simulate(
    config: Annotated[Path, typer.Argument(help="experiment YAML")],
    set_: SetOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="run folder")] = None,
    policy: Annotated[str | None, typer.Option(help="override scheduler.name")] = None,
    seed: Annotated[int | None, typer.Option(help="override seed")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print summary.json")] = False,
    solo: Annotated[bool, typer.Option(help="also run each pipeline alone (latency ref)")] = True,
    timeline: Annotated[bool, typer.Option(help="write timeline.png")] = True,
) -> None:
    """Simulate a config; write runs/<name>/ and print the summary."""
    from jigsawrl.config import dump_config, load_config
    from jigsawrl.experiments.simulated import simulate as run_sim
    from jigsawrl.metrics.report import summary_table
    from jigsawrl.metrics.rundir import write_run

    cfg = load_config(config, set_)
    name = cfg.name or config.stem
    if cfg.name is None:
        cfg = cfg.model_copy(update={"name": name})
    total = sum(p.steps for p in cfg.pipelines)
    with progress_bar() as prog:
        task = prog.add_task(f"simulating {name}", total=total)
        t0 = time.perf_counter()
        run = run_sim(cfg, policy=policy, seed=seed, solo=solo,
                      progress=lambda done, _n: prog.update(task, completed=min(done, total)))
        wall = time.perf_counter() - t0
    run.summary["simulation_wall_s"] = wall
    folder = out_dir or Path("runs") / name
    write_run(folder, events=run.events, summary=run.summary, info=run.info,
              config_yaml=dump_config(cfg), timeline=timeline)
    if as_json:
        out.print_json(json.dumps(run.summary))
        return
    out.print(summary_table(run.summary))
    variant = f" (best placement: {run.variant})" if run.variant else ""
    out.print(f"policy [bold]{run.policy}[/]{variant}; simulated in {wall:.1f} s; "
              f"results in [bold]{folder}[/]")
    from jigsawrl.cli.real import plan_lines

    for line in plan_lines(run.summary):
        out.print(line, highlight=False)


# ---------------------------------------------------------------------------- compare
@app.command()
@user_errors
def compare(
    config: Annotated[Path, typer.Argument(help="experiment YAML")],
    policies: Annotated[str, typer.Option(help="comma-separated scheduler names")] = (
        "verl-split,verl-serial"),
    seeds: Annotated[int, typer.Option(min=1, help="seeds per policy")] = 1,
    set_: SetOpt = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="write compare.json, compare.png and per-policy timelines here")] = None,
    baseline: Annotated[str | None, typer.Option(help="policy the ratios are taken to")] = None,
) -> None:
    """Run several policies on one config, side by side, and print one table.

    A policy that cannot run the workload is listed as skipped, with its reason (also in
    compare.json under "skipped"); the others are compared. Exit 2 only if none can run.
    """
    from jigsawrl.config import load_config
    from jigsawrl.experiments.compare import compare_policies
    from jigsawrl.metrics.report import compare_table

    cfg = load_config(config, set_)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    with progress_bar() as prog:
        task = prog.add_task("comparing", total=len(names) * seeds)
        result = compare_policies(cfg, names, seeds=seeds, on_run=lambda: prog.advance(task),
                                  baseline=baseline, keep_events=out_dir is not None)
    out.print(compare_table(result.mean_summaries, baseline=result.baseline,
                            skipped=result.skipped), highlight=False)
    if result.requested_baseline:
        out.print(f"[yellow]baseline {result.requested_baseline} could not run[/]; ratios are "
                  f"to {result.baseline}", highlight=False)
    for note in result.notes:
        out.print(f"[yellow]note[/]: {note.splitlines()[0]}", highlight=False)
    if out_dir is not None:  # compare.json, compare.png, <policy>/ run folders with timelines
        from jigsawrl.config import dump_config
        from jigsawrl.experiments.compare import write_compare

        write_compare(out_dir, result, config_yaml=dump_config(cfg), title=cfg.name or config.stem)
        out.print(f"wrote [bold]{out_dir}[/]: compare.json, compare.png, "
                  f"{', '.join(p + '/' for p in result.policies)} (first-seed run folders)")


# ---------------------------------------------------------------------------- list / report
@app.command("list")
@user_errors
def list_(what: Annotated[str, typer.Argument(help="accelerators|models|tasks|schedulers")]
          ) -> None:
    """List presets and policies."""
    from jigsawrl.cli.catalog import catalog_table

    out.print(catalog_table(what))


@app.command()
@user_errors
def report(run_dir: Annotated[Path, typer.Argument(help="a run folder (runs/<name>)")]) -> None:
    """Print the summary of a finished run."""
    from jigsawrl.metrics.report import summary_table
    from jigsawrl.metrics.rundir import load_run

    summary, _events = load_run(run_dir)
    out.print(summary_table(summary))


# ---------------------------------------------------------------------------- bench
@bench_app.command("sim-speed")
@user_errors
def bench_sim_speed(
    config: Annotated[Path, typer.Argument()] = Path("configs/scale-64.yaml"),
    repeats: Annotated[int, typer.Option(min=1)] = 3,
    policy: Annotated[str | None, typer.Option(help="scheduler name (default: the config's)")
                      ] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="steps of every pipeline")] = None,
    param: Annotated[list[str] | None, typer.Option(
        help="scheduler param KEY=VALUE (YAML value; repeatable), e.g. fallback=false")] = None,
    scaling: Annotated[bool, typer.Option(
        help="time --policy over pool sizes 16..512 (bench decide's mixed configs, 32 GPUs "
             "per pipeline, --steps each: 4 by default) instead of CONFIG")] = False,
) -> None:
    """Time the simulator itself (wall seconds per run; no solo references, no files)."""
    from jigsawrl.bench.speed import parse_params, sim_scaling, sim_speed

    params = parse_params(param or [])
    cols = ("policy", "devices", "pipelines", "pipeline-steps", "events", "decisions",
            "best wall s", "median wall s")
    if scaling:
        rows = sim_scaling(policy or "jigsaw", steps=steps or 4, repeats=repeats,
                           params=params or None)
        table = Table(title="simulator speed over pool sizes")
        cols = (*cols, "ms per device-step")
    else:
        rows = [sim_speed(config, repeats=repeats, policy=policy, steps=steps,
                          params=params or None)]
        table = Table(title=f"simulator speed: {config}")
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for res in rows:
        cells = [res["policy"], str(res["devices"]), str(res["pipelines"]), str(res["steps"]),
                 str(res["events"]), str(res["decisions"]), f"{res['best_s']:.2f}",
                 f"{res['median_s']:.2f}"]
        if scaling:
            cells.append(f"{res['ms_per_device_step']:.2f}")
        table.add_row(*cells)
    out.print(table)


# ---- bench fidelity (the cost model against published GPU runs) ---- begin
@bench_app.command("fidelity")
@user_errors
def bench_fidelity(
    out_dir: Annotated[Path | None, typer.Option("--out", help="write fidelity.json here")] = None,
    anchors: Annotated[Path, typer.Option(help="folder of anchor files")] = Path("anchors"),
    steps: Annotated[int | None, typer.Option(min=1, help="steps per anchor (default: each "
                                                          "anchor's own)")] = None,
) -> None:
    """Each published run of anchors/ predicted by constants fitted without it (leave-one-out)."""
    import math
    import shlex

    from jigsawrl.bench.fidelity import git_commit, load_anchors, run_fidelity, write_fidelity
    from jigsawrl.experiments.machine import machine_info

    command = shlex.join(["jigsawrl", "bench", "fidelity", "--anchors", str(anchors),
                          *(["--steps", str(steps)] if steps else []),
                          *(["--out", str(out_dir)] if out_dir else [])])
    t0 = time.perf_counter()
    res = run_fidelity(load_anchors(anchors), steps=steps)
    machine = machine_info()
    res.info = {"command": command, "commit": git_commit(), "machine": machine,
                "wall_s": round(time.perf_counter() - t0, 1)}
    table = Table(title="simulated vs published (leave-one-out: each anchor predicted by "
                        "constants fitted without it)")
    for col in ("anchor", "stage", "published s", "predicted s", "ratio", "|ln ratio|"):
        table.add_column(col, justify="left" if col in ("anchor", "stage") else "right")
    for a in res.anchors:
        for stage, v in a["stages"].items():
            err = abs(v["log_ratio"])
            mark = "[red]" if err > math.log(2) else "[yellow]" if err > math.log(1.2) else ""
            table.add_row(a["name"], stage, f"{v['published']:.4g}", f"{v['predicted']:.4g}",
                          f"{math.exp(v['log_ratio']):.2f}", f"{mark}{err:.3f}")
    table.caption = (f"median |ln ratio| {res.median_abs_log_ratio:.3f} (target <= "
                     f"{math.log(1.2):.3f}), max {res.max_abs_log_ratio:.3f} (target <= "
                     f"{math.log(2):.3f}); {machine['cpu']}, {res.info['wall_s']} s")
    out.print(table)
    inside = res.as_json()["in_sample"]
    if inside:
        out.print(f"the defaults (fitted on all anchors) on the same anchors: median |ln ratio| "
                  f"{inside['median_abs_log_ratio']:.3f}, max {inside['max_abs_log_ratio']:.3f}",
                  highlight=False)
    consts = Table(title="fitted on all anchors (= CostParams defaults: "
                         f"{'yes' if res.defaults_match() else 'NO'})")
    for col in ("constant", "value", "default", "from anchors"):
        consts.add_column(col)
    for key, f in res.fitted.items():
        consts.add_row(key, f"{f.value:.4g}", f"{res.defaults[key]:.4g}", ", ".join(f.sources))
    out.print(consts)
    for miss in res.misses():
        out.print(f"[yellow]missed[/]: {miss}", highlight=False)
    if out_dir is not None:
        out.print(f"wrote [bold]{write_fidelity(res, out_dir)}[/]")
# ---- bench fidelity ---- end


# ---- bench paper / bench decide (benchmark harness of the paper's evaluation) ---- begin
@bench_app.command("paper")
@user_errors
def bench_paper(
    quick: Annotated[bool, typer.Option(help="reduced matrix (quick groups, shrunk)")] = False,
    seeds: Annotated[int | None, typer.Option(min=1, help="seeds per policy (3; quick: 1)")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="results folder")] = Path("runs/paper"),
    matrix: Annotated[Path, typer.Option(help="folder of matrix files")] = Path("configs/paper"),
    only: Annotated[str | None, typer.Option(help="comma-separated group names")] = None,
    timelines: Annotated[bool, typer.Option(help="per-policy run folders + timelines")] = False,
    sensitivity: Annotated[bool, typer.Option(
        help="re-run each headline ratio with costly co-location (s_sat 0.8) and offload on"),
    ] = True,
) -> None:
    """Run the paper's evaluation matrix side by side; write BENCHMARKS-paper.md."""
    import shlex

    from jigsawrl.bench.paper import run_paper
    from jigsawrl.bench.paper_matrix import REPORT_FILE, GroupResult
    from jigsawrl.bench.paper_report import summary_claims
    from jigsawrl.metrics.report import compare_table

    def show(g: GroupResult) -> None:
        if g.result is not None:
            table = compare_table(g.result.mean_summaries, baseline=g.result.baseline)
            table.title = f"{g.group.name} — {g.group.title} ({g.wall_s:.1f} s)"
            out.print(table)
        for label, why in g.skipped.items():
            out.print(f"  [yellow]skipped {label}[/]: {why.splitlines()[0]}", highlight=False)

    names = [x.strip() for x in only.split(",") if x.strip()] if only else None
    # The command as it reproduces this run (rebuilt from the options, not from sys.argv).
    command = shlex.join(["jigsawrl", "bench", "paper", *(["--quick"] if quick else []),
                          *(["--seeds", str(seeds)] if seeds else []), "--out", str(out_dir),
                          "--matrix", str(matrix), *(["--only", only] if only else []),
                          *(["--timelines"] if timelines else []),
                          *([] if sensitivity else ["--no-sensitivity"])])
    t0 = time.perf_counter()
    run = run_paper(matrix, quick=quick, seeds=seeds, out_dir=out_dir, only=names,
                    command=command, timelines=timelines, on_group=show,
                    sensitivity=sensitivity)
    table = Table(title="summary against the paper")
    for col in ("claim", "paper", "here", "groups"):
        table.add_column(col, justify="left" if col == "claim" else "right")
    for c in summary_claims(run):
        table.add_row(c.what, c.paper, c.ours, str(c.groups))
    out.print(table)
    out.print(f"{len(run.groups)} groups in {time.perf_counter() - t0:.1f} s; "
              f"report: [bold]{out_dir / REPORT_FILE}[/]")


@bench_app.command("decide")
@user_errors
def bench_decide(
    policy: Annotated[str, typer.Option(help="scheduler name")] = "jigsaw",
    devices: Annotated[int, typer.Option(min=1, help="H100s (8 per node)")] = 64,
    pipelines: Annotated[int, typer.Option(min=1, help="Qwen3-4B pipelines, mixed tasks")] = 8,
    steps: Annotated[int, typer.Option(min=1, help="steps per pipeline")] = 3,
    param: Annotated[list[str] | None, typer.Option(
        help="scheduler param KEY=VALUE (YAML value; repeatable), e.g. fallback=false")] = None,
) -> None:
    """Distribution of a policy's decision times (target: p99 <= 10 ms at 128 GPUs x 16)."""
    from jigsawrl.bench.decide import bench_decide as measure
    from jigsawrl.bench.speed import parse_params
    from jigsawrl.experiments.machine import machine_info

    params = parse_params(param or [])
    s = measure(policy, devices, pipelines, steps=steps, params=params or None)
    m = machine_info()
    table = Table(title=f"decision times of {policy}: {devices}x H100, {pipelines} pipelines, "
                  f"{steps} steps", caption=f"{m['cpu']}, {m['cores']} cores; simulated in "
                  f"{s.wall_s:.1f} s")
    for col in ("decisions", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms"):
        table.add_column(col, justify="right")
    cells = [s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms, s.mean_ms]
    table.add_row(str(s.count), *("–" if v is None else f"{v:.2f}" for v in cells))
    out.print(table)
    if s.background_count:
        ms = ("–" if v is None else f"{v:.1f}" for v in (
            s.background_p50_ms, s.background_p99_ms, s.background_max_ms))
        out.print("work left off the decision path (replans, replays; run by the driver after "
                  "a decision, an event meanwhile waits): {} pieces, p50 {} ms, p99 {} ms, "
                  "max {} ms".format(s.background_count, *ms))
# ---- bench paper / bench decide ---- end


# ---- profile (measure this machine for the cost model) ---- begin
@app.command("profile")
@user_errors
def profile(
    model: Annotated[str, typer.Option(help="engine model preset")] = "qwen2-1m",
    threads: Annotated[str, typer.Option(
        help="torch thread counts (compute shares); the largest is a device's full share and "
        "must be the runs' threads per device (1 by default: one core per Ray CPU worker)")] = "1",
    out_path: Annotated[Path, typer.Option("--out", help="profile YAML")] = Path(
        "profiles/cpu.yaml"),
    quick: Annotated[bool, typer.Option(help="smaller grid (~10 s per thread count)")] = False,
    runtime: Annotated[bool, typer.Option(
        help="also measure reward scoring and Ray call / weight-transfer costs (~10 s)")] = True,
) -> None:
    """Measure this CPU's sub-stage costs with the real engine; write a cost-model profile."""
    import statistics

    try:
        import torch  # noqa: F401  (the measuring half needs the engine extra)

        from jigsawrl.costmodel.fit import ProfileSettings, parse_threads, write_profile
        from jigsawrl.experiments.profiling import run_profile
    except ImportError as exc:
        raise fail(f"profiling needs the engine extra ({exc}); "
                   "install it with: pip install -e '.[engine]'") from None
    counts = parse_threads(threads)
    settings = (ProfileSettings.quick(model, counts) if quick
                else ProfileSettings(model=model, threads=counts))
    settings = dataclasses.replace(settings, runtime=runtime)
    t0 = time.perf_counter()
    doc = run_profile(settings, on_threads=lambda n: err.print(f"measuring at {n} thread(s)"))
    write_profile(doc, out_path)
    fitted = doc["fitted"]
    table = Table(title=f"{doc['source']} ({model}, full share = "
                  f"{fitted['full_share_threads']} threads)")
    table.add_column("fitted value")
    table.add_column("", justify="right")
    for key, value in {**fitted["accelerator"], **fitted["params"]}.items():
        table.add_row(key, str(value).lower() if isinstance(value, bool) else f"{value:.4g}")
    errors = [abs(r["rel_error"]) for r in fitted["decode_errors"]]
    table.caption = (f"decode-iteration prediction error on {len(errors)} measured points: "
                     f"median {statistics.median(errors):.0%}, max {max(errors):.0%}")
    out.print(table)
    out.print(f"profiled in {time.perf_counter() - t0:.1f} s; wrote [bold]{out_path}[/]")
# ---- profile ---- end


def _register_engine() -> None:
    """Add ``run`` and ``bench trl`` when the engine extra (torch) is importable."""
    try:
        from jigsawrl.cli.real import register
    except ImportError as exc:  # torch not installed: say how to get it
        missing = str(exc)

        @app.command()
        def run(config: Path) -> None:  # noqa: ARG001
            """Run real pipelines on this CPU (needs the engine extra)."""
            raise fail(f"the real engine needs torch ({missing}); "
                       "install it with: pip install -e '.[engine]'")

        return
    register(app, bench_app)


_register_engine()


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
