"""The warm-up train pass: the largest batch a step builds, on a scratch copy (weights kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from jigsawrl.config import PipelineSpec  # noqa: E402
from jigsawrl.engine.pipeline import RealPipeline  # noqa: E402
from jigsawrl.engine.shared_prompt import prompt_groups  # noqa: E402
from jigsawrl.engine.warmup import peak_batch, peak_shape, warm_train_peak  # noqa: E402

torch.set_num_threads(1)


def _pipe(tmp: Path, kl_coef: float = 0.0) -> RealPipeline:
    spec = PipelineSpec.model_validate({
        "name": "w", "model": "qwen2-1m", "task": "arithmetic", "batch_size": 3,
        "group_size": 2, "steps": 4, "max_response_tokens": 12,
        "train": {"warmup_steps": 2, "threads": 1, "eval_size": 0, "kl_coef": kl_coef}})
    pipe = RealPipeline(spec, seed=0, cache_dir=tmp / "cache")
    pipe.start(train=False)
    return pipe


def test_peak_shape_bounds_every_step(tmp_path: Path) -> None:
    pipe = _pipe(tmp_path)
    rows, prompt, response = peak_shape(pipe)
    assert rows == 6 and response == pipe.max_new_tokens == 12
    longest = max(len(req.prompt_ids) for step in range(4) for _, req in pipe.step_requests(step))
    assert prompt >= longest


def test_peak_batch_has_the_steps_groups() -> None:
    batch = peak_batch(rows=8, group_size=4, prompt_tokens=5, response_tokens=3, tokens=(1, 2),
                       pad_id=0)
    assert tuple(batch.input_ids.shape) == (8, 8)
    assert batch.prompt_lens is not None and batch.prompt_lens.tolist() == [5] * 8
    groups = prompt_groups(batch.input_ids, batch.prompt_lens)
    assert len(groups.heads) == 2  # two prompts, four rows each, as a step's groups
    assert float(batch.loss_mask.sum()) == 8 * 3


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_warm_pass_leaves_the_pipeline_untouched(tmp_path: Path, kl_coef: float) -> None:
    """Also with a KL term (a rollout-only copy has no reference: the scratch pass runs
    without one; it raised in every Ray worker's start-up before)."""
    pipe = _pipe(tmp_path, kl_coef)
    before = {k: v.clone() for k, v in pipe.engine.model.state_dict().items()}
    assert warm_train_peak(pipe) > 0
    after = pipe.engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
