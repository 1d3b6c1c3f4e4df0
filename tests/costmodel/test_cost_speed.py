"""costmodel/speed.py: a profiled machine scaled to the speed a run's probe measured."""

from __future__ import annotations

import dataclasses

import pytest

from jigsawrl.costmodel import CostModel
from jigsawrl.costmodel.cpu import cpu_worker_params
from jigsawrl.costmodel.profile import profile_probe_s
from jigsawrl.costmodel.roofline import CostParams
from jigsawrl.costmodel.speed import (
    ACCEL_RATES,
    MACHINE_RATES,
    MACHINE_TIMES,
    NOT_MACHINE_TIMES,
    slower,
)
from jigsawrl.errors import InputError
from jigsawrl.workload.models import MODELS
from jigsawrl.workload.realpresets import CPU_ACCELERATOR


def test_every_time_and_rate_of_the_cost_params_is_classified() -> None:
    """A new ``*_s`` or ``*_per_s`` field must say whether it is the machine's speed."""
    for f in dataclasses.fields(CostParams):
        if f.name.endswith("_per_s"):
            assert f.name in MACHINE_RATES, f.name
        elif f.name.endswith("_s") or "_s_" in f.name:
            assert f.name in MACHINE_TIMES + NOT_MACHINE_TIMES, f.name
    names = {f.name for f in dataclasses.fields(CostParams)}
    assert set(MACHINE_TIMES + MACHINE_RATES + NOT_MACHINE_TIMES) <= names


def test_slower_scales_times_up_and_rates_down_and_keeps_settings() -> None:
    params = dataclasses.replace(cpu_worker_params(), serial_slice_s=0.25, stage_gap_s=0.01)
    accel, scaled = slower(CPU_ACCELERATOR, params, 2.0)
    for key in ACCEL_RATES:
        assert getattr(accel, key) == pytest.approx(getattr(CPU_ACCELERATOR, key) / 2)
    assert scaled.stage_gap_s == pytest.approx(0.02)
    assert scaled.offload_bytes_per_s == pytest.approx(params.offload_bytes_per_s / 2)
    assert scaled.serial_slice_s == 0.25  # the executor's time slice, not the machine's speed
    assert scaled.train_eff == params.train_eff
    assert accel.hbm_bytes == CPU_ACCELERATOR.hbm_bytes


def test_a_twice_slower_machine_takes_twice_as_long_for_every_stage() -> None:
    params = cpu_worker_params()
    base = CostModel(CPU_ACCELERATOR, params=params)
    accel, scaled = slower(CPU_ACCELERATOR, params, 2.0)
    slow = CostModel(accel, params=scaled)
    model = MODELS["qwen2.5-0.5b"]
    for stage in ("train_time_s", "logprob_time_s"):
        assert getattr(slow, stage)(model, 2, 4096) == pytest.approx(
            2 * getattr(base, stage)(model, 2, 4096), rel=1e-6)
    assert slow.weight_sync_time_s(model, 2) == pytest.approx(
        2 * base.weight_sync_time_s(model, 2), rel=1e-6)
    assert slow.prefill_time_s(model, 1, 512) == pytest.approx(
        2 * base.prefill_time_s(model, 1, 512), rel=1e-6)
    assert slow.reward_time_s(64) == pytest.approx(2 * base.reward_time_s(64), rel=1e-6)


@pytest.mark.parametrize("factor", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_factor_is_refused(factor: float) -> None:
    with pytest.raises(ValueError, match="speed factor"):
        slower(CPU_ACCELERATOR, cpu_worker_params(), factor)


def test_profile_probe_is_read_or_absent_and_a_bad_one_is_an_input_error() -> None:
    assert profile_probe_s({"machine": {"speed_probe_s": 0.05}}) == 0.05
    assert profile_probe_s({"machine": {}}) is None
    assert profile_probe_s({}) is None
    for bad in (0, -1.0, "fast", True):
        with pytest.raises(InputError, match="speed_probe_s"):
            profile_probe_s({"machine": {"speed_probe_s": bad}}, where="p.yaml")
