"""In-tail log-probs (``sim/stream.py``'s tail mode): the finished groups' log-probs run on the
rollout's drained devices only, yield to any work there, and the post-rollout passes cost only
the rest (exact timelines with the toy cost model)."""

from __future__ import annotations

import pytest

from jigsawrl.events import STREAMED_RANK, Span
from jigsawrl.sim.cluster import SimCluster
from jigsawrl.sim.dispatch import dispatch_requests
from jigsawrl.sim.stream import StreamRuntime
from jigsawrl.stages import Stage
from jigsawrl.workload.requests import RequestTruth, TurnTruth
from tests.conftest import FakeCost
from tests.sim.test_sim_parts import Recorder, experiment

LOAD_S = 0.2  # the weight load of a pass on new devices, with this cost model


class LoadCost(FakeCost):
    """The toy cost model with a weight load that takes time."""

    def host_transfer_time_s(self, nbytes, n=1):  # noqa: ANN001
        return LOAD_S


def reqs(*lengths: int) -> list[RequestTruth]:
    """One request per GRPO group (sample ids ``pipeline/step/group/sample``)."""
    return [RequestTruth(f"p0/0/{i}/0", 10, (TurnTruth(n),)) for i, n in enumerate(lengths)]


def streamed(events: list) -> list[tuple]:
    return [(e.stage, e.devices, round(e.start_s, 6), round(e.end_s, 6), e.tokens)
            for e in events if isinstance(e, Span) and e.rank == STREAMED_RANK]


def run_to(sim: SimCluster, t: float) -> None:
    while sim.q.peek_time() is not None and sim.q.peek_time() <= t + 1e-9:
        sim.step()


def test_tail_passes_run_on_drained_devices_and_leave_the_rest() -> None:
    exp = experiment()
    pipe = exp.pipelines[0]  # group size 1: every request is a group
    sim = SimCluster(exp.num_devices, LoadCost(), Recorder())
    chunks = dispatch_requests(reqs(3, 60), 2, "contiguous")
    sim.start_rollout("p0/0/rollout", pipe, 0, (0, 1), 1, 1.0, 10_000, chunks,
                      tail_logprobs=True)
    while sim.step():
        pass
    events = sim.drain_events()
    # rank 0 drains at 3.1 (10 + 3 tokens): its device computes the old, then the reference
    # log-probs (each loading its model's weights first: 0.2 + 0.013 s), while rank 1 decodes
    assert streamed(events) == [(Stage.OLD_LOGPROB, (0,), 3.1, 3.313, 13),
                                (Stage.REF_LOGPROB, (0,), 3.313, 3.526, 13)]
    # after the rollout (60.1 s) the passes cover only the other sequence (70 tokens)
    sim.start_work("p0/0/old_logprob", pipe, 0, Stage.OLD_LOGPROB, (0, 1), 1.0)
    while sim.step():
        pass
    (span,) = sim.drain_events()
    assert span.tokens == 70 and span.end_s - span.start_s == pytest.approx(0.001 * 70 / 2)


def test_a_tail_pass_yields_to_work_and_reloads_if_its_load_was_cut() -> None:
    exp = experiment()
    pipe = exp.pipelines[0]
    sim = SimCluster(exp.num_devices, LoadCost(), Recorder())
    chunks = dispatch_requests(reqs(3, 60), 2, "contiguous")
    sim.start_rollout("p0/0/rollout", pipe, 0, (0, 1), 1, 1.0, 10_000, chunks,
                      tail_logprobs=True)
    run_to(sim, 3.1)
    assert sim.streams.servers["p0/0/rollout"].entry is not None  # the pass started
    sim.start_work("p0/0/weight_sync", pipe, 0, Stage.WEIGHT_SYNC, (0,), 1.0)  # 1 s on dev 0
    while sim.step():
        pass
    old = [s for s in streamed(sim.drain_events()) if s[0] == Stage.OLD_LOGPROB]
    # paused at once (no span), resumed when the work ended at 4.1, its load paid again
    assert old == [(Stage.OLD_LOGPROB, (0,), 4.1, 4.313, 13)]


def test_a_tail_server_never_starts_on_busy_devices() -> None:
    exp = experiment()
    pipe = exp.pipelines[0]
    sim = SimCluster(exp.num_devices, LoadCost(), Recorder())
    # one rank on both devices (TP 2): nothing drains before the rollout ends
    chunks = dispatch_requests(reqs(3, 60), 1, "contiguous")
    sim.start_rollout("p0/0/rollout", pipe, 0, (0, 1), 2, 1.0, 10_000, chunks,
                      tail_logprobs=True)
    while sim.step():
        pass
    assert streamed(sim.drain_events()) == []


def test_a_tail_server_needs_the_idle_query() -> None:
    rt = StreamRuntime(None, FakeCost(), [], lambda d: False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idle-devices query"):
        rt.open("t", experiment().pipelines[0], 0, (0,), tail=True)
