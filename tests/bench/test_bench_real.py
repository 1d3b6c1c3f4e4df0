"""``jigsawrl bench real`` and ``jigsawrl run --ray``'s report: how runs are related (verl, alone),
CLI errors (exit 2, one message, no traceback, before any real run), the tables, and one short
end-to-end real bench (``slow``: two real runs, ~1-2 minutes on a 2-core machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from jigsawrl.bench.real import BenchRealResult, BenchRealSpec, _relate, run_bench_real
from jigsawrl.bench.real_report import (
    bench_notes,
    bench_pipeline_table,
    bench_table,
    plot_reward_curves,
    reward_curves,
    run_table,
)
from jigsawrl.cli.main import app
from jigsawrl.config import load_config
from jigsawrl.experiments.calibrate import Calibration, Compared
from jigsawrl.experiments.compare import CompareResult

runner = CliRunner()
BENCH = "configs/real/bench.yaml"


def fake_summary(policy: str, tokens_per_s: float, lat: dict[str, float]) -> dict[str, Any]:
    return {"policy": policy, "name": "real-bench", "throughput_tokens_per_s": tokens_per_s,
            "makespan_s": 10.0, "busy_fraction": 0.5, "steps": 2 * len(lat),
            "pipelines": [{"name": n, "mean_step_latency_s": v, "tokens_per_s": 1.0,
                           "samples": 4, "steps": 2} for n, v in lat.items()]}


def fake_result(runs: dict[str, dict[str, Any]]) -> BenchRealResult:
    cfg = load_config(BENCH)
    res = BenchRealResult(cfg, CompareResult([], [0], "verl"))
    res.compare.runs = {p: [s] for p, s in runs.items()}
    return res


def test_verl_is_the_better_placement_and_alone_is_verl_serial() -> None:
    res = fake_result({
        "verl-serial": fake_summary("verl-serial", 100.0, {"a": 1.0, "b": 2.0}),
        "verl-split": fake_summary("verl-split", 120.0, {"a": 1.5, "b": 2.0}),
        "jigsaw": fake_summary("jigsaw", 180.0, {"a": 2.0, "b": 3.0})})
    _relate(res, ("verl-serial", "verl-split", "jigsaw"))
    assert res.compare.policies == ["verl-split", "verl-serial", "verl", "jigsaw"]
    verl = res.summaries["verl"]
    assert verl["variant"] == "verl-split" and verl["policy"] == "verl"
    assert res.alone_s == {"a": 1.0, "b": 2.0}
    jig = res.summaries["jigsaw"]
    assert [p["latency_vs_solo"] for p in jig["pipelines"]] == [2.0, 1.5]
    assert jig["mean_latency_vs_solo"] == pytest.approx(1.75)
    assert res.ratio("jigsaw") == pytest.approx(1.5)
    assert json.loads(json.dumps(res.compare.to_json()))["throughput_ratios"]["jigsaw"][
        "verl"] == pytest.approx(1.5)


def test_without_verl_runs_the_baseline_is_the_first_policy() -> None:
    res = fake_result({"jigsaw": fake_summary("jigsaw", 1.0, {"a": 1.0})})
    _relate(res, ("jigsaw",))
    assert res.compare.baseline == "jigsaw" and res.alone_s == {}
    assert res.ratio("jigsaw") is None


def test_tables_and_notes_render_measured_and_predicted() -> None:
    from rich.console import Console

    res = fake_result({"verl-serial": fake_summary("verl-serial", 100.0, {"countdown": 1.0}),
                       "jigsaw": fake_summary("jigsaw", 160.0, {"countdown": 1.2})})
    res.compare.skipped["verl-split"] = "ConfigError: 3 pipelines need more than 2 devices"
    cal = Calibration("jigsaw", "test", {"throughput_tokens_per_s": Compared(160.0, 200.0),
                                         "makespan_s": Compared(10.0, 8.0)},
                      {"countdown": {"step_latency_s": Compared(1.2, 1.0),
                                     "tokens_per_s": Compared(1.0, 1.25)}}, {})
    res.calibrations["jigsaw"] = cal
    _relate(res, ("verl-serial", "jigsaw"))
    console = Console(width=200, record=True)
    for t in (bench_table(res), bench_pipeline_table(res)):
        console.print(t)
    text = console.export_text()
    assert "200" in text and "25%" in text and "1.60×" in text and "1.20×" in text
    assert "1.00 (-17%)" in text
    notes = "\n".join(bench_notes(res))
    assert "verl-split skipped" in notes and "1.60×" in notes and "MISSES the 10% aim" in notes


def test_run_table_and_reward_curves(tmp_path: Path) -> None:
    from rich.console import Console

    s = fake_summary("jigsaw", 50.0, {"countdown": 0.5})
    s["pipeline_metrics"] = {"countdown": [{"step": 1, "critic/score/mean": 0.5},
                                           {"step": 0, "critic/score/mean": 0.25}]}
    assert reward_curves(s) == {"countdown": [0.25, 0.5]}
    console = Console(width=200, record=True)
    console.print(run_table(s, None))
    assert "0.250 → 0.500" in console.export_text()
    png = plot_reward_curves(tmp_path / "reward_curves.png", s)
    assert png is not None and png.stat().st_size > 0
    assert plot_reward_curves(tmp_path / "none.png", {"pipelines": []}) is None


@pytest.mark.parametrize("args, needle", [
    (["--config", "nope.yaml"], "config file not found"),
    (["--policies", "verl"], "verl is derived"),
    (["--policies", "jigsaw,nonsense"], "'nonsense'"),
    (["--set", "pipelines.0.steps=-1"], "pipelines.0.steps"),
    (["--profile", "missing-profile.yaml"], "profile file not found"),
])
def test_bench_real_bad_input_exits_2_before_running(args: list[str], needle: str) -> None:
    res = runner.invoke(app, ["bench", "real", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_run_ray_bad_profile_exits_2_before_ray_starts() -> None:
    res = runner.invoke(app, ["run", BENCH, "--ray", "--profile", "missing-profile.yaml"])
    assert res.exit_code == 2 and "profile file not found" in res.output
    res = runner.invoke(app, ["run", "nope.yaml", "--ray"])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_modules_import_without_torch_and_ray() -> None:
    code = ("import sys\nfor m in ('torch', 'ray', 'transformers'): sys.modules[m] = None\n"
            "import jigsawrl.experiments.calibrate, jigsawrl.bench.real, jigsawrl.bench.real_report\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


TINY = [f"pipelines.{i}.{k}={v}" for i in range(3) for k, v in (
    ("steps", 1), ("batch_size", 2), ("group_size", 2), ("train.warmup_steps", 2))]


@pytest.mark.slow
def test_bench_real_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    spec = BenchRealSpec(config=Path(BENCH), policies=("verl-serial", "verl-split", "jigsaw"),
                         overrides=tuple(TINY), out_dir=tmp_path / "out",
                         cache_dir=tmp_path / "cache")
    res = run_bench_real(spec)
    assert "verl-split" in res.compare.skipped  # 3 pipelines, 2 devices
    assert set(res.compare.runs) == {"verl-serial", "verl", "jigsaw"}
    doc = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert doc["baseline"] == "verl" and "jigsaw" in doc["throughput_ratios"]
    for policy in ("verl-serial", "jigsaw"):
        s = doc["runs"][policy][0]
        assert s["throughput_tokens_per_s"] > 0 and s["predicted"]["pool"]["makespan_s"]
        assert (tmp_path / "out" / policy / "calibration.json").is_file()
        assert (tmp_path / "out" / policy / "timeline.png").is_file()
    assert res.alone_s.keys() == {"countdown", "calculator", "search"}
