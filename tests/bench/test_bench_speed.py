"""bench sim-speed: its options and what it reports (never how fast: tests check behaviour)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jigsawrl.bench.speed import parse_params, sim_scaling, sim_speed
from jigsawrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_sim_speed_takes_policy_steps_and_params() -> None:
    res = sim_speed(ROOT / "configs/two-gsm8k.yaml", repeats=1, policy="jigsaw", steps=1,
                    params={"fallback": False})
    assert res["policy"] == "jigsaw"
    assert (res["devices"], res["pipelines"], res["steps"]) == (8, 2, 2)
    assert res["events"] > 0 and res["decisions"] > 0 and res["makespan_s"] > 0
    assert res["best_s"] <= res["median_s"]


def test_sim_scaling_rows_grow_with_the_pool() -> None:
    rows = sim_scaling("verl-split", sizes=((16, 1), (32, 2)), steps=1)
    assert [(r["devices"], r["pipelines"]) for r in rows] == [(16, 1), (32, 2)]
    assert rows[1]["events"] > rows[0]["events"]
    assert all(r["ms_per_device_step"] > 0 for r in rows)


def test_params_are_key_value_yaml() -> None:
    assert parse_params(["fallback=false", "depth=0"]) == {"fallback": False, "depth": 0}
    with pytest.raises(ConfigError):
        parse_params(["fallback"])
    with pytest.raises(ConfigError):
        sim_speed(ROOT / "configs/two-gsm8k.yaml", repeats=1, policy="jigsaw", steps=1,
                  params={"bogus": 1})
