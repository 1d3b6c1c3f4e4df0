"""The simulator's parts on their own: dispatch, bandwidth contention, and the cluster's clock
over a rollout and a compute work (exact timelines with the toy cost model)."""

from __future__ import annotations

import pytest

from jigsawrl.config import validate_config
from jigsawrl.events import SampleFinished, Span
from jigsawrl.experiments.resolve import resolve
from jigsawrl.sim.cluster import SimCluster
from jigsawrl.sim.contention import COMPUTE_BW_DEMAND, BandwidthContention, work_demand
from jigsawrl.sim.dispatch import TruthSampler, dispatch_requests
from jigsawrl.sim.rollout_task import DONE_BAND
from jigsawrl.stages import Stage
from jigsawrl.workload.requests import RequestTruth, TurnTruth


def experiment(devices: int = 2):  # noqa: ANN201
    return resolve(validate_config({
        "cluster": {"accelerator": "h100-80gb", "num_nodes": 1, "accelerators_per_node": devices},
        "pipelines": [{"name": "p0", "model": "qwen3-0.6b", "task": "gsm8k", "batch_size": 4,
                       "group_size": 1, "steps": 1, "max_response_tokens": 1024}],
    }))


def reqs(*lengths: int) -> list[RequestTruth]:
    return [RequestTruth(f"p0/0/{i}", 10, (TurnTruth(n),)) for i, n in enumerate(lengths)]


class Recorder:
    """A listener that keeps what the simulator reported."""

    def __init__(self) -> None:
        self.progress: list[tuple] = []
        self.done: list[tuple] = []

    def rank_progress(self, task_id, rank, unfinished, band, time_s, ctx_tokens) -> None:  # noqa: ANN001
        self.progress.append((task_id, rank, unfinished, band, round(time_s, 6)))

    def task_done(self, task_id, pipeline, step, stage, time_s, prompt_tokens=(),  # noqa: ANN001
                  response_tokens=()) -> None:  # noqa: ANN001
        self.done.append((task_id, stage, round(time_s, 6), prompt_tokens, response_tokens))


def test_truth_sampler_samples_each_step_once_and_reproducibly() -> None:
    pipe = experiment().pipelines[0]
    a, b = TruthSampler(3), TruthSampler(3)
    first = a.step_requests(pipe, 0)
    assert a.step_requests(pipe, 0) is first
    assert [r.generated_tokens for r in b.step_requests(pipe, 0)] == \
        [r.generated_tokens for r in first]
    assert len(first) == pipe.spec.batch_size


