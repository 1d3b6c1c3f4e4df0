"""CLI commands of the real engine: ``jigsawrl run CONFIG [--ray]``, ``jigsawrl bench trl|real``.

What: :func:`register` adds the commands to the main Typer app (the lead wires it in
``jigsawrl/cli/main.py``), so the main CLI imports torch only when one of these commands runs. This is
the only engine module that prints: a rich progress bar per pipeline while it runs, a table at
the end. User errors (bad config, unreadable checkpoint) become one message on stderr and exit
code 2, never a traceback.

Example::

    jigsawrl run configs/real/arithmetic.yaml --out runs/arith --set pipelines.0.steps=50
    jigsawrl bench trl --task arithmetic --steps 10
    jigsawrl run configs/real/demo.yaml --ray --out runs/demo   # progress, measured vs predicted
    jigsawrl bench real --quick --out /tmp/benchreal           # policies on real pipelines
    jigsawrl bench real --repeats 3 --out runs/benchreal       # medians of 3, interleaved

``run --ray`` ends with the simulator's prediction of the run beside the measurement
(:mod:`jigsawrl.experiments.calibrate`, with ``--profile`` or ``profiles/cpu.yaml`` when present) and writes
``reward_curves.png`` next to the run's ``timeline.png``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jigsawrl.cli.common import err, user_errors
from jigsawrl.errors import JigsawError


@user_errors
def ray_run_command(config: Path, overrides: list[str], out: Path | None,
                    address: str | None, resume: bool = False,
                    profile: Path | None = None) -> None:
    """``jigsawrl run --ray``: all pipelines together through the Ray executor, with a progress
    bar, then measured beside predicted (calibrate.py), the timeline and the reward curves."""
    from jigsawrl.bench.real import profile_path
    from jigsawrl.config import load_config

    console = Console()
    cfg = load_config(config, overrides)
    # a bad profile (or one of another full share than run_real's one thread per device)
    # fails now, not after Ray started
    found = profile_path(profile, threads_per_device=1)
    profile = Path(found) if found is not None else None
    from jigsawrl.experiments.real import run_real

    total = sum(p.steps for p in cfg.pipelines)
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total} steps"), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task(f"{len(cfg.pipelines)} pipelines on Ray under "
                                f"{cfg.scheduler.name} (start-up, then steps)", total=total)
        summary, events = run_real(
            cfg, address=address, out_dir=out, resume=resume, profile=profile,
            on_progress=lambda done, n: progress.update(bar, completed=done, total=n))
    cal = _predict(cfg, events, summary, profile, out)
    _print_ray_result(console, summary, cal, out)


def _predict(cfg: Any, events: list[Any], summary: dict[str, Any], profile: Path | None,
             out: Path | None) -> Any:
    """The simulator's prediction of the finished run (None, logged, when it cannot be made)."""
    import logging

    from jigsawrl.experiments.calibrate import calibrate

    try:
        cal = calibrate(cfg, events, summary["policy"], profile=profile, measured=summary)
    except JigsawError as exc:
        logging.getLogger(__name__).warning("no prediction: %s", exc)
        return None
    if out is not None:
        (out / "calibration.json").write_text(json.dumps(cal.to_json(), indent=1))
    return cal


def _print_ray_result(console: Console, summary: dict[str, Any], cal: Any,
                      out: Path | None) -> None:
    from jigsawrl.bench.real_report import error_note, plot_reward_curves, run_table, speed_note
    from jigsawrl.metrics.report import summary_table

    console.print(summary_table(summary))
    console.print(run_table(summary, cal))
    source = "" if cal is None else cal.cost_source.split(" (measured")[0]
    console.print(error_note(cal) + (f"; cost model: {source}" if source else ""),
                  highlight=False)
    if (speed := speed_note(cal)) is not None:
        console.print(speed, highlight=False)
    for line in cal.notes if cal is not None else []:
        console.print(f"- {line}", highlight=False)
    for line in plan_lines(summary):
        console.print(line, highlight=False)
    if out is None:
        return
    curves = plot_reward_curves(out / "reward_curves.png", summary)
    console.print(f"timeline: [bold]{out / 'timeline.png'}[/]")
    console.print("reward curves: " + (f"[bold]{curves}[/]" if curves else
                                        "none (this run_real reports no per-step metrics)"))
    console.print(f"results in [bold]{out}[/] (summary.json, events.jsonl, trace.json"
                  f"{', calibration.json' if cal is not None else ''})")


