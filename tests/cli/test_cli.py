"""The command line as a user meets it: files written, tables printed, exit 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jigsawrl.cli.main import app

runner = CliRunner()
SMALL = ["--set", "pipelines.0.steps=2", "--set", "pipelines.1.steps=2",
         "--set", "pipelines.0.batch_size=8", "--set", "pipelines.1.batch_size=8"]


def test_simulate_writes_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = runner.invoke(app, ["simulate", "configs/two-gsm8k.yaml", *SMALL, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "gsm8k-a" in res.output and "math-b" in res.output
    for f in ("config.yaml", "events.jsonl", "trace.json", "summary.json", "timeline.png"):
        assert (out / f).stat().st_size > 0, f
    summary = json.loads((out / "summary.json").read_text())
    for key in ("throughput_tokens_per_s", "makespan_s", "busy_fraction", "mfu"):
        assert summary[key] > 0
    assert {p["name"] for p in summary["pipelines"]} == {"gsm8k-a", "math-b"}
    assert all(p["mean_step_latency_s"] > 0 and p["tokens_per_s"] > 0
               for p in summary["pipelines"])
    rep = runner.invoke(app, ["report", str(out)])
    assert rep.exit_code == 0 and "gsm8k-a" in rep.output


def test_simulate_json(tmp_path: Path) -> None:
    res = runner.invoke(app, ["simulate", "configs/two-gsm8k.yaml", *SMALL, "--json",
                              "--no-solo", "--no-timeline", "--out", str(tmp_path)])
    assert res.exit_code == 0
    assert json.loads(res.output)["policy"] == "verl"


def test_compare_writes_json(tmp_path: Path) -> None:
    res = runner.invoke(app, ["compare", "configs/two-gsm8k.yaml", *SMALL, "--seeds", "2",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "compare.json").read_text())
    assert set(data["runs"]) == {"verl-split", "verl-serial"}
    assert len(data["runs"]["verl-split"]) == 2
    assert data["throughput_ratios"]["verl-split"]["verl-split"] == pytest.approx(1.0)


@pytest.mark.parametrize("what", ["accelerators", "models", "tasks", "schedulers"])
def test_list(what: str) -> None:
    res = runner.invoke(app, ["list", what])
    assert res.exit_code == 0 and res.output.strip()


@pytest.mark.parametrize("args,msg", [
    (["simulate", "nope.yaml"], "not found"),
    (["simulate", "configs/two-gsm8k.yaml", "--set", "pipelines.0.model=gpt5"], "unknown model"),
    (["simulate", "configs/two-gsm8k.yaml", "--set", "pipelines.0.batch_size=-3"], "batch_size"),
    (["simulate", "configs/two-gsm8k.yaml", "--policy", "magic"], "unknown scheduler"),
    (["compare", "configs/two-gsm8k.yaml", "--policies", "verl,magic"], "unknown policy"),
    (["list", "gpus"], "cannot list"),
    (["report", "/nonexistent/run"], "nonexistent"),
])
def test_user_errors_exit_2_without_traceback(args: list[str], msg: str) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert msg in res.output
    assert "Traceback" not in res.output