def test_dispatch_contiguous_and_unknown() -> None:
    rs = reqs(1, 2, 3, 4, 5)
    assert [[r.generated_tokens for r in c] for c in
            dispatch_requests(rs, 2, "contiguous")] == [[1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="unknown dispatch"):
        dispatch_requests(rs, 2, "random")


def test_contention_scales_decodes_above_one(fake_cost) -> None:  # noqa: ANN001
    bw = BandwidthContention(2, fake_cost)  # s_sat = 0.4
    assert bw.bw(0.2) == pytest.approx(0.5) and bw.bw(0.8) == 1.0
    assert bw.kappa(("a", 0), (0,), 0.5) == 1.0  # alone: its own demand
    bw.set_demand(("b", 0), (0,), 1.0, owner="b0")
    assert bw.take_touched() == [("b", 0)]
    assert bw.take_touched() is None
    kappa = bw.kappa(("a", 0), (0,), 0.5)
    assert kappa == pytest.approx(2.0)
    assert bw.decode_share(0.5, kappa) == pytest.approx(0.4 * 1.0 / 2.0)
    assert bw.decode_share(0.5, 1.0) == 0.5
    assert work_demand(Stage.ACTOR_UPDATE, 0.5) == pytest.approx(COMPUTE_BW_DEMAND * 0.5)
    assert work_demand(Stage.REWARD, 1.0) == 0.0


def test_cluster_rollout_then_work_exact_timeline(fake_cost) -> None:  # noqa: ANN001
    exp = experiment()
    pipe = exp.pipelines[0]
    rec = Recorder()
    sim = SimCluster(exp.num_devices, fake_cost, rec)
    chunks = dispatch_requests(reqs(3, 6), 2, "contiguous")
    sim.start_rollout("p0/0/rollout", pipe, 0, (0, 1), 1, 1.0, 10_000, chunks)
    assert sim.busy()
    while sim.step():
        pass
    # 10 prompt tokens prefill in 0.1 s; then one decode iteration per second
    assert rec.progress == [("p0/0/rollout", 0, 1, Stage.PREFILL, 0.0),
                            ("p0/0/rollout", 1, 1, Stage.PREFILL, 0.0),
                            ("p0/0/rollout", 0, 0, DONE_BAND, 3.1),
                            ("p0/0/rollout", 1, 0, DONE_BAND, 6.1)]
    assert rec.done == [("p0/0/rollout", Stage.ROLLOUT, 6.1, (10, 10), (3, 6))]
    events = sim.drain_events()
    assert [(e.stage, e.rank, round(e.start_s, 6), round(e.end_s, 6)) for e in events
            if isinstance(e, Span)] == [(Stage.PREFILL, 0, 0.0, 0.1),
                                        (Stage.PREFILL, 1, 0.0, 0.1),
                                        (Stage.DECODE_SMALL, 0, 0.1, 3.1),
                                        (Stage.DECODE_SMALL, 1, 0.1, 6.1)]
    assert sorted(round(e.time_s, 6) for e in events if isinstance(e, SampleFinished)) == \
        [3.1, 6.1]
    assert not sim.busy() and sim.drain_events() == []
    # the update at share 0.5 (toy cost: 1/share slower) over the rollout's 29 tokens
    sim.start_work("p0/0/actor_update", pipe, 0, Stage.ACTOR_UPDATE, (0, 1), 0.5)
    while sim.step():
        pass
    (span,) = sim.drain_events()
    assert span.stage == Stage.ACTOR_UPDATE and span.tokens == 29
    assert span.end_s - span.start_s == pytest.approx(0.003 * 29 / 2 / 0.5)
    assert rec.done[-1][:2] == ("p0/0/actor_update", Stage.ACTOR_UPDATE)
    with pytest.raises(KeyError, match="no running task"):
        sim.set_share("p0/0/actor_update", 1.0)


def test_a_several_epoch_update_on_several_devices_is_one_round_per_epoch() -> None:
    """The Ray executor calls an update's data-parallel helpers once per PPO epoch; the
    simulator charges the pool's per-call costs that many times (one call on one device)."""
    from types import SimpleNamespace

    from jigsawrl.sim.works import dp_rounds

    pipe = SimpleNamespace(spec=SimpleNamespace(train=SimpleNamespace(ppo_epochs=4)))
    assert dp_rounds(pipe, Stage.ACTOR_UPDATE, 2) == 4  # type: ignore[arg-type]
    assert dp_rounds(pipe, Stage.ACTOR_UPDATE, 1) == 1  # type: ignore[arg-type]
    assert dp_rounds(pipe, Stage.OLD_LOGPROB, 2) == 1  # type: ignore[arg-type]


def test_a_pass_is_costed_on_its_rows_prompt_lengths(fake_cost) -> None:  # noqa: ANN001
    """The work runtime hands the cost model the finished rollout's prompt lengths beside its
    sequence lengths (what a shared-prompt trainer's count needs)."""
    exp = experiment()
    pipe = exp.pipelines[0]
    seen: list[tuple] = []
    plain = fake_cost.pass_tokens

    def recording(lens, n, rows, prompt_lens=None, group_size=1):  # noqa: ANN001, ANN202
        seen.append((tuple(lens), tuple(prompt_lens or ()), group_size))
        return plain(lens, n, rows)

    fake_cost.pass_tokens = recording
    sim = SimCluster(exp.num_devices, fake_cost, Recorder())
    sim.start_rollout("p0/0/rollout", pipe, 0, (0, 1), 1, 1.0, 10_000,
                      dispatch_requests(reqs(3, 6), 2, "contiguous"))
    while sim.step():
        pass
    sim.start_work("p0/0/old_log_prob", pipe, 0, Stage.OLD_LOGPROB, (0, 1), 1.0)
    assert seen == [((13, 16), (10, 10), pipe.spec.group_size)]