def plan_lines(summary: dict[str, Any]) -> list[str]:
    """What a run's policy chose at its first decision, from its summary's report: the plan
    (:func:`plan_note`) and what it searched (:func:`searched_note`); none for a policy that
    reports neither."""
    report = summary.get("policy_report") or {}
    lines = [plan_note(report["plan"])] if report.get("plan") else []
    searched = searched_note(report)
    return lines + ([searched] if searched is not None else [])


def searched_note(report: dict[str, Any]) -> str | None:
    """What jigsaw's first decision searched and chose besides the plan: the rollout TPs and
    whether two pipelines' rollout engines share a device (None: it searched neither)."""
    parts = []
    tp = report.get("rollout_tp")
    if tp:
        runs = tp.get("runs")
        chosen = "the config's" if runs == "configured" else ", ".join(
            f"{p} {t}" for p, t in (runs or {}).items())
        parts.append(f"rollout TP {chosen} (searched)")
    co = report.get("colocation")
    if co:
        pred = co.get("predicted_s") or {}
        one, two = pred.get("1"), pred.get("2")
        nums = (f": forecast {two:.0f} s with two, {one:.0f} s with one"
                if isinstance(one, int | float) and isinstance(two, int | float) else "")
        fell_back = (report.get("plan") or {}).get("runs") not in (None, "jigsaw")
        parts.append(f"{co.get('runs')} rollout engine(s) per device{nums}"
                     + (" (for its own plan; the verl placement above runs instead)"
                        if fell_back else ""))
    return "searched: " + "; ".join(parts) if parts else None


def plan_note(plan: dict[str, Any]) -> str:
    """What jigsaw ran and why: its own plan or the verl placement it fell back to.

    The makespans are what the policy predicted at its first decision, from the task prior
    (a task without a preset: a quarter of the response cap a sample), so they are not the
    run's calibrated prediction printed above and can differ from it several-fold: said so."""
    own, verl = plan.get("jigsaw_s"), plan.get("verl_s")
    own_s = f"{own:.0f} s" if isinstance(own, int | float) else "does not fit"
    when = "at the first decision, on the task prior"
    if plan.get("verl") is None:
        return (f"plan: {plan.get('runs')} (predicted makespan {own_s} {when}; fallback off: "
                "the verl placements were not considered)")
    verl_s = f"{verl:.0f} s" if isinstance(verl, int | float) else "–"
    why = ""
    if plan.get("runs") != "jigsaw" and isinstance(own, int | float) and \
            isinstance(verl, int | float) and own < verl:
        from jigsawrl.scheduler.jigsaw.fallback import MARGIN

        why = f"; its own plan runs only if predicted {MARGIN:.0%} sooner"
    return (f"plan: {plan.get('runs')} (predicted makespan {when}: jigsaw's own plan {own_s}, "
            f"best verl placement {plan.get('verl')} {verl_s}{why})")


@user_errors
def run_command(config: Path, overrides: list[str], out: Path | None, resume: bool) -> None:
    """Load the config, run it with a progress bar, print the result table."""
    from jigsawrl.config import load_config
    from jigsawrl.experiments.resolve import check_request_budget
    from jigsawrl.experiments.sequential import run_experiment

    cfg = load_config(config, overrides)
    check_request_budget(cfg)

    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console) as progress:
        bars = {p.name: progress.add_task(p.name, total=p.steps, info="")
                for p in cfg.pipelines}

        def on_step(ev: dict[str, Any]) -> None:
            bar = bars[ev["pipeline"]]
            if ev["event"] == "phase":
                progress.update(bar, info=ev["phase"])
                return
            m = ev["metrics"]
            progress.update(bar, completed=ev["step"],
                            info=f"reward {m['critic/score/mean']:.3f}  "
                                 f"{m['timing_s/step']:.2f} s/step")

        summary = run_experiment(cfg, out, resume=resume, on_step=on_step)
    console.print(_summary_table(summary))
    if out is not None:
        console.print(f"wrote {out / 'summary.json'}, {out / 'reward_curve.png'}, {out / 'tb'}")


