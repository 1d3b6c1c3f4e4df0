"""Reliability at the command line: the request budget and its flag, and comparisons that skip a
policy that cannot run the workload instead of aborting (``compare`` and ``bench real``).

``bench real`` runs here without Ray: the real runs and their predictions are replaced by fakes
(as in tests/bench/test_bench_real.py); the feasibility dry run that skips a placement is real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from jigsawrl.cli.main import app
from jigsawrl.errors import JigsawError
from jigsawrl.experiments import resolve as res

runner = CliRunner()
TWO = "configs/two-gsm8k.yaml"
TINY = ["--set", "pipelines.0.steps=1", "--set", "pipelines.1.steps=1",
        "--set", "pipelines.0.batch_size=4", "--set", "pipelines.1.batch_size=4"]


def clean_error(result: Any, *needles: str) -> str:
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text and text.count("error:") == 1, text
    flat = " ".join(text.split())
    for n in needles:
        assert n in flat, (n, text)
    return flat


# ---------------------------------------------------------------------------- request budget

def test_the_measured_crashes_exit_2_naming_the_key() -> None:
    clean_error(runner.invoke(app, ["simulate", TWO, "--set",
                                    "pipelines.0.batch_size=1000000000"]),
                "pipelines.0.batch_size", "valid: 1 to 1,000,000")
    clean_error(runner.invoke(app, ["simulate", TWO, "--set",
                                    "pipelines.0.length_drift_per_step=.nan"]),
                "pipelines.0.length_drift_per_step", "finite number")


def test_over_budget_is_refused_before_sampling_with_the_fix() -> None:
    r = runner.invoke(app, ["compare", TWO, "--set", "pipelines.0.batch_size=1000000"])
    clean_error(r, "pipelines:", "40,002,560 requests", "budget of 2,000,000",
                "jigsawrl --max-requests 41000000")


def test_max_requests_flag_and_env_set_the_budget_for_one_command(tmp_path: Path) -> None:
    clean_error(runner.invoke(app, ["--max-requests", "31", "simulate", TWO, *TINY]),
                "32 requests", "budget of 31")
    clean_error(runner.invoke(app, ["simulate", TWO, *TINY],
                              env={"JIGSAWRL_MAX_REQUESTS": "31"}), "budget of 31")
    assert res.max_requests() == res.DEFAULT_MAX_REQUESTS  # restored after each command
    ok = runner.invoke(app, ["--max-requests", "32", "simulate", TWO, *TINY, "--no-solo",
                             "--no-timeline", "--out", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert res.max_requests() == res.DEFAULT_MAX_REQUESTS
    bad = runner.invoke(app, ["--max-requests", "0", "simulate", TWO])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


@pytest.mark.parametrize("args,where,suggestion", [
    (["simulate", TWO, "--policy", "jigsw"], "--policy", "did you mean 'jigsaw'"),
    (["simulate", TWO, "--set", "scheduler.name=muxserv"], "scheduler.name", "'muxserve'"),
    (["compare", TWO, "--policies", "verl,rolmux"], "--policies", "did you mean 'rollmux'"),
    (["simulate", TWO, "--set", "pipelines.1.task=mathh"], "pipelines.1.task", "'math'"),
])
def test_names_suggest_on_a_typo(args: list[str], where: str, suggestion: str) -> None:
    clean_error(runner.invoke(app, args), where, suggestion)


# ---------------------------------------------------------------------------- compare degrades

def eight_on_one_node(folder: Path) -> Path:
    """8 Qwen3-4B pipelines on one 8-GPU node: muxserve cannot keep all resident."""
    pipes = [{"name": f"p{i}", "model": "qwen3-4b", "task": "gsm8k", "batch_size": 4,
              "group_size": 2, "max_response_tokens": 512, "steps": 1} for i in range(8)]
    path = folder / "eight.yaml"
    path.write_text(yaml.safe_dump({
        "name": "eight", "cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                     "accelerators_per_node": 8}, "pipelines": pipes}))
    return path


def test_compare_skips_a_policy_that_cannot_place_the_workload(tmp_path: Path) -> None:
    cfg = eight_on_one_node(tmp_path)
    r = runner.invoke(app, ["compare", str(cfg), "--policies", "verl-serial,muxserve,jigsaw",
                            "--baseline", "verl-serial", "--out", str(tmp_path / "cmp")])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "muxserve skipped" in flat  # its row in the table
    assert "skipped muxserve: ConfigError: pipelines: muxserve keeps all 8 pipelines" in flat
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert set(doc["runs"]) == {"verl-serial", "jigsaw"}
    assert doc["policies"] == ["verl-serial", "jigsaw"] and doc["baseline"] == "verl-serial"
    assert "muxserve keeps all 8 pipelines resident" in doc["skipped"]["muxserve"]
    assert not (tmp_path / "cmp" / "muxserve").exists()


def test_compare_with_a_skipped_baseline_takes_ratios_to_the_next(tmp_path: Path) -> None:
    cfg = eight_on_one_node(tmp_path)
    r = runner.invoke(app, ["compare", str(cfg), "--policies", "muxserve,verl-serial",
                            "--baseline", "muxserve", "--out", str(tmp_path / "cmp")])
    assert r.exit_code == 0, r.output
    assert "baseline muxserve could not run; ratios are to verl-serial" in " ".join(
        r.output.split())
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert doc["baseline"] == "verl-serial" and doc["requested_baseline"] == "muxserve"
    assert doc["throughput_ratios"]["verl-serial"]["verl-serial"] == pytest.approx(1.0)


def test_compare_is_an_error_only_when_no_policy_can_run(tmp_path: Path) -> None:
    cfg = eight_on_one_node(tmp_path)
    r = runner.invoke(app, ["compare", str(cfg), "--policies", "muxserve,verl-split"])
    clean_error(r, "--policies: no policy can run this workload", "muxserve: ConfigError",
                "verl-split: ConfigError")


def test_compare_config_errors_are_not_skips() -> None:
    r = runner.invoke(app, ["compare", TWO, "--set", "pipelines.0.model=qwen3-5b"])
    clean_error(r, "pipelines.0.model: unknown model", "did you mean")


# ---------------------------------------------------------------------------- bench real degrades

def fake_summary(policy: str, tokens_per_s: float) -> dict[str, Any]:
    names = ("countdown", "calculator", "search")
    return {"policy": policy, "name": "real-bench", "throughput_tokens_per_s": tokens_per_s,
            "makespan_s": 10.0, "busy_fraction": 0.5, "steps": 6, "startup_s": 1.0,
            "pipelines": [{"name": n, "mean_step_latency_s": 1.0, "tokens_per_s": 1.0,
                           "samples": 4, "steps": 2} for n in names]}


@pytest.fixture
def fake_real(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Real runs replaced by fakes (jigsaw's fails); predictions unavailable. Returns the
    policies that were run."""
    import jigsawrl.experiments.real as real

    ran: list[str] = []

    def run_real(cfg: Any, *, policy: str, **_: Any) -> tuple[dict[str, Any], list[Any]]:
        ran.append(policy)
        if policy == "jigsaw":
            raise RuntimeError("worker died")
        return fake_summary(policy, {"verl-serial": 100.0, "greedy": 150.0}[policy]), []

    def no_prediction(*_a: Any, **_k: Any) -> Any:
        raise JigsawError("no prediction in this test")

    monkeypatch.setattr(real, "run_real", run_real)
    monkeypatch.setattr("jigsawrl.bench.real.calibrate", no_prediction)
    return ran


