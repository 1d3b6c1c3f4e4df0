"""A CPU host's cores shared by its busy devices and the rest of a run (sim/hostload.py)."""

from __future__ import annotations

import dataclasses

import pytest

from jigsawrl.costmodel import CostModel
from jigsawrl.events import Span
from jigsawrl.sim.cluster import SimCluster
from jigsawrl.sim.hostload import HostLoad
from jigsawrl.stages import Stage
from jigsawrl.workload.requests import RequestTruth, TurnTruth
from tests.sim.test_sim_gates import serial_cost
from tests.sim.test_sim_parts import Recorder, experiment


def host_cost(exp, slots: float, load: float, per_node: int = 2) -> CostModel:  # noqa: ANN001
    base = serial_cost(exp, 0.2)
    return CostModel(exp.accelerator, noise_sigma=0.0, params=dataclasses.replace(
        base.params, host_slots=slots, host_load_slots=load, devices_per_node=per_node))


def test_the_factor_counts_a_nodes_busy_devices_and_the_load_beside_them() -> None:
    exp = experiment()
    host = HostLoad(4, host_cost(exp, 2.0, 0.5))
    assert host.on and host.factor((0,)) == 1.0
    host.set_busy(0, True)
    assert host.factor((0,)) == 1.0  # (1 + 0.5) / 2 < 1: the device has its core
    host.set_busy(1, True)
    assert host.factor((0,)) == pytest.approx(1.25) and host.factor((1,)) == pytest.approx(1.25)
    assert host.factor((2,)) == 1.0  # the other node is idle
    assert host.factor((1, 2)) == pytest.approx(1.25)  # the busiest of its nodes
    assert host.take_touched() == {0} and host.take_touched() == set()
    host.set_busy(1, True)  # no change: nothing touched
    assert host.take_touched() == set()
    host.set_busy(3, True)
    assert host.take_touched() == {1}


def test_no_host_slots_is_no_slowdown() -> None:
    exp = experiment()
    host = HostLoad(2, host_cost(exp, 0.0, 0.5))
    host.set_busy(0, True)
    host.set_busy(1, True)
    assert not host.on and host.factor((0, 1)) == 1.0 and host.take_touched() == set()


def pass_spans(slots: float, load: float, stagger: bool) -> dict[int, Span]:
    """Two equal updates on devices 0 and 1 (the second a third of the way into the first
    when ``stagger``), by device."""
    exp = experiment()
    pipe = exp.pipelines[0]
    sim = SimCluster(exp.num_devices, host_cost(exp, slots, load), Recorder())
    for step in (0, 1):
        sim.rollouts.step_lens[("p0", step)] = (400,) * 4
    sim.start_work("p0/0/actor_update", pipe, 0, Stage.ACTOR_UPDATE, (0,), 1.0)
    if stagger:
        alone = pass_spans(0.0, 0.0, False)[0]
        sim.q.schedule(alone.end_s / 3, (sim.start_work, "p0/1/actor_update", pipe, 1,
                                         Stage.ACTOR_UPDATE, (1,), 1.0), 0)
    else:
        sim.start_work("p0/1/actor_update", pipe, 1, Stage.ACTOR_UPDATE, (1,), 1.0)
    while sim.step():
        pass
    return {e.devices[0]: e for e in sim.drain_events() if isinstance(e, Span)}


def test_passes_on_both_devices_of_a_node_run_slower_by_the_factor() -> None:
    alone = pass_spans(0.0, 0.0, False)[0].end_s
    both = pass_spans(2.0, 0.5, False)
    for span in both.values():
        assert span.end_s - span.start_s == pytest.approx(1.25 * alone, rel=1e-9)


def test_a_pass_is_retimed_when_its_neighbour_starts_and_ends() -> None:
    """The first update runs alone for a third, slower beside the second, and the second's
    rest alone again at full speed: each one's work is conserved."""
    alone = pass_spans(0.0, 0.0, False)[0].end_s
    spans = pass_spans(2.0, 0.5, True)
    first, second = spans[0], spans[1]
    # the first: 1/3 alone, then 2/3 of its work at 1/1.25 of the speed
    assert first.end_s == pytest.approx(alone / 3 + 1.25 * 2 * alone / 3, rel=1e-9)
    # the second: from alone/3 to the first's end at the slow speed, the rest at full speed
    done = (first.end_s - alone / 3) / 1.25
    assert second.end_s == pytest.approx(first.end_s + (alone - done), rel=1e-9)


def test_a_decode_is_retimed_while_a_pass_runs_on_the_other_device() -> None:
    exp = experiment()
    pipe = exp.pipelines[0]
    ends = {}
    for slots in (0.0, 2.0):
        sim = SimCluster(exp.num_devices, host_cost(exp, slots, 1.0), Recorder())
        sim.rollouts.step_lens[("p0", 0)] = (400,) * 4
        reqs = [RequestTruth("p0/1/0", 10, (TurnTruth(2000),))]
        sim.start_rollout("p0/1/rollout", pipe, 1, (0,), 1, 1.0, 10_000_000_000, [reqs])
        sim.start_work("p0/0/actor_update", pipe, 0, Stage.ACTOR_UPDATE, (1,), 1.0)
        while sim.step():
            pass
        spans = [e for e in sim.drain_events() if isinstance(e, Span)]
        upd = next(e for e in spans if e.stage == Stage.ACTOR_UPDATE)
        gen_end = max(e.end_s for e in spans if e.step == 1)
        ends[slots] = (upd.end_s, gen_end)
    (upd0, gen0), (upd1, gen1) = ends[0.0], ends[2.0]
    assert gen0 > upd1 / 1.5  # the rollout outlasts the update: both compute until it ends
    assert upd1 == pytest.approx(1.5 * upd0, rel=1e-9)  # (2 + 1) / 2 slower throughout
    # the rollout: 1.5x slower (its running segment re-timed) until the update ends, then
    # its rest at full speed
    assert gen1 == pytest.approx(upd1 + gen0 - upd1 / 1.5, rel=1e-6)
