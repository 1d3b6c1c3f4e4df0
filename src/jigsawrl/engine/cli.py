"""CLI commands of the real engine: ``jigsawrl run CONFIG`` and ``jigsawrl bench trl``.

What: :func:`register` adds the commands to the main Typer app (the lead wires it in
``jigsawrl/cli.py``), so the main CLI imports torch only when one of these commands runs. This is
the only engine module that prints: a rich progress bar per pipeline while it runs, a table at
the end. User errors (bad config, unreadable checkpoint) become one message on stderr and exit
code 2, never a traceback.

Example::

    jigsawrl run configs/real/arithmetic.yaml --out runs/arith --set pipelines.0.steps=50
    jigsawrl bench trl --task arithmetic --steps 10
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jigsawrl.errors import JigsawError

_err = Console(stderr=True)


def _fail(exc: JigsawError) -> typer.Exit:
    _err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
    return typer.Exit(code=2)


def ray_run_command(config: Path, overrides: list[str], out: Path | None,
                    address: str | None) -> None:
    """``jigsawrl run --ray``: all pipelines together through the Ray executor."""
    from jigsawrl.config import load_config
    from jigsawrl.metrics.report import summary_table

    try:
        cfg = load_config(config, overrides)
        from jigsawrl.realrun import run_real

        console = Console()
        with console.status(f"running {len(cfg.pipelines)} pipelines on Ray under "
                            f"{cfg.scheduler.name}"):
            summary, _ = run_real(cfg, address=address, out_dir=out)
    except JigsawError as exc:
        raise _fail(exc) from None
    console.print(summary_table(summary))
    if out is not None:
        console.print(f"results in [bold]{out}[/]")


def run_command(config: Path, overrides: list[str], out: Path | None, resume: bool) -> None:
    """Load the config, run it with a progress bar, print the result table."""
    from jigsawrl.config import load_config

    try:
        cfg = load_config(config, overrides)
        from jigsawrl.engine.run import run_experiment

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
    except JigsawError as exc:
        raise _fail(exc) from None
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


def bench_trl_command(spec_kwargs: dict[str, Any], out: Path | None) -> None:
    """Run both sides and print them side by side."""
    from jigsawrl.engine.bench_trl import BenchTrlSpec, run_bench_trl, trl_available

    ok, why = trl_available()
    console = Console()
    if not ok:
        _err.print(f"[yellow]TRL side skipped:[/yellow] {why}", markup=True, highlight=False)
    spec = BenchTrlSpec(**spec_kwargs)
    try:
        with console.status("running jigsawrl, then TRL ..."):
            result = run_bench_trl(spec)
    except JigsawError as exc:
        raise _fail(exc) from None
    table = Table(title=f"GRPO {spec.model} on {spec.task}: {spec.batch_size} prompts × "
                        f"{spec.group_size}, {spec.steps} steps, {result['torch_threads']} thread(s)")
    for col in ("system", "samples/s (steps)", "samples/s (wall)", "reward step 1",
                "reward last 3 steps"):
        table.add_column(col)
    for name in ("jigsawrl", "trl"):
        r = result[name]
        if "error" in r:
            table.add_row(name, "-", "-", "-", r["error"][:60])
            continue
        rw = r["reward_per_step"]
        table.add_row(name, f"{r['samples_per_s']:.1f}", f"{r['wall_samples_per_s']:.1f}",
                      f"{rw[0]:.3f}" if rw else "-",
                      f"{sum(rw[-3:]) / len(rw[-3:]):.3f}" if rw else "-")
    console.print(table)
    if "speedup" in result:
        console.print(f"jigsawrl / TRL samples/s: {result['speedup']:.2f}x")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_trl.json").write_text(json.dumps(result, indent=1))
        console.print(f"wrote {out / 'bench_trl.json'}")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``run`` to ``app`` and ``trl`` to ``bench_app``."""

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
            ) -> None:
        """Run the pipelines of CONFIG for real: one after another on this CPU, or (``--ray``)
        multiplexed on a pool of Ray workers by the same scheduler as the simulator."""
        if ray:
            ray_run_command(config, list(set_ or []), out, address)
        else:
            run_command(config, list(set_ or []), out, resume)

    @bench_app.command("trl")
    def trl(model: Annotated[str, typer.Option(help="engine model preset")] = "qwen2-1m",
            task: Annotated[str, typer.Option(help="single-turn task")] = "arithmetic",
            batch_size: Annotated[int, typer.Option(min=1)] = 16,
            group_size: Annotated[int, typer.Option(min=2)] = 4,
            steps: Annotated[int, typer.Option(min=1)] = 10,
            temperature: float = 1.0, top_p: float = 1.0, lr: float = 3e-4,
            warmup_steps: Annotated[int, typer.Option(min=0)] = 40, seed: int = 0,
            threads: Annotated[int, typer.Option(min=1)] = 1,
            recompute_old_logprobs: Annotated[bool, typer.Option(
                help="jigsawrl side: separate old-log-prob pass (TRL skips it)")] = False,
            out: Annotated[Path | None, typer.Option(help="write bench_trl.json here")] = None,
            ) -> None:
        """GRPO through TRL's GRPOTrainer and through jigsawrl: samples/s and reward."""
        bench_trl_command(dict(model=model, task=task, batch_size=batch_size,
                               group_size=group_size, steps=steps, temperature=temperature,
                               top_p=top_p, lr=lr, warmup_steps=warmup_steps, seed=seed,
                               threads=threads,
                               recompute_old_logprobs=recompute_old_logprobs), out)
