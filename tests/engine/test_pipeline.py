"""RealPipeline sub-stages: each callable on its own, bad rewards never crash, tool masks."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _fakes import FakeEngine  # noqa: E402

from jigsawrl.config import PipelineSpec  # noqa: E402
from jigsawrl.engine.pipeline import RealPipeline  # noqa: E402

torch.set_num_threads(1)


def _pipe(tmp: Path, task: str = "arithmetic", reward_fn=None, max_tokens: int = 16,  # noqa: ANN001
          **train) -> RealPipeline:  # noqa: ANN003
    spec = PipelineSpec.model_validate({
        "name": "t", "model": "qwen2-1m", "task": task, "batch_size": 2, "group_size": 2,
        "steps": 1, "max_response_tokens": max_tokens,
        "train": {"warmup_steps": 2, "threads": 1, "eval_size": 2, **train}})
    pipe = RealPipeline(spec, seed=0, cache_dir=tmp / "cache", reward_fn=reward_fn)
    pipe.start()
    return pipe


def test_sub_stages_one_by_one(tmp_path: Path) -> None:
    pipe = _pipe(tmp_path, kl_coef=0.1)
    data = pipe.rollout(0)
    assert [t.request_id for t in data.trajectories] == ["t/0/0/0", "t/0/0/1", "t/0/1/0",
                                                          "t/0/1/1"]
    assert pipe.prompts_for(0) == pipe.prompts_for(0) != pipe.prompts_for(1)
    pipe.reward(data)
    assert data.batch is not None and data.batch.num_seqs == 4
    pipe.old_logprob(data)
    pipe.ref_logprob(data)  # kl_coef > 0: a frozen reference exists
    assert data.batch.ref_logprobs is not None
    before = [p.detach().clone() for p in pipe.model.parameters()]
    metrics = pipe.update(data)
    assert set(metrics) >= {"actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"}
    pipe.weight_sync()
    engine_w = dict(pipe.engine.model.named_parameters())
    for name, p in pipe.model.named_parameters():
        assert torch.equal(engine_w[name], p)
    if metrics["actor/grad_norm"] > 0:
        assert any(not torch.equal(a, b) for a, b in zip(before, pipe.model.parameters(),
                                                         strict=True))


def test_raising_or_non_numeric_reward_gives_zero_and_the_run_goes_on(tmp_path: Path,
                                                                       caplog) -> None:  # noqa: ANN001
    calls = {"n": 0}

    def bad_reward(text: str, example: object) -> object:
        calls["n"] += 1
        if calls["n"] % 2:
            raise RuntimeError("reward server down")
        return "not a number"

    pipe = _pipe(tmp_path, reward_fn=bad_reward)
    metrics = pipe.run_step(0)
    assert metrics["critic/score/mean"] == 0.0
    assert metrics["reward/errors"] == 4.0
    assert "reward server down" in caplog.text
    assert metrics["actor/grad_norm"] == 0.0  # all-equal rewards: zero advantages


def test_calculator_tool_tokens_are_masked_out(tmp_path: Path) -> None:
    """Pipeline + agent + real calculator tool with a scripted "model": tool tokens get mask 0."""
    pipe = _pipe(tmp_path, task="calculator", max_tokens=64)
    examples = pipe.prompts_for(0)
    scripts = {}
    for i, ex in enumerate(examples):
        first_call = ex.demo[: ex.demo.index("</calc>") + len("</calc>")]
        for j in range(2):
            scripts[f"t/0/{i}/{j}"] = [first_call, "A: 1"]
    pipe.engine = FakeEngine(scripts, ("</calc>", "\n"), tok=pipe.tokenizer)
    data = pipe.rollout(0)
    traj = data.trajectories[0]
    assert traj.num_tool_calls == 1 and "<r>" in traj.response_text
    pipe.reward(data)
    assert data.batch is not None
    model_tokens = sum(sum(t.response_mask) for t in data.trajectories)
    tool_tokens = sum(len(t.response_mask) - sum(t.response_mask) for t in data.trajectories)
    assert tool_tokens > 0
    assert data.batch.loss_mask.sum().item() == model_tokens
    assert data.reward_infos[0]["calls"] == 1.0
