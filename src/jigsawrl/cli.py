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

import functools
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jigsawrl.errors import JigsawError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Multiplex LLM RL post-training pipelines on one accelerator pool.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print measured ratios.")
app.add_typer(bench_app, name="bench")

out = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override: key.path=value")]


def user_errors(fn: F) -> F:
    """Turn user-facing errors into one message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except JigsawError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logs")] = False
          ) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


def _progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True,
                    disable=not err.is_terminal)


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
    from jigsawrl.metrics.report import summary_table
    from jigsawrl.metrics.rundir import write_run
    from jigsawrl.runner import simulate as run_sim

    cfg = load_config(config, set_)
    name = cfg.name or config.stem
    if cfg.name is None:
        cfg = cfg.model_copy(update={"name": name})
    total = sum(p.steps for p in cfg.pipelines)
    with _progress() as prog:
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


# ---------------------------------------------------------------------------- compare
@app.command()
@user_errors
def compare(
    config: Annotated[Path, typer.Argument(help="experiment YAML")],
    policies: Annotated[str, typer.Option(help="comma-separated scheduler names")] = (
        "verl-split,verl-serial"),
    seeds: Annotated[int, typer.Option(min=1, help="seeds per policy")] = 1,
    set_: SetOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="write compare.json here")] = None,
    baseline: Annotated[str | None, typer.Option(help="policy the ratios are taken to")] = None,
) -> None:
    """Run several policies on one config, side by side, and print one table."""
    from jigsawrl.compare import compare_policies
    from jigsawrl.config import load_config
    from jigsawrl.metrics.report import compare_table

    cfg = load_config(config, set_)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    with _progress() as prog:
        task = prog.add_task("comparing", total=len(names) * seeds)
        result = compare_policies(cfg, names, seeds=seeds,
                                  on_run=lambda: prog.advance(task), baseline=baseline)
    out.print(compare_table(result.mean_summaries, baseline=result.baseline))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "compare.json").write_text(json.dumps(result.to_json(), indent=1))
        out.print(f"wrote [bold]{out_dir / 'compare.json'}[/]")


# ---------------------------------------------------------------------------- list / report
@app.command("list")
@user_errors
def list_(what: Annotated[str, typer.Argument(help="accelerators|models|tasks|schedulers")]
          ) -> None:
    """List presets and policies."""
    from jigsawrl.catalog import catalog_table

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
) -> None:
    """Time the simulator itself (wall seconds per run; no solo references, no files)."""
    from jigsawrl.bench import sim_speed

    res = sim_speed(config, repeats=repeats)
    table = Table(title=f"simulator speed: {config}")
    for col in ("devices", "pipelines", "steps", "events", "best wall s", "median wall s"):
        table.add_column(col, justify="right")
    table.add_row(str(res["devices"]), str(res["pipelines"]), str(res["steps"]),
                  str(res["events"]), f"{res['best_s']:.2f}", f"{res['median_s']:.2f}")
    out.print(table)


def _register_engine() -> None:
    """Add ``run`` and ``bench trl`` when the engine extra (torch) is importable."""
    try:
        from jigsawrl.engine.cli import register
    except ImportError as exc:  # torch not installed: say how to get it
        missing = str(exc)

        @app.command()
        def run(config: Path) -> None:  # noqa: ARG001
            """Run real pipelines on this CPU (needs the engine extra)."""
            err.print(f"[bold red]error:[/] the real engine needs torch ({missing}); "
                      "install it with: pip install -e '.[engine]'")
            raise typer.Exit(2)

        return
    register(app, bench_app)


_register_engine()


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
