"""The ``muxserve`` baseline: rollouts of all pipelines share the devices, training runs alone."""

from __future__ import annotations

import pytest
from test_rollmux import check_run, make_cfg, overlaps, run, spans_of, tiny_view

from jigsawrl.costmodel.slowdown import SHARE_LEVELS
from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import (
    RunningTask,
    SetResident,
    SetShare,
    StartRollout,
    StartStage,
    task_id,
)
from jigsawrl.scheduler.muxserve import MAX_CONCURRENT, MuxServePolicy, equal_share
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.stages import ROLLOUT_BANDS as ROLLOUT_STAGES

TRAIN_ON_DEVICES = MODEL_PASSES | {Stage.WEIGHT_SYNC}


@pytest.mark.parametrize("models,devices,task", [
    (("qwen3-0.6b", "qwen3-4b"), 8, "gsm8k"),
    (("qwen3-4b", "qwen3-4b", "qwen3-0.6b"), 4, "search-r1"),
])
def test_rollouts_multiplex_and_training_runs_alone(models: tuple[str, ...], devices: int,
                                                    task: str) -> None:
    cfg = make_cfg(models, devices, task)
    events = run(cfg, MuxServePolicy())
    check_run(cfg, events)
    spans = spans_of(events)
    rollouts = [s for s in spans if s.stage in ROLLOUT_STAGES]
    assert {s.compute_share for s in rollouts} <= set(SHARE_LEVELS)
    # Rollouts of different pipelines do run side by side, at equal shares.
    assert any(overlaps(a, b) and a.pipeline != b.pipeline for a in rollouts for b in rollouts)
    assert any(s.compute_share < 1.0 for s in rollouts)
    # A training stage holds its devices alone, at share 1.
    for t in (s for s in spans if s.stage in TRAIN_ON_DEVICES):
        assert t.compute_share == 1.0
        for o in spans:
            if o is not t and set(o.devices) & set(t.devices):
                assert not overlaps(o, t), (t, o)
    assert all(not s.devices for s in spans if s.stage == Stage.REWARD)  # on the CPU


def test_equal_shares_come_from_the_cost_model_levels() -> None:
    assert [equal_share(k) for k in (1, 2, 3, 4, 5)] == [1.0, 0.5, 0.3, 0.2, 0.2]
    assert equal_share(MAX_CONCURRENT + 1) is None


def test_pipelines_that_cannot_all_be_resident_are_a_config_error() -> None:
    view = tiny_view(make_cfg(("qwen3-4b",) * 3, 2), {})
    with pytest.raises(ConfigError, match="resident") as err:
        MuxServePolicy().decide(view)
    assert err.value.fix


def test_decide_reshares_and_serialises_training() -> None:
    cfg = make_cfg(("qwen3-0.6b", "qwen3-0.6b"), 2)
    policy = MuxServePolicy()
    acts = policy.decide(tiny_view(cfg, {}))
    assert sum(isinstance(a, SetResident) for a in acts.actions) == 2
    starts = [a for a in acts.actions if isinstance(a, StartRollout)]
    assert [(a.pipeline, a.devices, a.share) for a in starts] == [("p0", (0, 1), 0.5),
                                                                    ("p1", (0, 1), 0.5)]
    # p0's rollout ended and its reward is done: p1 gets the whole devices back, p0's training
    # waits for p1's rollout to drain.
    p1_roll = RunningTask(task_id("p1", 0, Stage.ROLLOUT), "p1", 0, Stage.ROLLOUT, (0, 1), 0.5, 0.0)
    acts = policy.decide(tiny_view(cfg, {"p0": {0: {Stage.ROLLOUT, Stage.REWARD}}},
                                   {"p1": [p1_roll]}))
    assert acts.actions == (SetShare(task_id("p1", 0, Stage.ROLLOUT), 1.0),)
    # p1's rollout ended too: p0's training runs alone; p1's reward runs on the CPU meanwhile.
    acts = policy.decide(tiny_view(cfg, {"p0": {0: {Stage.ROLLOUT, Stage.REWARD}},
                                         "p1": {0: {Stage.ROLLOUT}}}))
    stages = {(a.pipeline, a.stage, a.devices, a.share) for a in acts.actions
              if isinstance(a, StartStage)}
    assert stages == {("p0", Stage.OLD_LOGPROB, (0, 1), 1.0), ("p1", Stage.REWARD, (), 0.0)}
