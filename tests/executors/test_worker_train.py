"""A device worker's train states (``executors/raycluster/worker_train.py``), without Ray: what a
train state carries when it moves, and what counting its bytes walks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from jigsawrl.config import PipelineSpec  # noqa: E402
from jigsawrl.executors.raycluster.messages import RewardResult, StageRequest  # noqa: E402
from jigsawrl.executors.raycluster.worker_pipes import LocalPipelines  # noqa: E402
from jigsawrl.executors.raycluster.worker_train import TrainHost, state_bytes  # noqa: E402
from jigsawrl.stages import Stage  # noqa: E402


@dataclass(slots=True)
class _Slotted:
    t: torch.Tensor
    ids: list[int]


class _Plain:
    def __init__(self) -> None:
        self.batch = {"x": torch.zeros(3, dtype=torch.float64)}
        self.ids = list(range(100_000))
        self.text = ["a"] * 10


def test_state_bytes_counts_every_tensor_and_skips_lists_of_numbers() -> None:
    state = {"model": {"w": torch.zeros(10, 4)},  # 160 bytes
             "optimizer": {"state": {0: {"exp_avg": torch.zeros(8)}},  # 32
                           "param_groups": [{"params": [0, 1, 2], "lr": 1e-3}]},
             "steps": {0: _Plain(), 1: _Slotted(torch.zeros(2, dtype=torch.int64), [1, 2])},
             "nested": [[torch.zeros(1)], (torch.zeros(2),)]}  # 4 + 8
    assert state_bytes(state) == 160 + 32 + 24 + 16 + 4 + 8


def _spec() -> PipelineSpec:
    return PipelineSpec.model_validate({
        "name": "t", "model": "qwen2-1m", "task": "arithmetic", "batch_size": 2,
        "group_size": 2, "steps": 2, "max_response_tokens": 12,
        "train": {"warmup_steps": 2, "threads": 1, "eval_size": 2}})


def test_a_step_batch_leaves_the_train_state_with_its_update(tmp_path: Path) -> None:
    """A step's batch rides with the train state only while the step has passes left: after its
    update it is dropped, so old steps do not pile up in every later move (they did: five steps'
    batches moved with each state in the demo, and counting them cost up to 93 ms a move)."""
    spec = _spec()
    host = TrainHost(LocalPipelines(0, {"t": spec.model_dump_json()}, seed=0,
                                    cache_dir=str(tmp_path / "cache")))
    _, state = host.init_train("t", None)
    pipe = host.local.pipes["t"]
    for step in range(2):
        data = pipe.rollout(step)
        rewards = [pipe.score(t)[0] for t in data.trajectories]
        scored = RewardResult(t_start=0.0, t_end=0.0, rewards=tuple(rewards),
                              infos=tuple({} for _ in rewards))
        for stage in (Stage.OLD_LOGPROB, Stage.ACTOR_UPDATE):
            # every pass moves the state in (an onload inside the call), then back out
            host.run_stage(StageRequest("t", stage, step, 1), state, data.trajectories, scored)
            if stage == Stage.OLD_LOGPROB:
                assert set(host.data["t"]) == {step}  # the batch of this step, built once
            _, state = host.offload("t")
        assert state.steps == {}, f"step {step}'s batch still rides with the state"
