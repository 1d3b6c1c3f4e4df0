"""`jigsawrl bench trl`: repeats over seeds, per-stage times, the TRL side when it imports."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from jigsawrl.bench.trl import BenchTrlSpec, run_bench_trl_repeats, trl_available  # noqa: E402

TINY = BenchTrlSpec(batch_size=4, group_size=2, steps=2, warmup_steps=2)


def test_repeats_run_one_seed_each_and_summarise(tmp_path: Path) -> None:
    seen: list[int] = []
    out = run_bench_trl_repeats(TINY, 2, cache_dir=tmp_path, on_run=lambda r, _: seen.append(r))
    assert seen == [0, 1]
    assert [run["spec"]["seed"] for run in out["runs"]] == [0, 1]
    mine = out["jigsawrl"]
    assert mine["samples_per_s"]["min"] <= mine["samples_per_s"]["median"] \
        <= mine["samples_per_s"]["max"]
    stages = out["runs"][0]["jigsawrl"]["stage_s_per_step"]
    assert set(stages) == {"gen", "reward", "log_probs", "update"}
    assert stages["update"] > 0 and stages["gen"] > 0
    assert stages["log_probs"] < 1e-3  # TRL's setting: no separate old-log-prob pass
    ok, why = trl_available()
    if ok:
        assert out["speedup"]["min"] > 0
        assert set(out["runs"][0]["trl"]["stage_s_per_step"]) == {"gen+reward", "update"}
    else:
        assert "pip install" in out["runs"][0]["trl"]["error"] and "speedup" not in out
