"""In-tail log-probs on real workers, without a Ray cluster: what the executor sends to a
drained rank's device (``executors/raycluster/tail.py``) and how the holder writes the results
into the step's batch (``worker_tail.fill_from_tail``): the same log-probs as the plain pass."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
torch.set_num_threads(1)

from jigsawrl.engine.models import build_model  # noqa: E402
from jigsawrl.engine.tail_logprobs import rows_logprobs  # noqa: E402
from jigsawrl.engine.trainer import GRPOConfig, GRPOTrainer, build_batch  # noqa: E402
from jigsawrl.events import STREAMED_RANK  # noqa: E402
from jigsawrl.executors.raycluster.messages import TailResult  # noqa: E402
from jigsawrl.executors.raycluster.records import (  # noqa: E402
    Call,
    CallKind,
    Dev,
    Pipe,
    RunState,
    Settings,
)
from jigsawrl.executors.raycluster.rollouts import RankRT, RolloutRT  # noqa: E402
from jigsawrl.executors.raycluster.tail import TailPasses  # noqa: E402
from jigsawrl.executors.raycluster.worker_tail import fill_from_tail  # noqa: E402
from jigsawrl.stages import Stage  # noqa: E402

SEQS = [([3, 4, 5], [6, 7, 8, 9], [1, 1, 1, 1]), ([3, 4, 5], [9, 8], [1, 1]),
        ([10, 11], [12, 13, 14], [1, 0, 1]), ([10, 11], [15], [1]),
        ([20, 21, 22, 23], [24, 25], [1, 1]), ([20, 21, 22, 23], [26, 27, 28], [1, 1, 1])]
OPTS = (2, True, "off")


class Failed:
    """A tail call's ref whose result raises (its worker died)."""


def get(ref: Any) -> Any:
    if isinstance(ref, Failed):
        raise ray.exceptions.RayActorError()
    return ref


@pytest.mark.parametrize("stage", [Stage.OLD_LOGPROB, Stage.REF_LOGPROB])
def test_the_holder_fills_tail_rows_and_computes_the_rest(stage: str) -> None:
    """Groups 0 and 2 came from the tail (two calls), a third call failed: the batch's
    log-probs equal the plain pass over every row, on every target a loss reads."""
    actor, ref = build_model("qwen2-1m", seed=1)[0], build_model("qwen2-1m", seed=2)[0]
    trainer = GRPOTrainer(copy.deepcopy(actor), GRPOConfig(micro_batch_size=2, kl_coef=0.1),
                          ref_model=copy.deepcopy(ref))
    pipe = SimpleNamespace(trainer=trainer, device=torch.device("cpu"))
    data = SimpleNamespace(batch=build_batch(SEQS, torch.zeros(6), 0))
    want = (trainer.ref_logprobs if stage == Stage.REF_LOGPROB else
            trainer.old_logprobs)(build_batch(SEQS, torch.zeros(6), 0))

    def call(rows: tuple[int, ...]) -> TailResult:
        seqs = [SEQS[r] for r in rows]
        return TailResult(t_start=0.0, t_end=1.0, rows=rows,
                          old=tuple(rows_logprobs(actor, seqs, 0, OPTS)),
                          ref=tuple(rows_logprobs(ref, seqs, 0, OPTS)))

    kept = fill_from_tail(pipe, data, stage, [call((0, 1)), call((4, 5)), Failed()], get=get)
    got = data.batch.ref_logprobs if stage == Stage.REF_LOGPROB else data.batch.old_logprobs
    assert kept == 4
    read = data.batch.loss_mask.bool()
    assert torch.allclose(got[read], want[read], atol=1e-5)
    other = data.batch.old_logprobs if stage == Stage.REF_LOGPROB else data.batch.ref_logprobs
    assert other is None  # one stage, one tensor


# ---------------------------------------------------------------------------- the executor side

