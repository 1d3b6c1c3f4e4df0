"""A profiled pool of Ray workers in the simulator: train states move where the executor moves
them, at the profile's cost, and a rollout rank pays its worker's set-up in its first slice."""

from __future__ import annotations

import dataclasses

import pytest

from jigsawrl.costmodel import CostModel
from jigsawrl.costmodel.roofline import CostParams
from jigsawrl.events import Span
from jigsawrl.sim.cluster import SimCluster
from jigsawrl.sim.residency import WorkerResidency, moves_modelled
from jigsawrl.stages import Stage
from tests.sim.test_sim_parts import Recorder, experiment

ONLOAD, OFFLOAD = 0.04, 0.01


def pool_cost(accel):  # noqa: ANN001, ANN201
    return CostModel(accel, params=CostParams(state_onload_s=ONLOAD, state_offload_s=OFFLOAD),
                     noise_sigma=0.0)


def test_moves_follow_the_executors_rules() -> None:
    exp = experiment()
    cost = pool_cost(exp.accelerator)
    model = exp.pipelines[0].model
    r = WorkerResidency(cost)
    by_bytes = cost.host_transfer_time_s(cost.train_state_bytes(model, 1), 1)
    on, off = ONLOAD + by_bytes, OFFLOAD + by_bytes
    # a pass on two devices onloads from host memory onto the first, once
    assert r.move_s("p", model, Stage.OLD_LOGPROB, (0, 1)) == pytest.approx(on)
    assert r.move_s("p", model, Stage.ACTOR_UPDATE, (1, 0)) == 0.0  # runs where the state is
    # a pass elsewhere moves it through host memory: offload, then onload
    assert r.move_s("p", model, Stage.ACTOR_UPDATE, (1,)) == pytest.approx(off + on)
    assert r.move_s("p", model, Stage.REWARD, (1,)) is None
    # the scheduler's own moves: an onload of a state on a device does nothing
    assert r.move_s("p", model, Stage.ONLOAD, (0,)) == 0.0
    assert r.move_s("p", model, Stage.OFFLOAD, ()) == pytest.approx(off)
    assert r.move_s("p", model, Stage.OFFLOAD, ()) == 0.0  # already in host memory
    # an onload goes to the listed device holding the fewest states
    assert r.move_s("q", model, Stage.ONLOAD, (0, 1)) == pytest.approx(on)
    assert r.move_s("p", model, Stage.ONLOAD, (0, 1)) == pytest.approx(on)
    assert r.loc == {"p": 1, "q": 0}


def test_only_a_profiled_worker_pool_moves_states() -> None:
    exp = experiment()
    assert not moves_modelled(CostModel(exp.accelerator, noise_sigma=0.0))  # the GPU presets
    assert moves_modelled(pool_cost(exp.accelerator))


def test_a_first_pass_pays_its_onload_in_the_simulator() -> None:
    exp = experiment()
    pipe = exp.pipelines[0]
    cost = pool_cost(exp.accelerator)
    plain = CostModel(exp.accelerator, noise_sigma=0.0, params=dataclasses.replace(
        cost.params, state_onload_s=0.0, state_offload_s=0.0))

    def pass_times(c: CostModel) -> list[float]:
        sim = SimCluster(exp.num_devices, c, Recorder())
        sim.rollouts.step_lens.update({("p0", 0): (100,) * 4, ("p0", 1): (100,) * 4})
        out = []
        for step in (0, 1):
            sim.start_work(f"p0/{step}/old_logprob", pipe, step, Stage.OLD_LOGPROB, (0,), 1.0)
            while sim.step():
                pass
            out += [e.end_s - e.start_s for e in sim.drain_events() if isinstance(e, Span)]
        return out

    first, second = pass_times(cost)
    base_first, base_second = pass_times(plain)
    by_bytes = cost.host_transfer_time_s(cost.train_state_bytes(pipe.model, 1), 1)
    assert first - base_first == pytest.approx(ONLOAD + by_bytes)
    assert second == pytest.approx(base_second)  # the state stayed on device 0


