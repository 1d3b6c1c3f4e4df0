"""run_experiment end to end: a 2-step smoke run per task, files, resume, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from jigsawrl.cli.real import register  # noqa: E402
from jigsawrl.config import load_config  # noqa: E402
from jigsawrl.errors import InputError  # noqa: E402
from jigsawrl.experiments.sequential import run_experiment  # noqa: E402

torch.set_num_threads(1)

TASKS = ["arithmetic", "countdown", "calculator", "search"]


def _cfg(task: str, steps: int = 2, **train):  # noqa: ANN003, ANN202
    return load_config(data={"seed": 1, "pipelines": [{
        "name": task, "model": "qwen2-1m", "task": task, "batch_size": 2, "group_size": 2,
        "steps": steps, "max_response_tokens": 24,
        "train": {"warmup_steps": 2, "threads": 1, "eval_size": 2, "micro_batch_size": 4,
                  **train}}]})


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warm")


@pytest.mark.parametrize("task", TASKS)
def test_two_step_smoke_run(task: str, tmp_path: Path, cache: Path) -> None:
    events: list[dict] = []
    summary = run_experiment(_cfg(task), tmp_path, on_step=events.append, cache_dir=cache)
    (p,) = summary["pipelines"]
    assert p["steps"] == 2 and len(p["reward_mean_per_step"]) == 2
    assert len(p["response_length_mean_per_step"]) == 2
    assert ("tool_calls_per_sample_per_step" in p) == (task in ("calculator", "search"))
    assert p["mean_step_latency_s"] > 0 and p["tokens_per_s"] > 0
    assert 0.0 <= p["eval_reward_before"] <= 1.0 and 0.0 <= p["eval_reward_after"] <= 1.0
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["pipelines"][0]["name"] == task and on_disk["throughput_tokens_per_s"] > 0
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
    assert (tmp_path / "config.yaml").is_file()
    assert list((tmp_path / "tb" / task).glob("events.out.tfevents.*"))
    names = set(events[-2]["metrics"])
    assert names >= {"critic/score/mean", "response_length/mean", "actor/pg_loss",
                     "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac",
                     "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref",
                     "timing_s/update_actor", "timing_s/update_weights", "timing_s/step",
                     "perf/throughput"}


def test_resume_continues_from_the_checkpoint(tmp_path: Path, cache: Path) -> None:
    first = run_experiment(_cfg("arithmetic", steps=1), tmp_path, cache_dir=cache)
    resumed = run_experiment(_cfg("arithmetic", steps=2), tmp_path, resume=True, cache_dir=cache)
    a, b = first["pipelines"][0], resumed["pipelines"][0]
    assert b["steps"] == 2
    assert b["reward_mean_per_step"][0] == a["reward_mean_per_step"][0]
    assert b["eval_reward_before"] == a["eval_reward_before"]
    assert (tmp_path / "checkpoints" / "arithmetic" / "step-000002").is_dir()
    with pytest.raises(InputError):
        run_experiment(_cfg("arithmetic"), None, resume=True)


def _app() -> typer.Typer:
    app, bench = typer.Typer(), typer.Typer()
    app.add_typer(bench, name="bench")
    register(app, bench)
    return app


def test_cli_bad_config_exits_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelines: [{name: a, model: qwen2-1m, task: arithmetic, batch_size: 0}]\n")
    result = CliRunner().invoke(_app(), ["run", str(bad)])
    assert result.exit_code == 2
    assert "batch_size" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(_app(), ["run", str(bad), "--set", "nokey"])
    assert result.exit_code == 2


def test_cli_unknown_task_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pipelines: [{name: a, model: qwen2-1m, task: nope, steps: 1}]\n")
    result = CliRunner().invoke(_app(), ["run", str(cfg), "--set", "pipelines.0.train.threads=1"])
    assert result.exit_code == 2 and "unknown task" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("config", ["arithmetic", "calculator"])
def test_learning_run_raises_reward(config: str, tmp_path: Path) -> None:
    """The recorded learning runs (docs/BENCHMARKS.md), shortened: reward rises."""
    cfg = load_config(Path(__file__).parents[2] / "configs" / "real" / f"{config}.yaml",
                      ["pipelines.0.train.threads=1"])
    summary = run_experiment(cfg, tmp_path)
    (p,) = summary["pipelines"]
    curve = p["reward_mean_per_step"]
    k = max(5, len(curve) // 5)
    assert sum(curve[-k:]) / k > sum(curve[:k]) / k + 0.02
    if config == "calculator":
        tools = p["tool_calls_per_sample_per_step"]
        assert sum(tools[-k:]) / k > sum(tools[:k]) / k
