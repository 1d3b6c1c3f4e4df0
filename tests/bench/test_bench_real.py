"""``jigsawrl bench real`` and ``jigsawrl run --ray``'s report: how runs are related (verl, alone),
labels (``verl``, ``verl-queue-K``), repeats (interleaving, median and range, compare.json's
shape: with the real run stubbed), CLI errors (exit 2, one message, no traceback, before any real
run), the tables, and one short end-to-end real bench (``slow``: two real runs, ~1-2 minutes on a
2-core machine). The real repeats test is in ``tests/executors/test_ray_verl_placements.py``
(it shares that module's Ray).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import jigsawrl.bench.real as bench_real
from jigsawrl.bench.real import (
    BenchCompare,
    BenchRealResult,
    BenchRealSpec,
    Spread,
    _relate,
    expand_labels,
    label_config,
    median_summary,
    run_bench_real,
)
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
from jigsawrl.errors import ConfigError
from jigsawrl.experiments.calibrate import Calibration, Compared

runner = CliRunner()
BENCH = "configs/real/bench.yaml"


def fake_summary(policy: str, tokens_per_s: float, lat: dict[str, float]) -> dict[str, Any]:
    return {"policy": policy, "name": "real-bench", "throughput_tokens_per_s": tokens_per_s,
            "makespan_s": 10.0, "busy_fraction": 0.5, "steps": 2 * len(lat),
            "pipelines": [{"name": n, "mean_step_latency_s": v, "tokens_per_s": 1.0,
                           "samples": 4, "steps": 2} for n, v in lat.items()]}


def fake_result(runs: dict[str, dict[str, Any]]) -> BenchRealResult:
    cfg = load_config(BENCH)
    res = BenchRealResult(cfg, BenchCompare([], [0], "verl"))
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
    res.calibrations["jigsaw"] = [cal]
    _relate(res, ("verl-serial", "jigsaw"))
    console = Console(width=200, record=True)
    for t in (bench_table(res), bench_pipeline_table(res)):
        console.print(t)
    text = console.export_text()
    assert "200" in text and "25%" in text and "1.60×" in text and "1.20×" in text
    assert "1.00 (-17%)" in text
    notes = "\n".join(bench_notes(res))
    assert "verl-split skipped" in notes and "1.60×" in notes and "MISSES the 10% aim" in notes
    assert "realistic bound" not in notes  # no bound computed: no line
    cal.bound_s = 4.0
    cal.sim_summary["tokens"] = 1000  # 250 tokens/s at the bound; jigsaw predicted 200
    notes = "\n".join(bench_notes(res))
    assert "realistic bound of the replayed workload" in notes and "250 tokens/s" in notes
    assert "jigsaw 80%" in notes


def test_verl_is_the_best_of_every_placement_including_the_queue() -> None:
    res = fake_result({
        "verl-serial": fake_summary("verl-serial", 100.0, {"a": 1.0}),
        "verl-queue-2": fake_summary("verl-queue", 140.0, {"a": 1.2}),
        "verl-sized": fake_summary("verl-sized", 120.0, {"a": 1.1}),
        "jigsaw": fake_summary("jigsaw", 168.0, {"a": 1.3})})
    _relate(res, ("verl-serial", "verl-sized", "verl-queue-2", "jigsaw"))
    assert res.compare.policies == ["verl-serial", "verl-sized", "verl-queue-2", "verl",
                                    "jigsaw"]
    assert res.summaries["verl"]["variant"] == "verl-queue-2"
    assert res.ratio("jigsaw") == pytest.approx(1.2)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(bench_table(res))
    assert "verl=verl-queue-2" in console.export_text()
    assert "verl-queue-2" in "\n".join(bench_notes(res))


def test_labels_expand_and_queue_labels_carry_k() -> None:
    cfg = load_config(BENCH)  # three pipelines: only k = 2 lies between serial and split
    labels, left = expand_labels(("verl", "jigsaw", "verl-serial"), cfg)
    assert labels == ["verl-split", "verl-serial", "verl-sized", "verl-queue-2", "jigsaw"]
    assert left == {}
    assert expand_labels(("verl-queue",), cfg)[0] == ["verl-queue-2"]
    two = cfg.model_copy(update={"pipelines": cfg.pipelines[:2]})
    labels, left = expand_labels(("verl-queue", "jigsaw"), two)
    assert labels == ["jigsaw"] and "verl-queue" in left
    run_cfg, name = label_config(cfg, "verl-queue-2")
    assert name == "verl-queue" and run_cfg.scheduler.params == {"k": 2}
    assert label_config(cfg, "jigsaw") == (cfg, "jigsaw")
    for bad in ("verl-queue-0", "verl-queue-two", "nonsense"):
        with pytest.raises(ConfigError, match="--policies"):
            expand_labels((bad,), cfg)
    with pytest.raises(ConfigError, match="no policies"):
        expand_labels((), cfg)


def test_dry_run_places_queue_and_skips_what_cannot_hold_the_pipelines() -> None:
    cfg = load_config(BENCH)  # 3 pipelines, 2 devices
    assert bench_real.feasibility(cfg, "verl-queue-2") is None
    assert "verl-sized needs at least 3 devices" in (bench_real.feasibility(cfg, "verl-sized")
                                                      or "")
    assert "verl-serial" in (bench_real.feasibility(cfg, "verl-queue-1") or "")


# ---------------------------------------------------------------------------- repeats

def test_spread_is_median_and_range() -> None:
    s = Spread.of([3.0, 1.0, 2.0])
    assert s is not None and (s.median, s.lo, s.hi, s.n) == (2.0, 1.0, 3.0, 3)
    s = Spread.of([4.0, None, 1.0, "x", True, 2.0, 10.0])  # not-numbers left out
    assert s is not None and (s.median, s.lo, s.hi, s.n) == (3.0, 1.0, 10.0, 4)
    assert Spread.of([None]) is None and Spread.of([]) is None
    assert Spread.of([5]).to_json() == {"median": 5.0, "min": 5.0, "max": 5.0, "n": 1}


def test_median_summary_takes_medians_of_pool_and_pipelines() -> None:
    runs = [fake_summary("jigsaw", v, {"a": lat}) for v, lat in ((100.0, 3.0), (300.0, 1.0),
                                                                  (200.0, 2.0))]
    runs[1]["busy_fraction"] = None  # a run without the value does not count
    m = median_summary(runs)
    assert m["throughput_tokens_per_s"] == 200.0 and m["repeats"] == 3
    assert m["spread"]["throughput_tokens_per_s"] == [100.0, 300.0]
    assert m["busy_fraction"] == 0.5 and m["pipelines"][0]["mean_step_latency_s"] == 2.0
    one = median_summary(runs[:1])
    assert one["throughput_tokens_per_s"] == 100.0 and one["repeats"] == 1


def stub_bench(monkeypatch: pytest.MonkeyPatch, tput: dict[str, list[float | None]],
               infeasible: tuple[str, ...] = ()) -> list[tuple[str, int]]:
    """Replace the real run (and the dry run) by canned summaries: ``tput[label][r - 1]`` is
    repeat r's tokens/s, None a failed run. Returns the calls, in order."""
    calls: list[tuple[str, int]] = []

    def fake_run(spec: Any, cfg: Any, label: str, profile: Any,
                 repeat: int) -> tuple[dict[str, Any] | None, None, str | None]:
        calls.append((label, repeat))
        v = tput[label][repeat - 1]
        if v is None:
            return None, None, "RuntimeError: worker died"
        s = fake_summary(label, v, {"countdown": 100.0 / v})
        s.update(repeat=repeat, label=label, predicted={"pool": {"makespan_s": {}}})
        return s, None, None

    monkeypatch.setattr(bench_real, "_run_label", fake_run)
    monkeypatch.setattr(bench_real, "feasibility",
                        lambda cfg, label: "ConfigError: no" if label in infeasible else None)
    return calls