def _summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"makespan {summary['makespan_s']:.1f} s, "
                        f"{summary['throughput_tokens_per_s']:.0f} tokens/s")
    for col in ("pipeline", "task", "steps", "s/step", "tokens/s", "reward first→last 5",
                "greedy eval before→after"):
        table.add_column(col)
    for p in summary["pipelines"]:
        curve = p["reward_mean_per_step"]
        k = min(5, len(curve))
        first = sum(curve[:k]) / k if k else float("nan")
        last = sum(curve[-k:]) / k if k else float("nan")
        table.add_row(p["name"], p["task"], str(p["steps"]), f"{p['mean_step_latency_s']:.2f}",
                      f"{p['tokens_per_s']:.0f}", f"{first:.3f} → {last:.3f}",
                      f"{p['eval_reward_before']:.3f} → {p['eval_reward_after']:.3f}")
    return table


@user_errors
def bench_trl_command(spec_kwargs: dict[str, Any], out: Path | None, repeats: int = 1) -> None:
    """Run both sides ``repeats`` times (seeds seed, seed+1, ...) and print them side by side:
    medians and ranges, and where each side's step time goes."""
    from jigsawrl.bench.trl import BenchTrlSpec, run_bench_trl_repeats, trl_available
    from jigsawrl.errors import ConfigError

    if spec_kwargs.get("autocast", "off") not in ("off", "bf16"):
        raise ConfigError(f"--autocast {spec_kwargs['autocast']!r} is not a choice",
                          where="--autocast", fix="use off or bf16")
    ok, why = trl_available()
    console = Console()
    if not ok:
        err.print(f"[yellow]TRL side skipped:[/yellow] {why}", markup=True, highlight=False)
    spec = BenchTrlSpec(**spec_kwargs)

    def on_run(r: int, run: dict[str, Any]) -> None:
        mine, theirs = run["jigsawrl"], run["trl"]
        line = (f"seed {spec.seed + r}: jigsawrl {mine['samples_per_s']:.1f} samples/s, "
                f"reward {mine['reward_mean']:.3f}")
        if "speedup" in run:
            line += (f"; TRL {theirs['samples_per_s']:.1f} samples/s, reward "
                     f"{theirs['reward_mean']:.3f}; {run['speedup']:.2f}x")
        console.print(line, highlight=False, soft_wrap=True)

    with console.status("running jigsawrl, then TRL, per seed ..."):
        result = run_bench_trl_repeats(spec, repeats, on_run=on_run)
    threads = result["runs"][0]["torch_threads"]
    table = Table(title=f"GRPO {spec.model} on {spec.task}: {spec.batch_size} prompts × "
                        f"{spec.group_size}, {spec.steps} steps, {repeats} seed(s), "
                        f"{threads} thread(s) — median \\[min–max]")
    for col in ("system", "samples/s (steps)", "samples/s (wall)", "mean sampled reward"):
        table.add_column(col)

    def cell(d: dict[str, float], fmt: str) -> str:
        return f"{d['median']:{fmt}} [{d['min']:{fmt}}–{d['max']:{fmt}}]"

    for name in ("jigsawrl", "trl"):
        if name not in result:
            why_not = result["runs"][0][name].get("error", "no run")
            table.add_row(name, "-", "-", why_not[:60])
            continue
        r = result[name]
        table.add_row(name, cell(r["samples_per_s"], ".1f"), cell(r["wall_samples_per_s"], ".1f"),
                      cell(r["reward_mean"], ".3f"))
    console.print(table)
    stages = Table(title="seconds per step, mean over steps and seeds")
    stages.add_column("system")
    stages.add_column("stages")
    for name in ("jigsawrl", "trl"):
        per = [run[name]["stage_s_per_step"] for run in result["runs"]
               if "stage_s_per_step" in run[name]]
        if per:
            stages.add_row(name, ", ".join(f"{k} {sum(p[k] for p in per) / len(per):.3f}"
                                           for k in per[0]))
    console.print(stages)
    if "speedup" in result:
        console.print(f"jigsawrl / TRL samples/s: {cell(result['speedup'], '.2f')}x "
                      f"(wall: {cell(result['wall_speedup'], '.2f')}x)", highlight=False)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_trl.json").write_text(json.dumps(result, indent=1))
        console.print(f"wrote {out / 'bench_trl.json'}")