def test_each_rank_pays_its_setup_once() -> None:
    from tests.sim.test_sim_parts import reqs

    exp = experiment()
    pipe = exp.pipelines[0]
    ends = []
    for setup in (0.0, 0.02):
        cost = CostModel(exp.accelerator, noise_sigma=0.0,
                         params=CostParams(rollout_setup_s=setup))
        rec = Recorder()
        sim = SimCluster(exp.num_devices, cost, rec)
        sim.start_rollout("p0/0/rollout", pipe, 0, (0, 1), 1, 1.0, 1e10, [reqs(30), reqs(50)])
        while sim.step():
            pass
        ends.append([t for (_, _, left, _, t) in rec.progress if left == 0])
    # both ranks end exactly one set-up later: paid once each, in its first segment
    assert [b - a for a, b in zip(ends[0], ends[1], strict=True)] == [pytest.approx(0.02)] * 2


def test_every_stage_and_rank_waits_the_stage_gap_once() -> None:
    from tests.sim.test_sim_parts import reqs

    exp = experiment()
    pipe = exp.pipelines[0]
    gap = 0.007
    spans, ends = [], []
    for g in (0.0, gap):
        cost = CostModel(exp.accelerator, noise_sigma=0.0, params=CostParams(stage_gap_s=g))
        rec = Recorder()
        sim = SimCluster(exp.num_devices, cost, rec)
        sim.rollouts.step_lens.update({("p0", 0): (100,) * 4})
        sim.start_rollout("p0/0/rollout", pipe, 0, (0, 1), 1, 1.0, 1e10, [reqs(30), reqs(50)])
        sim.start_work("p0/0/reward", pipe, 0, Stage.REWARD, (), 0.0)
        sim.start_work("p0/0/old_logprob", pipe, 0, Stage.OLD_LOGPROB, (0,), 1.0)
        while sim.step():
            pass
        ends.append([t for (_, _, left, _, t) in rec.progress if left == 0])
        spans.append({e.stage: e.end_s - e.start_s for e in sim.drain_events()
                      if isinstance(e, Span) and e.stage in (Stage.REWARD, Stage.OLD_LOGPROB)})
    assert [b - a for a, b in zip(ends[0], ends[1], strict=True)] == [pytest.approx(gap)] * 2
    assert {k: spans[1][k] - v for k, v in spans[0].items()} == {
        Stage.REWARD: pytest.approx(gap), Stage.OLD_LOGPROB: pytest.approx(gap)}


def test_a_weight_sync_measured_whole_costs_that_and_nothing_beside_it() -> None:
    """``weight_sync_s`` (the profile's probe timed the executor's publish, call and wait
    included) replaces the trainer -> engine model: no gather, no worker-link move, no gap."""
    exp = experiment()
    pipe = exp.pipelines[0]
    base = CostParams(stage_gap_s=0.007, call_overhead_s=0.001, worker_link_bytes_per_s=2e8,
                      worker_link_latency_s=0.004)
    took = {}
    for sync in (0.0, 0.009):
        cost = CostModel(exp.accelerator, noise_sigma=0.0,
                         params=dataclasses.replace(base, weight_sync_s=sync))
        if sync:
            assert cost.weight_sync_time_s(pipe.model, 2) == sync
            assert cost.dispatch_time_s(pipe.model, Stage.WEIGHT_SYNC, 2) == 0.0
        sim = SimCluster(exp.num_devices, cost, Recorder())
        sim.start_work("p0/0/weight_sync", pipe, 0, Stage.WEIGHT_SYNC, (), 0.0)
        while sim.step():
            pass
        took[sync] = sim.now_s
    assert took[0.009] == pytest.approx(0.009)
    # the model it replaces charges the move of the weights, the call and the gap
    assert took[0.0] > 0.004 + 0.001 + 0.007