def test_repeats_interleave_and_compare_json_holds_every_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = stub_bench(monkeypatch, {"verl-serial": [100.0, 120.0],
                                     "verl-queue-2": [150.0, 90.0], "jigsaw": [200.0, 180.0]},
                       infeasible=("verl-sized",))
    spec = BenchRealSpec(config=Path(BENCH), repeats=2, out_dir=tmp_path,
                         policies=("jigsaw", "verl-serial", "verl-sized", "verl-queue-2"))
    res = run_bench_real(spec)
    assert calls == [(p, r) for r in (1, 2) for p in ("verl-serial", "jigsaw", "verl-queue-2")]
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert doc["repeats"] == 2 and doc["skipped"].keys() == {"verl-sized"}
    for label in ("verl-serial", "verl-queue-2", "jigsaw", "verl"):
        assert [s["repeat"] for s in doc["runs"][label]] == [1, 2]
        assert all("predicted" in s for s in doc["runs"][label])
    # medians: serial 110, queue 120 -> verl is the queue; jigsaw 190
    assert {s["variant"] for s in doc["runs"]["verl"]} == {"verl-queue-2"}
    assert doc["median"]["jigsaw"]["throughput_tokens_per_s"] == pytest.approx(190.0)
    assert doc["spread"]["verl"]["throughput_tokens_per_s"] == [90.0, 150.0]
    assert doc["throughput_ratios"]["jigsaw"]["verl"] == pytest.approx(190.0 / 120.0)
    assert doc["per_repeat_ratios"]["jigsaw"] == pytest.approx([200 / 150, 180 / 90])
    assert res.ratio("jigsaw") == pytest.approx(190.0 / 120.0)
    assert res.alone_s == {"countdown": pytest.approx(median_summary(
        res.compare.runs["verl-serial"])["pipelines"][0]["mean_step_latency_s"])}
    for label in ("verl-serial", "jigsaw"):
        for r in (1, 2):
            assert (tmp_path / label / f"repeat-{r}" / "summary.json").is_file()
    meta = json.loads((tmp_path / "bench_real.json").read_text())
    assert meta["verl"] == "verl-queue-2" and meta["repeats"] == 2
    assert meta["jigsaw_vs_verl_per_repeat"] == pytest.approx([200 / 150, 2.0])
    from rich.console import Console

    console = Console(width=220, record=True)
    console.print(bench_table(res))
    text = console.export_text()
    assert "90–150" in text and "verl=verl-queue-2" in text and "range" in text
    notes = "\n".join(bench_notes(res))
    assert "2 repeats, interleaved" in notes and "1.33×, 2.00×" in notes


