"""Supervised warm start: loss falls, the cache is keyed and reproduces the trained weights."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from jigsawrl.engine.models import build_model  # noqa: E402
from jigsawrl.engine.warmstart import WarmStartSpec, sft_examples, warm_start  # noqa: E402
from jigsawrl.tasks import get_task  # noqa: E402

torch.set_num_threads(1)


def _examples():
    return get_task("arithmetic").make_dataset(64, seed=0, split="train")


def test_sft_pairs_end_with_eos_and_start_with_bos() -> None:
    _, tok = build_model("qwen2-1m", seed=0)
    (prompt, resp, mask), *_ = sft_examples(tok, _examples())
    assert prompt[0] == tok.bos_token_id and resp[-1] == tok.eos_token_id


def test_warm_start_learns_and_caches(tmp_path: Path) -> None:
    spec = WarmStartSpec("qwen2-1m", "arithmetic", seed=0, steps=30, lr=3e-3, batch_size=16)
    model, tok = build_model("qwen2-1m", seed=0)
    info = warm_start(model, tok, _examples(), spec, cache_dir=tmp_path)
    assert not info["cached"] and info["loss_last"] < info["loss_first"]
    again, _ = build_model("qwen2-1m", seed=0)
    info2 = warm_start(again, tok, _examples(), spec, cache_dir=tmp_path)
    assert info2["cached"]
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    other = WarmStartSpec("qwen2-1m", "arithmetic", seed=1, steps=30, lr=3e-3, batch_size=16)
    assert other.cache_name() != spec.cache_name()


def test_zero_steps_is_a_no_op(tmp_path: Path) -> None:
    model, tok = build_model("qwen2-1m", seed=0)
    info = warm_start(model, tok, _examples(), WarmStartSpec("m", "t", 0, 0), tmp_path)
    assert info == {"cached": False, "duration_s": 0.0, "path": ""}
    assert not list(tmp_path.iterdir())


def test_tool_results_are_masked_out_of_multi_turn_demos() -> None:
    from jigsawrl.engine.warmstart import demo_tool_mask

    task = get_task("calculator")
    demo = "<calc>37*12</calc><r>444</r><calc>444+5</calc><r>449</r>A: 449"
    mask = demo_tool_mask(task, demo)
    masked = "".join(c for c, m in zip(demo, mask, strict=True) if m == 0)
    assert masked == "<r>444</r><r>449</r>"
    assert demo_tool_mask(get_task("arithmetic"), "12+7=19") == [1] * 7
    ex = task.make_dataset(4, seed=0, split="train")
    _, tok = build_model("qwen2-1m", seed=0)
    for _, resp, m in sft_examples(tok, ex, task):
        assert len(resp) == len(m) and 0 in m and m[-1] == 1