class FakeActor:
    """A device worker's handle: records the tail calls sent to it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.sent: list[tuple[Any, Any]] = []
        self.tail_pass = SimpleNamespace(remote=self._remote)

    def _remote(self, req: Any, ref_state: Any) -> Any:
        self.sent.append((req, ref_state))
        return ("ref", self.index, len(self.sent))


def run_state(mode: str = "sync", kl: float = 0.0, epochs: int = 2) -> RunState:
    state = RunState(Settings())
    spec = SimpleNamespace(mode=mode, group_size=2, batch_size=3, train=SimpleNamespace(
        recompute_old_logprobs=False, ppo_epochs=epochs, kl_coef=kl))
    state.pipes["p"] = Pipe("p", spec, num_params=1, version=3, restore_ref="host-state")
    state.devs = [Dev(i, FakeActor(i)) for i in range(3)]
    return state


def rollout(done: tuple[bool, ...] = (False, True)) -> RolloutRT:
    """Three groups of two on two ranks (devices 0 and 1); groups 0 and 1 finished."""
    ro = RolloutRT("p/0/rollout", "p", 0, 6, [RankRT(i, (i,), 1.0) for i in range(2)])
    ro.assign(0, [0, 1, 2, 3])
    ro.assign(1, [4, 5])
    for i in (0, 1, 2, 3):
        ro.finished(i, SimpleNamespace(prompt_ids=[1, 2], response_ids=[i + 3],
                                       response_mask=[1]), 3)
    for rank, d in zip(ro.ranks, done, strict=True):
        rank.done = d
    return ro


def test_finished_groups_go_to_a_drained_ranks_idle_device() -> None:
    state = run_state(kl=0.1)
    tail = TailPasses(state, {})
    ro = rollout()
    tail.active[ro.tid] = ro
    tail.open(ro)
    tail.pump(ro)
    sent = state.devs[1].actor.sent
    assert len(sent) == 1 and not state.devs[0].actor.sent  # rank 0 still decodes
    req, ref_state = sent[0]
    assert req.rows == (0, 1) and req.old and req.ref and req.version == 3
    assert ref_state == "host-state"  # the first call there builds the reference model
    assert req.sequences[1] == ([1, 2], [4], [1])
    call = next(iter(state.calls.values()))
    assert call.kind == CallKind.TAIL and call.devices == (1,) and call.tid is None
    tail.pump(ro)  # one call at a time per device
    assert len(sent) == 1
    # the call returns: its spans, then the next ready group goes out (no reference again)
    ref = next(iter(state.calls))
    state.untrack(ref)
    tail.done(call, TailResult(t_start=0.0, t_end=2.0, t_mid=1.0, rows=(0, 1), old=(1, 2),
                               ref=(3, 4), tokens=8))
    assert [(s.stage, s.rank) for s in state.events] == [
        (Stage.OLD_LOGPROB, STREAMED_RANK), (Stage.REF_LOGPROB, STREAMED_RANK)]
    assert len(sent) == 2 and sent[1][0].rows == (2, 3) and sent[1][1] is None
    step = tail.take("p", 0, Stage.OLD_LOGPROB)
    assert step is not None and step.rows() == 4
    tail.forget("p", 0)
    assert tail.take("p", 0, Stage.OLD_LOGPROB) is None


def test_nothing_is_sent_where_it_does_not_apply() -> None:
    # a device with another call in flight
    state = run_state()
    state.track("other", Call(CallKind.STAGE, "p", 0, Stage.REWARD, (1,), 1.0, "t"))
    tail = TailPasses(state, {})
    ro = rollout()
    tail.active[ro.tid] = ro
    tail.open(ro)
    tail.pump(ro)
    assert not state.devs[1].actor.sent
    # an async pipeline; a sync one with neither pass (on-policy shortcut, no reference)
    for st in (run_state(mode="async"), run_state(epochs=1)):
        tail = TailPasses(st, {})
        ro = rollout()
        tail.active[ro.tid] = ro
        tail.open(ro)
        tail.pump(ro)
        assert not st.devs[1].actor.sent and not tail.plans
    # a rollout whose every rank drained is complete: the post-rollout pass computes the rest
    state = run_state()
    tail = TailPasses(state, {})
    ro = rollout(done=(True, True))
    for i in (4, 5):
        ro.finished(i, SimpleNamespace(prompt_ids=[1], response_ids=[2], response_mask=[1]), 3)
    tail.active[ro.tid] = ro
    tail.open(ro)
    tail.pump(ro)
    assert not state.devs[1].actor.sent and not tail.plans