def test_a_run_that_fails_first_is_skipped_a_later_failure_is_a_note(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stub_bench(monkeypatch, {"verl-serial": [100.0, None, 110.0],
                                     "greedy": [None, 1.0, 1.0], "jigsaw": [150.0, 160.0, 170.0]})
    res = run_bench_real(BenchRealSpec(config=Path(BENCH), repeats=3,
                                       policies=("verl-serial", "greedy", "jigsaw")))
    assert [c for c in calls if c[0] == "greedy"] == [("greedy", 1)]  # not run again
    assert "greedy" in res.compare.skipped
    assert [s["repeat"] for s in res.compare.runs["verl-serial"]] == [1, 3]
    assert any("verl-serial: repeat 2 failed" in n for n in res.compare.notes)
    assert res.compare.per_repeat_ratios()["jigsaw"] == pytest.approx([1.5, None, 170 / 110])


def test_one_repeat_keeps_todays_layout(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    stub_bench(monkeypatch, {"verl-serial": [100.0], "jigsaw": [150.0]})
    run_bench_real(BenchRealSpec(config=Path(BENCH), out_dir=tmp_path,
                                 policies=("verl-serial", "jigsaw")))
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert doc["repeats"] == 1 and len(doc["runs"]["jigsaw"]) == 1
    assert doc["throughput_ratios"]["jigsaw"]["verl"] == pytest.approx(1.5)
    assert (tmp_path / "jigsaw" / "summary.json").is_file()
    assert not (tmp_path / "jigsaw" / "repeat-1").exists()
    with pytest.raises(ConfigError, match="repeats"):
        run_bench_real(BenchRealSpec(config=Path(BENCH), repeats=0))


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
    (["--policies", "verl-queue-x"], "'verl-queue-x'"),
    (["--repeats", "0"], "--repeats"),
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


def test_a_profile_of_another_full_share_exits_2_before_ray_starts(tmp_path: Path) -> None:
    """A profile measured at 2 threads a device is refused by runs of one thread a device
    (their default), with the command that profiles it right."""
    doc = {"version": 1, "source": "jigsawrl profile test", "fitted": {
        "full_share_threads": 2, "accelerator": {}, "params": {}}}
    path = tmp_path / "two-threads.yaml"
    path.write_text(yaml.safe_dump(doc))
    for args in (["run", BENCH, "--ray", "--profile", str(path)],
                 ["bench", "real", "--profile", str(path)]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        assert "full share as 2 torch thread(s)" in res.output, res.output
        assert "--threads 1" in res.output and "Traceback" not in res.output


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