def bench_colocate_command(spec_kwargs: dict[str, Any], out: Path | None) -> None:
    """Two co-located calls on one core: one after the other vs two processes at once."""
    from jigsawrl.bench.colocate import ColocateSpec, run_colocate

    console = Console()
    spec = ColocateSpec(**spec_kwargs)
    with console.status("bench colocate: serial and concurrent runs on one core ..."):
        result = run_colocate(spec)
    table = Table(title=f"two calls on core {spec.core}: A's rollout + B's GRPO step "
                        f"({spec.model}, {spec.batch_size}×{spec.group_size}), "
                        f"{spec.repeats} runs each — median \\[min–max] s")
    for col in ("workload (A)", "one after the other", "two processes at once", "gain"):
        table.add_column(col)
    for name, w in result["workloads"].items():
        cells = [f"{w[k]['median']:.2f} [{w[k]['min']:.2f}–{w[k]['max']:.2f}]"
                 for k in ("serial_s", "concurrent_s")]
        label = (f"tool: calculator, {spec.tool_latency_s:g} s per tool call" if name == "tool"
                 else "compute: countdown")
        table.add_row(label, *cells, f"{w['speedup']:.2f}x")
    console.print(table)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_colocate.json").write_text(json.dumps(result, indent=1))
        console.print(f"wrote {out / 'bench_colocate.json'}")


