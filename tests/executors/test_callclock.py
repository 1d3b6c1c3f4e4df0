"""executors/raycluster/callclock.py: where a worker call's wall time went."""

from __future__ import annotations

import gc
import time

import pytest

from jigsawrl.executors.raycluster.callclock import CallClock, Clocks


def test_a_clock_counts_cpu_and_garbage_collection_but_not_sleep() -> None:
    clock = CallClock().start()
    time.sleep(0.1)  # waiting: no CPU
    t0 = time.process_time()
    while time.process_time() - t0 < 0.02:  # busy: CPU
        pass
    clock.stop()
    assert 0.015 <= clock.cpu_s < 0.08 and clock.gc_s < 0.08
    collected = CallClock().start()
    gc.collect()
    collected.stop()
    assert collected.gc_s > 0.0
    assert collected.as_tuple() == (collected.cpu_s, collected.gc_s, 0.0, 0.0, 0.0)


def test_clocks_sum_per_pipeline_and_stage() -> None:
    clocks = Clocks()
    clocks.add("a", "old_logprob", 1.0, (0.5, 0.1, 0.8))
    clocks.add("a", "old_logprob", 1.0, (0.7, 0.0, 0.9))
    clocks.add("b", "actor_update", 2.0, (2.0, 0.0, 1.9))
    out = clocks.to_json()
    lp = out["a"]["old_logprob"]
    assert lp["calls"] == 2 and lp["wall_s"] == 2.0 and lp["pass_s"] == pytest.approx(1.7)
    assert lp["cpu_fraction"] == pytest.approx(0.6)
    assert out["b"]["actor_update"]["cpu_fraction"] == 1.0
    assert lp["onload_s"] == 0.0 and lp["build_s"] == 0.0  # older, shorter readings


def test_clocks_sum_the_onload_and_the_batch_build_apart_from_the_pass() -> None:
    clocks = Clocks()
    clocks.add("a", "old_logprob", 1.0, (0.9, 0.0, 0.6, 0.25, 0.1))
    clocks.add("a", "old_logprob", 0.5, (0.5, 0.0, 0.4, 0.0, 0.05))
    lp = clocks.to_json()["a"]["old_logprob"]
    assert lp["pass_s"] == pytest.approx(1.0) and lp["onload_s"] == pytest.approx(0.25)
    assert lp["build_s"] == pytest.approx(0.15) and lp["calls"] == 2
