"""Devices that run one call at a time (sim/gates.py, sim/rollout_gates.py)."""

from __future__ import annotations

import dataclasses

import pytest

from jigsawrl.costmodel import CostModel
from jigsawrl.costmodel.cpu import CPU_WORKER_SLICE_S, cpu_worker_params
from jigsawrl.events import Span
from jigsawrl.sim.cluster import SimCluster
from jigsawrl.sim.gates import DeviceGates
from jigsawrl.sim.kernel import EventQueue
from jigsawrl.sim.rollout_task import DONE_BAND
from jigsawrl.stages import Stage
from jigsawrl.workload.requests import RequestTruth, TurnTruth
from tests.sim.test_sim_parts import Recorder, experiment


def run(q: EventQueue) -> None:
    while (e := q.pop()) is not None:
        handler, *args = e.payload
        handler(*args)


def test_gates_are_first_come_first_served_and_never_deadlock() -> None:
    q = EventQueue()
    gates = DeviceGates(q, 2, 0.2)
    granted: list[str] = []
    gates.request("a", (0,), lambda: granted.append("a"))
    gates.request("ab", (1, 0), lambda: granted.append("ab"))  # in device order: waits for 0
    gates.request("b", (1,), lambda: granted.append("b"))  # 1 is free: granted
    gates.request("c", (0, 1), lambda: granted.append("c"))  # behind ab on device 0
    run(q)
    assert granted == ["a", "b"] and gates.holds("a") and not gates.holds("ab")
    assert gates.waited_on("a") and not gates.waited_on("b")
    gates.release("a")  # ab takes 0, then waits for 1
    run(q)
    assert granted == ["a", "b"] and gates.waited_on("b")
    gates.release("b")
    run(q)
    assert granted == ["a", "b", "ab"] and gates.claimed("c") and not gates.holds("c")
    gates.release("ab")
    run(q)
    assert granted == ["a", "b", "ab", "c"]
    gates.release("c")
    gates.request("d", (), lambda: granted.append("d"))  # no device: granted at once
    run(q)
    assert granted[-1] == "d"


def test_the_cpu_worker_slice_is_the_ray_executors() -> None:
    pytest.importorskip("ray")
    from jigsawrl.executors.raycluster.records import CHUNK_S

    assert CPU_WORKER_SLICE_S == CHUNK_S == cpu_worker_params().serial_slice_s


def serial_cost(exp, slice_s: float):  # noqa: ANN001, ANN201
    from tests.sim.test_sim_residency import pool_cost

    base = pool_cost(exp.accelerator)
    return CostModel(exp.accelerator, noise_sigma=0.0, params=dataclasses.replace(
        base.params, state_onload_s=0.0, state_offload_s=0.0, serial_slice_s=slice_s))


def test_a_pass_queued_behind_another_waits_for_it_whole() -> None:
    exp = experiment()
    pipe = exp.pipelines[0]
    spans = {}
    for slice_s in (0.0, 0.2):
        sim = SimCluster(exp.num_devices, serial_cost(exp, slice_s), Recorder())
        sim.rollouts.step_lens.update({("p0", 0): (400,) * 4, ("p0", 1): (400,) * 4})
        sim.start_work("p0/0/actor_update", pipe, 0, Stage.ACTOR_UPDATE, (0,), 0.5)
        sim.start_work("p0/1/old_logprob", pipe, 1, Stage.OLD_LOGPROB, (0,), 0.5)
        while sim.step():
            pass
        spans[slice_s] = {e.stage: e for e in sim.drain_events() if isinstance(e, Span)}
    upd, lp = spans[0.2][Stage.ACTOR_UPDATE], spans[0.2][Stage.OLD_LOGPROB]
    # one at a time, each at the whole device: the log-prob starts when the update ends
    assert lp.start_s == pytest.approx(upd.end_s)
    assert upd.start_s == 0.0 and upd.compute_share == 0.5  # the scheduler's share, recorded
    shared = spans[0.0]
    assert upd.end_s < shared[Stage.ACTOR_UPDATE].end_s  # alone on the device: faster
    assert lp.end_s == pytest.approx(upd.end_s + (shared[Stage.OLD_LOGPROB].end_s
                                                  - shared[Stage.OLD_LOGPROB].start_s) / 2,
                                     rel=1e-6)