@user_errors
def bench_real_command(spec_kwargs: dict[str, Any]) -> None:
    """``jigsawrl bench real``: real runs per policy (``--repeats`` each, interleaved),
    printed with the predictions."""
    from jigsawrl.bench.real import BenchRealSpec, run_bench_real
    from jigsawrl.bench.real_report import bench_notes, bench_pipeline_table, bench_table

    console = Console()
    spec = BenchRealSpec(**spec_kwargs)
    n = spec.repeats
    with console.status("bench real: real runs per policy (each starts Ray and its "
                        "pipelines) ...") as status:
        def on_run(label: str, repeat: int, summary: dict[str, Any] | None,
                   why: str | None) -> None:
            tag = f"{label} (repeat {repeat}/{n})" if n > 1 and repeat else label
            if summary is None:
                what = "skipped" if repeat <= 1 else "failed"
                console.print(f"[yellow]{tag} {what}[/yellow]: {(why or '').splitlines()[0]}",
                              highlight=False)
            else:
                console.print(f"{tag}: {summary['throughput_tokens_per_s']:,.0f} tokens/s, "
                              f"makespan {summary['makespan_s']:.1f} s (start-up "
                              f"{summary.get('startup_s') or 0:.0f} s)", highlight=False)
            status.update(f"bench real: {tag} done ...")

        result = run_bench_real(spec, on_run=on_run)
    console.print(bench_table(result))
    console.print(bench_pipeline_table(result))
    for line in bench_notes(result):
        console.print(f"- {line}", highlight=False)
    console.print(f"bench wall time {result.wall_s:.0f} s (Ray start-ups included)")
    if spec.out_dir is not None:
        folders = "a run folder per policy" + (" and repeat" if n > 1 else "")
        console.print(f"wrote [bold]{spec.out_dir / 'compare.json'}[/] and {folders}")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``run`` to ``app`` and ``trl`` and ``real`` to ``bench_app``."""

    @app.command("run")
    def run(config: Annotated[Path, typer.Argument(help="experiment YAML (configs/real/*.yaml)")],
            set_: Annotated[list[str] | None, typer.Option(
                "--set", help="override, e.g. pipelines.0.steps=5")] = None,
            out: Annotated[Path | None, typer.Option("--out", help="results folder")] = None,
            resume: Annotated[bool, typer.Option(
                "--resume", help="continue from the checkpoints under --out")] = False,
            ray: Annotated[bool, typer.Option(
                "--ray", help="run all pipelines together on Ray workers under the config's "
                "scheduler (cluster.accelerator: cpu-worker)")] = False,
            address: Annotated[str | None, typer.Option(
                help="with --ray: a running Ray cluster (default: start a local one)")] = None,
            profile: Annotated[Path | None, typer.Option(
                help="with --ray: machine profile, the scheduler's cost model and the "
                "prediction's (default: profiles/cpu.yaml if present)")] = None,
            ) -> None:
        """Run the pipelines of CONFIG for real: one after another on this CPU, or (``--ray``)
        multiplexed on a pool of Ray workers by the same scheduler as the simulator."""
        if ray:
            ray_run_command(config, list(set_ or []), out, address, resume, profile)
        else:
            run_command(config, list(set_ or []), out, resume)

    @bench_app.command("trl")
    def trl(model: Annotated[str, typer.Option(help="engine model preset")] = "qwen2-1m",
            task: Annotated[str, typer.Option(help="single-turn task")] = "arithmetic",
            batch_size: Annotated[int, typer.Option(min=1)] = 16,
            group_size: Annotated[int, typer.Option(min=2)] = 4,
            steps: Annotated[int, typer.Option(min=1)] = 20,
            temperature: float = 1.0, top_p: float = 1.0, lr: float = 3e-4,
            warmup_steps: Annotated[int, typer.Option(min=0)] = 40, seed: int = 0,
            threads: Annotated[int, typer.Option(min=1)] = 1,
            recompute_old_logprobs: Annotated[bool, typer.Option(
                help="jigsawrl side: separate old-log-prob pass (TRL skips it)")] = False,
            share_prompt: Annotated[bool, typer.Option(
                help="jigsawrl side: forward each group's prompt once (exact)")] = True,
            repeats: Annotated[int, typer.Option(
                min=1, help="runs at seeds seed, seed+1, ...; medians and ranges")] = 3,
            autocast: Annotated[str, typer.Option(
                help="off | bf16: both sides train with bf16 autocast (slow on AVX2-only "
                "CPUs)")] = "off",
            out: Annotated[Path | None, typer.Option(help="write bench_trl.json here")] = None,
            ) -> None:
        """GRPO through TRL's GRPOTrainer and through jigsawrl: samples/s and reward."""
        bench_trl_command(dict(model=model, task=task, batch_size=batch_size,
                               group_size=group_size, steps=steps, temperature=temperature,
                               top_p=top_p, lr=lr, warmup_steps=warmup_steps, seed=seed,
                               threads=threads, recompute_old_logprobs=recompute_old_logprobs,
                               share_prompt=share_prompt, autocast=autocast), out, repeats)

    @bench_app.command("colocate")
    def colocate(model: Annotated[str, typer.Option(help="engine model preset")] = "qwen2-1m",
                 repeats: Annotated[int, typer.Option(min=1)] = 3,
                 tool_latency_s: Annotated[float, typer.Option(min=0.0)] = 0.2,
                 core: Annotated[int, typer.Option(min=0)] = 0,
                 out: Annotated[Path | None, typer.Option(
                     help="write bench_colocate.json here")] = None) -> None:
        """Two co-located calls on one core: serial (today's device worker) vs two processes."""
        bench_colocate_command(dict(model=model, repeats=repeats, tool_latency_s=tool_latency_s,
                                    core=core), out)

    @bench_app.command("real")
    def real(config: Annotated[Path, typer.Option(help="real multi-pipeline config")] = Path(
                 "configs/real/bench-tools.yaml"),
             quick: Annotated[bool, typer.Option(
                 help="3 steps per pipeline (~3 min on 2 cores, start-ups included)")] = False,
             policies: Annotated[str, typer.Option(
                 help="comma-separated; verl = every verl placement, verl-queue = every "
                 "queue width, verl-queue-K one; the verl row is the best placement that "
                 "ran")] = "verl-serial,verl-split,verl-sized,verl-queue,greedy,jigsaw",
             profile: Annotated[Path | None, typer.Option(
                 help="machine profile: the schedulers' cost model and the predictions' "
                 "(default: profiles/cpu.yaml if present, else the built-in preset)")] = None,
             set_: Annotated[list[str] | None, typer.Option(
                 "--set", help="override, e.g. pipelines.0.steps=5")] = None,
             out: Annotated[Path | None, typer.Option(
                 "--out", help="write compare.json and a run folder per policy here")] = None,
             threads_per_device: Annotated[int, typer.Option(min=1)] = 1,
             repeats: Annotated[int, typer.Option(
                 min=1, help="real runs per policy, interleaved (run 1 of every policy, then "
                 "run 2, ...); the tables print medians and ranges")] = 1,
             ) -> None:
        """Real pipelines under jigsaw, every verl placement (the best is verl) and greedy:
        measured throughput, latency vs alone and busy fraction, with the simulator's
        prediction beside each."""
        names = tuple(p.strip() for p in policies.split(",") if p.strip())
        bench_real_command(dict(config=config, quick=quick, policies=names, profile=profile,
                                overrides=tuple(set_ or []), out_dir=out,
                                threads_per_device=threads_per_device, repeats=repeats))
