"""``jigsawrl bench fidelity``: the anchors, fidelity.json, and that leave-one-out leaves one out.

One run of the bench over ``anchors/`` (one step per anchor, noise off: ~10 s of CPU) is shared
by the tests of this module.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jigsawrl.bench import fidelity
from jigsawrl.bench.fidelity import (
    FidelityResult,
    load_anchor,
    load_anchors,
    run_fidelity,
    write_fidelity,
)
from jigsawrl.costmodel import CostParams
from jigsawrl.costmodel.anchor_fit import FITTED_KEYS, NEUTRAL_START, fit_constants
from jigsawrl.errors import InputError
from jigsawrl.workload.task_presets import capped_lognormal_mean, clip_ratio

ANCHORS = Path(__file__).resolve().parents[2] / "anchors"
PER_STAGE = {"lab", "A", "B", "D", "H"}
STEP_LEVEL = {"E", "F"}


@pytest.fixture(scope="module")
def result() -> FidelityResult:
    return run_fidelity(load_anchors(ANCHORS), steps=1, in_sample_too=False)


def test_every_anchor_of_the_reference_is_a_file() -> None:
    anchors = {a.name: a for a in load_anchors(ANCHORS)}
    assert set(anchors) == PER_STAGE | STEP_LEVEL
    for a in anchors.values():
        assert a.source.startswith("reference/gpu-anchors.md")
        assert all(f["setting"] and f["reason"] for f in a.fixed)
        assert a.config.scheduler.name.startswith("verl")
        if a.per_stage:
            assert {"gen", "old_log_prob", "update_actor", "step"} <= set(a.published)
        else:
            assert set(a.published) == {"step", "throughput"}
    assert {"values", "update_critic"} <= set(anchors["B"].published)  # PPO's critic


def test_anchor_lengths_reproduce_the_published_statistics() -> None:
    for a in load_anchors(ANCHORS):
        if a.lengths is None:
            continue
        median, sigma = a.lengths["response_median"], a.lengths["response_sigma"]
        cap = a.config.pipelines[0].max_response_tokens
        stats = a.lengths["published"]
        if "median" in stats:
            assert median == pytest.approx(stats["median"], rel=0.01)
        if "mean" in stats:
            assert capped_lognormal_mean(median, sigma, cap) == pytest.approx(stats["mean"],
                                                                              rel=0.01)
        if "clip" in stats:
            assert clip_ratio(median, sigma, cap) == pytest.approx(stats["clip"], rel=0.05)


def test_a_bad_anchor_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("name: x\nkind: per-stage\nsource: s\npublished: {step: 1}\nconfig: {}\n")
    with pytest.raises(InputError, match="missing keys: fixed"):
        load_anchor(bad)
    with pytest.raises(InputError, match="no anchor files"):
        load_anchors(tmp_path / "empty")


def test_fidelity_json_has_the_schema(result: FidelityResult, tmp_path: Path) -> None:
    doc = json.loads(write_fidelity(result, tmp_path).read_text())
    assert {a["name"] for a in doc["anchors"]} == PER_STAGE | STEP_LEVEL
    errors = []
    for a in doc["anchors"]:
        assert a["source"] and a["stages"]
        for v in a["stages"].values():
            assert v["published"] > 0 and v["predicted"] > 0
            assert v["log_ratio"] == pytest.approx(math.log(v["predicted"] / v["published"]))
            errors.append(abs(v["log_ratio"]))
    assert doc["median_abs_log_ratio"] == pytest.approx(sorted(errors)[len(errors) // 2],
                                                        abs=max(errors))
    assert doc["max_abs_log_ratio"] == pytest.approx(max(errors))
    assert set(doc["fitted"]) == set(FITTED_KEYS)
    for f in doc["fitted"].values():
        assert set(f) == {"value", "from"} and set(f["from"]) <= PER_STAGE
    # what misses the target is recorded, by how much and where
    assert doc["met"] == (not doc["misses"])
    if doc["max_abs_log_ratio"] > math.log(2):
        assert any("ln 2" in m and "/" in m for m in doc["misses"])


def test_the_defaults_are_the_fit_on_all_anchors(result: FidelityResult) -> None:
    assert result.defaults_match(), {k: (f.value, result.defaults[k])
                                     for k, f in result.fitted.items()}


def test_step_level_anchors_inform_no_fit(result: FidelityResult) -> None:
    for constants in result.loo.values():
        for f in constants.values():
            assert not set(f.sources) & STEP_LEVEL


def test_leave_one_out_leaves_the_anchor_out(result: FidelityResult) -> None:
    """Perturbing one anchor's published times changes the constants the *others* are predicted
    with, never the ones it is predicted with (and so not its own prediction)."""
    base = CostParams()
    for name, key, other in (("D", "old_log_prob", "lab"), ("A", "gen", "H")):
        perturbed = [dataclasses.replace(p, published={**p.published,
                                                       key: 3.0 * p.published[key]})
                     if p.name == name else p for p in result.probes]
        without = [p for p in perturbed if p.name != name]
        assert fit_constants(without, base) == result.loo[name]  # what `name` is predicted with
        others = [p for p in perturbed if p.name != other]
        moved = fit_constants(others, base)
        assert moved != result.loo[other]
        assert all(name in f.sources for k, f in moved.items()
                   if f.value != result.loo[other][k].value)


def test_the_fit_does_not_start_from_the_defaults(result: FidelityResult) -> None:
    """CostParams' fitted defaults are the all-anchor fit; a fit must not read them (a
    leave-one-out fit starting there would see the held-out anchor)."""
    shifted = dataclasses.replace(
        CostParams(), kv_bw_eff=0.3, train_mfu_at_1b=0.3, train_mfu_exponent=0.1,
        logprob_mfu_ratio=3.0, offload_bytes_per_s=1e9, eager_iter_overhead_s_per_layer=0.01,
        reward_s_per_sample=1.0)
    assert set(NEUTRAL_START) == set(FITTED_KEYS)
    probes = [p for p in result.probes if p.name != "B"]
    a, b = fit_constants(probes, CostParams()), fit_constants(probes, shifted)
    for key in FITTED_KEYS:
        assert a[key].value == pytest.approx(b[key].value, rel=1e-9), key


def test_cli_prints_the_table_and_writes_the_json(result: FidelityResult, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from jigsawrl.cli.main import app

    monkeypatch.setattr(fidelity, "run_fidelity", lambda anchors, steps=None: result)
    out = CliRunner().invoke(app, ["bench", "fidelity", "--anchors", str(ANCHORS),
                                   "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "leave-one-out" in out.output and "update_actor" in out.output
    doc = json.loads((tmp_path / "fidelity.json").read_text())
    assert doc["command"].startswith("jigsawrl bench fidelity") and doc["commit"]
    assert doc["machine"]["cpu"]