def test_bench_real_reports_skipped_policies_and_compares_the_rest(
        fake_real: list[str], tmp_path: Path) -> None:
    out = tmp_path / "bench"
    r = runner.invoke(app, ["bench", "real", "--policies",
                            "verl-serial,verl-split,greedy,jigsaw", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "verl-split" not in fake_real  # skipped by the dry run, before any real run
    flat = " ".join(r.output.split())
    assert "verl-split skipped" in flat and "jigsaw skipped" in flat  # table rows / notes
    assert "jigsaw skipped: RuntimeError: worker died" in flat and "Traceback" not in flat
    doc = json.loads((out / "compare.json").read_text())
    assert set(doc["skipped"]) == {"verl-split", "jigsaw"}
    assert "ConfigError" in doc["skipped"]["verl-split"] or "Invariant" in doc["skipped"][
        "verl-split"]
    assert set(doc["runs"]) == {"verl-serial", "verl", "greedy"}
    assert doc["throughput_ratios"]["greedy"]["verl"] == pytest.approx(1.5)


def test_bench_real_is_an_error_only_when_no_policy_can_run(fake_real: list[str]) -> None:
    r = runner.invoke(app, ["bench", "real", "--policies", "verl-split,jigsaw"])
    clean_error(r, "--policies: no policy could run", "verl-split:",
                "jigsaw: RuntimeError: worker died")


def test_bench_real_config_errors_come_before_any_run(fake_real: list[str]) -> None:
    r = runner.invoke(app, ["bench", "real", "--set", "pipelines.0.task=countdwn"])
    clean_error(r, "pipelines.0.task", "did you mean 'countdown'")
    assert fake_real == []
