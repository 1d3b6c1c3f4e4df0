"""``compare.png``, the per-policy run folders of ``jigsawrl compare --out``, and keep_events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jigsawrl.cli.main import app
from jigsawrl.config import load_config
from jigsawrl.experiments.compare import compare_policies
from jigsawrl.metrics.compare_plots import plot_compare, safe_dirname, seed_spread

PNG = b"\x89PNG\r\n\x1a\n"
SMALL = ["--set", "pipelines.0.steps=2", "--set", "pipelines.1.steps=2",
         "--set", "pipelines.0.batch_size=8", "--set", "pipelines.1.batch_size=8"]


def test_seed_spread() -> None:
    assert seed_spread([1.0, 2.0, 6.0]) == (3.0, 2.0, 3.0)
    assert seed_spread([5.0]) == (5.0, 0.0, 0.0)


def test_plot_compare_writes_png(tmp_path: Path) -> None:
    runs = {"verl": [{"throughput_tokens_per_s": 100.0, "mean_latency_vs_solo": 1.1},
                     {"throughput_tokens_per_s": 120.0, "mean_latency_vs_solo": 1.2}],
            "jigsaw": [{"throughput_tokens_per_s": 150.0, "mean_latency_vs_solo": None}]}
    path = plot_compare(tmp_path / "sub" / "compare.png", runs, baseline="verl",
                        highlight="jigsaw")
    assert path.read_bytes().startswith(PNG)


def test_safe_dirname() -> None:
    assert safe_dirname("jigsaw(depth=0)") == "jigsaw_depth_0_"
    assert safe_dirname("verl-split") == "verl-split"


def test_keep_events_only_on_request() -> None:
    cfg = load_config("configs/two-gsm8k.yaml", [s for s in SMALL if s != "--set"])
    plain = compare_policies(cfg, ["verl-split"], seeds=1)
    assert plain.first_runs == {}
    kept = compare_policies(cfg, ["verl-split", "verl-serial"], seeds=2, keep_events=True)
    assert set(kept.first_runs) == {"verl-split", "verl-serial"}
    assert all(r.seed == cfg.seed and r.events for r in kept.first_runs.values())
    assert "first_runs" not in json.dumps(kept.to_json())


def test_compare_out_writes_plots_and_timelines(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    res = CliRunner().invoke(app, ["compare", "configs/two-gsm8k.yaml", *SMALL, "--policies",
                                   "verl-split,verl-serial", "--seeds", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "compare.png").read_bytes().startswith(PNG)
    stored = json.loads((out / "compare.json").read_text())
    assert len(stored["runs"]["verl-split"]) == 2
    for pol in ("verl-split", "verl-serial"):
        assert (out / pol / "timeline.png").read_bytes().startswith(PNG)
        summary = json.loads((out / pol / "summary.json").read_text())
        assert summary["policy"] == pol and summary["seed"] == 0
        first = stored["runs"][pol][0]
        assert summary["throughput_tokens_per_s"] == pytest.approx(first["throughput_tokens_per_s"])
        assert (out / pol / "trace.json").stat().st_size > 0