def test_a_rank_yields_its_device_at_the_end_of_a_slice() -> None:
    """A long rollout rank and a pass on one device: the pass starts at the rank's next slice
    end, the rank stops while it runs and goes on after, and every request finishes."""
    exp = experiment()
    pipe = exp.pipelines[0]
    rec = Recorder()
    sim = SimCluster(exp.num_devices, serial_cost(exp, 0.2), rec)
    sim.rollouts.step_lens[("p0", 0)] = (400,) * 4
    long = [RequestTruth("p0/1/0", 10, (TurnTruth(3000),))]
    sim.start_rollout("p0/1/rollout", pipe, 1, (0,), 1, 0.5, 10_000_000_000, [long])
    sim.step()
    t0 = sim.now_s
    sim.start_work("p0/0/actor_update", pipe, 0, Stage.ACTOR_UPDATE, (0,), 0.5)
    while sim.step():
        pass
    spans = [e for e in sim.drain_events() if isinstance(e, Span)]
    upd = next(e for e in spans if e.stage == Stage.ACTOR_UPDATE)
    gen = sorted((e for e in spans if e.pipeline == "p0" and e.step == 1),
                 key=lambda e: e.start_s)
    assert upd.start_s == pytest.approx(0.2, abs=0.02) and upd.start_s >= t0
    before = [e for e in gen if e.end_s <= upd.start_s + 1e-9]
    after = [e for e in gen if e.start_s >= upd.end_s - 1e-9]
    assert before and after and len(before) + len(after) == len(gen)  # nothing overlaps
    assert rec.progress[-1][2:4] == (0, DONE_BAND)  # the request finished


def test_each_slice_and_each_resume_after_tools_is_a_call_that_waits_the_gap() -> None:
    """On serial devices a rank's every slice after the first, and every resume after tool
    waits, is a call of its own on the executor: each waits one stage gap."""
    exp = experiment()
    pipe = exp.pipelines[0]
    gap = 0.01

    def end(reqs: list[RequestTruth], g: float) -> tuple[float, int]:
        cost = serial_cost(exp, 0.2)
        cost = CostModel(exp.accelerator, noise_sigma=0.0, params=dataclasses.replace(
            cost.params, stage_gap_s=g))
        rec = Recorder()
        sim = SimCluster(exp.num_devices, cost, rec)
        sim.start_rollout("p0/0/rollout", pipe, 0, (0,), 1, 1.0, 10_000_000_000, [reqs])
        while sim.step():
            pass
        return rec.progress[-1][4], len([e for e in sim.drain_events() if isinstance(e, Span)])

    long = [RequestTruth("p0/0/0", 10, (TurnTruth(3000),))]
    plain, _ = end(long, 0.0)
    gapped, _ = end(long, gap)
    slices = int(plain / 0.2)  # slice ends the plain run crosses (at least)
    assert slices >= 3
    # the first call's gap, and one per later slice (the gaps stretch the run: a few more)
    assert gap * (1 + slices) - 1e-9 <= gapped - plain <= gap * (2 + gapped / 0.2) + 1e-9
    # a multi-turn request: each tool wait ends in a resume, a call of its own
    tools = [RequestTruth("p0/0/0", 10, tuple(TurnTruth(5, tool_latency_s=0.5,
                                                         tool_result_tokens=4)
                                               for _ in range(3)) + (TurnTruth(5),))]
    plain, _ = end(tools, 0.0)
    gapped, _ = end(tools, gap)
    assert gapped - plain == pytest.approx(gap * (1 + 3))  # the first call and three resumes
