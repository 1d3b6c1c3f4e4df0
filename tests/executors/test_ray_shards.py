"""A data-parallel update's rounds on the holder (``worker_shards.UpdateRounds``) without a Ray
cluster: each PPO epoch's helpers get the weights after the previous step, and a helper that
fails has its rows computed on the holder, so the step is the whole batch's either way."""

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
from jigsawrl.engine.trainer import (  # noqa: E402
    GRPOConfig,
    GRPOTrainer,
    build_batch,
    shard_grads,
)
from jigsawrl.executors.raycluster.messages import ShardResult, StageRequest  # noqa: E402
from jigsawrl.executors.raycluster.worker_shards import UpdateRounds  # noqa: E402
from jigsawrl.stages import Stage  # noqa: E402

BOUNDS = ((0, 2), (2, 4), (4, 6))


def batch_of_six() -> Any:
    seqs = [([3, 4, 5], [6, 7, 8, 9], [1, 1, 1, 1]), ([3, 4, 5], [9, 8], [1, 1]),
            ([10, 11], [12, 13, 14], [1, 0, 1]), ([10, 11], [15], [1]),
            ([20, 21, 22, 23], [24, 25], [1, 1]), ([20, 21, 22, 23], [26, 27, 28], [1, 1, 1])]
    return build_batch(seqs, torch.tensor([1.0, -1.0, 0.5, -0.5, 0.25, -0.25]), 0)


class FakeHelpers:
    """Helper workers run in this process: ``submit`` computes a shard on a copy of the model
    from the payload's weights; ``fail_at`` (epoch, helper) makes that call's result raise as a
    dead worker's does."""

    def __init__(self, model: Any, cfg: GRPOConfig, batch: Any,
                 fail_at: tuple[int, int] | None = None) -> None:
        self.model, self.cfg, self.batch, self.fail_at = copy.deepcopy(model), cfg, batch, fail_at
        self.epoch = 0
        self.calls: list[tuple[int, int]] = []

    def shard(self, index: int, weights: dict[str, Any]) -> Any:
        self.calls.append((self.epoch, index))
        if self.fail_at == (self.epoch, index):
            return "dead"
        self.model.load_state_dict(weights)
        lo, hi = BOUNDS[index + 1]
        grads = shard_grads(self.model, self.batch.slice(lo, hi), float(self.batch.loss_mask.sum()),
                            self.cfg)
        return ShardResult(t_start=1.0 + self.epoch, t_end=1.5 + self.epoch, tokens=hi - lo,
                           grads=grads)

    def get(self, ref: Any) -> Any:
        if ref == "dead":
            raise ray.exceptions.RayActorError()
        return ref

    def submit(self, index: int, request: Any, payload: Any) -> Any:
        return self.shard(index, payload.weights)


@pytest.mark.parametrize("fail_at", [None, (0, 1), (1, 0)])
def test_rounds_give_the_whole_batch_step(fail_at: tuple[int, int] | None) -> None:
    cfg = GRPOConfig(lr=1e-3, micro_batch_size=2, ppo_epochs=3)
    model = build_model("qwen2-1m", seed=0)[0]
    batch = batch_of_six()
    whole = GRPOTrainer(copy.deepcopy(model), cfg)
    batch.old_logprobs = whole.old_logprobs(batch)
    want = whole.update(batch)

    holder = GRPOTrainer(copy.deepcopy(model), cfg)
    fake = FakeHelpers(model, cfg, batch, fail_at)
    first = [fake.shard(i, holder.model.state_dict()) for i in range(2)]  # the executor's calls
    req = StageRequest("p", Stage.ACTOR_UPDATE, 0, 1, BOUNDS)
    rounds = UpdateRounds(holder, req, SimpleNamespace(batch=batch), batch, first,
                          actors=["w1", "w2"], get=fake.get, put=lambda x: x, submit=fake.submit)

    def shards(epoch: int) -> Any:
        fake.epoch = epoch
        return rounds.launch(epoch)

    got = holder.update_data_parallel(batch.slice(*BOUNDS[0]), rounds.total, shards)
    for p, q in zip(whole.model.parameters(), holder.model.parameters(), strict=True):
        # summation order only (Adam magnifies it on tiny gradients); stale weights miss by ~3e-3
        assert torch.allclose(p, q, atol=5e-6), float((p - q).abs().max())
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    lost = set() if fail_at is None else {fail_at[1]}
    assert rounds.lost == lost
    # a lost helper is not called again; the others are called once per epoch
    for index in range(2):
        epochs = [e for e, i in fake.calls if i == index]
        assert epochs == (list(range(fail_at[0] + 1)) if index in lost and fail_at
                          else [0, 1, 2])
    spans = rounds.timings()
    assert len(spans) == 2
    for index, per_round in enumerate(spans):
        if index not in lost:  # one span per round: the worker is free between rounds
            assert [(r.t_start, r.t_end, r.tokens) for r in per_round] == [
                (1.0, 1.5, 2), (2.0, 2.5, 2), (3.0, 3.5, 2)]


@pytest.mark.parametrize("dead", [None, 0, 1])
def test_log_probs_gather_helpers_and_recompute_a_dead_ones_rows(dead: int | None) -> None:
    """The helpers' log-prob shards land in their rows; a helper whose call failed has its rows
    computed on the holder: the same log-probs either way, and an empty span for it."""
    from jigsawrl.engine.trainer import compute_logprobs
    from jigsawrl.executors.raycluster.worker_shards import gather_logprobs

    cfg = GRPOConfig(micro_batch_size=2)
    model = build_model("qwen2-1m", seed=0)[0]
    batch = batch_of_six()
    want = compute_logprobs(model, batch, 6)
    helpers = []
    for i, (lo, hi) in enumerate(BOUNDS[1:]):
        lp = compute_logprobs(model, batch.slice(lo, hi), 2)
        helpers.append("dead" if i == dead else
                       ShardResult(t_start=1.0, t_end=2.0, tokens=hi - lo, logprobs=lp))
    fake = FakeHelpers(model, cfg, batch)
    got, timings = gather_logprobs(model, batch, BOUNDS, helpers, cfg, "p/old_logprob",
                                   get=fake.get)
    mask = batch.loss_mask > 0
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)
    assert len(timings) == 2
    for i, t in enumerate(timings):
        assert (t.t_end - t.t_start, t.tokens) == ((0.0, 0) if i == dead else (1.0, 2))
