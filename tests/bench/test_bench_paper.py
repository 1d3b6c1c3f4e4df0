"""The paper-matrix harness (``bench paper``) and the decision-time benchmark (``bench decide``).

A tiny matrix written in a temporary folder runs through the Python API: files written, every
policy that ran in its table, ratios equal to the ratios of the summaries' throughputs, an
unregistered policy or rejected params skipped with a warning. No timing is asserted.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jigsawrl.bench.decide import bench_decide, decide_config, decision_stats
from jigsawrl.bench.paper import run_paper
from jigsawrl.bench.paper_matrix import (
    QUICK_BATCH,
    QUICK_STEPS,
    REPORT_FILE,
    load_group,
    load_matrix,
    quick_config,
)
from jigsawrl.cli.main import app
from jigsawrl.errors import ConfigError

PIPE = ("{{name: {n}, model: qwen3-4b, task: gsm8k, batch_size: 8, group_size: 2, "
        "max_response_tokens: 2048, steps: 2}}")


def _write(folder: Path, name: str, bench: str, n_pipes: int = 2) -> None:
    pipes = "\n".join(f"  - {PIPE.format(n=f'p{i}')}" for i in range(n_pipes))
    (folder / f"{name}.yaml").write_text(
        f"name: {name}\ncluster: {{accelerator: h100-80gb, num_nodes: 1, "
        f"accelerators_per_node: 4}}\npipelines:\n{pipes}\nseed: 3\nbench:\n{bench}\n")


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    folder = tmp_path / "matrix"
    folder.mkdir()
    _write(folder, "sync-tiny", "  section: sync\n  quick: true\n  lead: verl-split\n"
           "  baseline: verl-serial\n  policies: [verl-serial, verl-split, no-such-policy]")
    _write(folder, "ablation-tiny", "  section: ablation\n  quick: true\n  lead: verl-split\n"
           "  baseline: verl-serial\n  policies: [verl-serial, verl-split, split-mem, bogus]\n"
           "  variants:\n    split-mem: {policy: verl-split, params: "
           "{gpu_memory_utilization: 0.7}}\n    bogus: {policy: verl-split, params: {nope: 1}}")
    _write(folder, "async-full-only", "  section: async\n  quick: false\n  policies: [verl]")
    return folder


def test_quick_run_writes_consistent_report(matrix: Path, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    seen: list[str] = []
    with caplog.at_level(logging.WARNING):
        run = run_paper(matrix, quick=True, seeds=2, out_dir=out, command="jigsawrl bench x",
                        on_group=lambda g: seen.append(g.group.name))
    assert seen == ["sync-tiny", "ablation-tiny"]  # section order; the full-only group is left out
    md = (out / REPORT_FILE).read_text()
    assert "`jigsawrl bench x`" in md and "cores" in md and "seeds 3..4" in md
    for g in run.groups:
        res = g.result
        assert res is not None and (out / g.group.name / "compare.json").is_file()
        assert (out / g.group.name / "compare.png").stat().st_size > 0
        stored = json.loads((out / g.group.name / "compare.json").read_text())
        assert stored["seeds"] == [3, 4] and set(stored["runs"]) == set(res.policies)
        means = res.mean_summaries
        for label in res.policies:
            assert f"| {label} |" in md or f"| **{label}** |" in md
            assert all(s["pipelines"][0]["steps"] == min(2, QUICK_STEPS) for s in res.runs[label])
        want = means["verl-split"]["throughput_tokens_per_s"] / \
            means["verl-serial"]["throughput_tokens_per_s"]
        assert g.lead_ratios()["verl-serial"] == pytest.approx(want)
        assert f"{want:.2f}×" in md
    ablation = run.groups[1]
    assert ablation.result is not None and "split-mem" in ablation.result.policies
    assert set(run.groups[0].skipped) == {"no-such-policy"}
    assert set(ablation.skipped) == {"bogus"}
    assert "skipped **no-such-policy**" in md and "skipped **bogus**" in md
    assert "no-such-policy" in caplog.text and "bogus" in caplog.text


def test_matrix_loading_and_quick_shrink(matrix: Path) -> None:
    assert [g.name for g in load_matrix(matrix)] == ["sync-tiny", "async-full-only",
                                                     "ablation-tiny"]
    assert [g.name for g in load_matrix(matrix, only=["async-full-only"])] == ["async-full-only"]
    with pytest.raises(ConfigError, match="unknown group"):
        load_matrix(matrix, only=["nope"])
    g = load_group(matrix / "ablation-tiny.yaml")
    assert g.policy_of("split-mem") == ("verl-split", {"gpu_memory_utilization": 0.7})
    assert g.policy_of("verl-serial") == ("verl-serial", {})
    big = g.config.model_copy(update={"pipelines": [p.model_copy(update={"batch_size": 64})
                                                    for p in g.config.pipelines]})
    assert all(p.batch_size == QUICK_BATCH for p in quick_config(big).pipelines)


def test_bad_matrix_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("pipelines: []\n")
    with pytest.raises(ConfigError, match="bench"):
        load_group(tmp_path / "x.yaml")
    (tmp_path / "x.yaml").write_text("bench: {section: nope, policies: [verl]}\n")
    with pytest.raises(ConfigError, match="bad bench block"):
        load_group(tmp_path / "x.yaml")


def test_shipped_matrix_is_valid() -> None:
    groups = load_matrix(Path("configs/paper"))
    assert {g.section for g in groups} == {"sync", "hetero", "async", "scaling", "ablation"}
    assert any(g.quick for g in groups)
    asyn = [g for g in groups if g.section == "async"]
    assert all(p.mode == "async" and p.max_staleness == 1 for g in asyn
               for p in g.config.pipelines)
    assert {g.config.cluster.num_devices for g in groups if g.section == "scaling"} == {
        16, 32, 64}


def test_cli_bench_paper_quick(matrix: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    res = CliRunner().invoke(app, ["bench", "paper", "--quick", "--matrix", str(matrix),
                                   "--only", "sync-tiny", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "verl-split" in res.output and "skipped no-such-policy" in res.output
    assert "summary against the paper" in res.output
    assert "--only sync-tiny" in (out / REPORT_FILE).read_text()
    bad = CliRunner().invoke(app, ["bench", "paper", "--matrix", str(tmp_path / "none")])
    assert bad.exit_code == 2


def test_decision_stats() -> None:
    s = decision_stats([0.001 * i for i in range(1, 101)])
    assert s["p50_ms"] == pytest.approx(50.5) and s["max_ms"] == pytest.approx(100.0)
    assert s["p99_ms"] == pytest.approx(99.01)
    assert decision_stats([])["p99_ms"] is None


def test_decide_config_mixes_tasks() -> None:
    cfg = decide_config(64, 8)
    assert cfg.cluster.num_devices == 64 and len(cfg.pipelines) == 8
    assert {p.task for p in cfg.pipelines} == {"gsm8k", "math", "aime-tool", "search-r1"}
    assert decide_config(4, 1).cluster.num_devices == 4
    with pytest.raises(ConfigError):
        decide_config(12, 2)


def test_cli_bench_decide_prints_percentiles() -> None:
    res = CliRunner().invoke(app, ["bench", "decide", "--policy", "verl-split", "--devices", "8",
                                   "--pipelines", "2", "--steps", "1"])
    assert res.exit_code == 0, res.output
    for col in ("decisions", "p50 ms", "p90 ms", "p99 ms", "max ms"):
        assert col in res.output
    bad = CliRunner().invoke(app, ["bench", "decide", "--policy", "nope", "--devices", "8"])
    assert bad.exit_code == 2


def test_bench_decide_reports_the_work_left_off_the_decision_path() -> None:
    """jigsaw's replans (a pipeline finishes: the others' widths are replanned) run as
    background work, timed apart from the decisions; a policy without any reports none."""
    s = bench_decide("jigsaw", 16, 4, steps=2, params={"fallback": False})
    assert s.background_count > 0 and s.count > 0
    assert s.background_max_ms is not None and s.background_max_ms >= s.background_p50_ms > 0
    v = bench_decide("verl-split", 8, 2, steps=1)
    assert v.background_count == 0 and v.background_p99_ms is None


def test_sensitivity_reruns_headline_ratios_under_each_assumption(tmp_path: Path) -> None:
    """The lead ÷ verl ratio is re-measured with costly co-location and with offload on; each
    changed assumption really reaches the simulation (offload makes every policy slower)."""
    folder = tmp_path / "m"
    folder.mkdir()
    _write(folder, "sync-s", "  section: sync\n  quick: true\n  lead: jigsaw\n"
           "  baseline: verl\n  policies: [verl, jigsaw]")
    out = tmp_path / "out"
    run = run_paper(folder, quick=True, seeds=1, out_dir=out)
    g = run.groups[0]
    assert set(g.sensitivity) == {"s_sat 0.8", "offload on"}
    assert all(set(per) == {"verl"} and per["verl"] > 0 for per in g.sensitivity.values())
    md = (out / REPORT_FILE).read_text()
    assert "## Sensitivity" in md and "| sync-s | verl |" in md
    none = run_paper(folder, quick=True, seeds=1, sensitivity=False)
    assert none.groups[0].sensitivity == {}


def test_cost_assumptions_and_offload_reach_the_cost_model() -> None:
    from jigsawrl.config import validate_config
    from jigsawrl.experiments.resolve import resolve
    from jigsawrl.experiments.simulated import cost_assumptions, make_cost

    raw = {"cluster": {"accelerator": "h100-80gb", "num_nodes": 1, "accelerators_per_node": 4},
           "pipelines": [{"name": "a", "model": "qwen3-4b", "task": "gsm8k",
                          "train": {"param_offload": True}}]}
    exp = resolve(validate_config(raw))
    assert make_cost(exp).params.s_sat == pytest.approx(0.4)
    with cost_assumptions(s_sat=0.8):
        assert make_cost(exp).params.s_sat == pytest.approx(0.8)
    assert make_cost(exp).deployment.param_offload
    with pytest.raises(ConfigError, match="unknown cost-model constant"), \
            cost_assumptions(no_such=1.0):
        pass
    raw["pipelines"].append({"name": "b", "model": "qwen3-4b", "task": "gsm8k"})
    with pytest.raises(ConfigError, match="differ in train.param_offload"):
        make_cost(resolve(validate_config(raw)))
