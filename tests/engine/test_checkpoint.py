"""Checkpoints: round trip of model, optimizer, RNG; resume gives the same next step."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from jigsawrl.config import PipelineSpec  # noqa: E402
from jigsawrl.engine.checkpoint import (  # noqa: E402
    apply_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from jigsawrl.engine.pipeline import RealPipeline  # noqa: E402
from jigsawrl.errors import InputError  # noqa: E402

torch.set_num_threads(1)


def _model_and_opt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return model, opt


def test_round_trip_restores_model_optimizer_and_rng(tmp_path: Path) -> None:
    model, opt = _model_and_opt()
    random.seed(7)
    torch.manual_seed(7)
    save_checkpoint(tmp_path, 3, model, opt, {"history": [{"x": 1.0}]})
    expect_py, expect_torch = random.random(), torch.rand(2)
    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == "step-000003"
    ckpt = load_checkpoint(path)
    assert ckpt.step == 3 and ckpt.meta["history"] == [{"x": 1.0}]
    fresh, fresh_opt = torch.nn.Linear(3, 2), None
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    apply_checkpoint(ckpt, fresh, fresh_opt)
    assert random.random() == expect_py and torch.equal(torch.rand(2), expect_torch)
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_latest_and_unreadable(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "none") is None
    model, opt = _model_and_opt()
    save_checkpoint(tmp_path, 1, model, opt)
    save_checkpoint(tmp_path, 2, model, opt)
    assert latest_checkpoint(tmp_path).name == "step-000002"  # type: ignore[union-attr]
    broken = tmp_path / "step-000009"
    broken.mkdir()
    (broken / "state.pt").write_text("not a checkpoint")
    with pytest.raises(InputError):
        load_checkpoint(broken)


def _spec() -> PipelineSpec:
    return PipelineSpec.model_validate({
        "name": "ck", "model": "qwen2-1m", "task": "arithmetic", "batch_size": 3,
        "group_size": 2, "steps": 3, "max_response_tokens": 12,
        "train": {"warmup_steps": 4, "threads": 1, "eval_size": 0, "lr": 1e-3,
                  "micro_batch_size": 4}})


def test_resume_gives_the_same_next_step(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    straight = RealPipeline(_spec(), seed=3, cache_dir=cache)
    straight.start()
    for step in range(2):
        straight.run_step(step)
    straight.save(tmp_path / "ck", 2)
    expect = straight.run_step(2)

    resumed = RealPipeline(_spec(), seed=3, cache_dir=cache)
    resumed.start()
    resumed.restore(tmp_path / "ck")
    got = resumed.run_step(2)
    for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm",
                "actor/entropy"):
        assert got[key] == pytest.approx(expect[key], rel=1e-6, abs=1e-9), key
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-7)
