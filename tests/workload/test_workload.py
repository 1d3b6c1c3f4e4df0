"""Task distributions and length traces (simulator truth)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jigsawrl.errors import InputError
from jigsawrl.workload.task_presets import TASKS, RequestSampler, load_length_trace


def sample(task: str, step: int = 0, drift: float = 0.0, seed: int = 0, cap: int = 8192):  # noqa: ANN201
    s = RequestSampler(TASKS[task], group_size=4, max_response_tokens=cap, drift_per_step=drift)
    return s.sample_step(np.random.default_rng(seed), "p", step, 64)


def test_lengths_long_tailed_capped_and_grouped() -> None:
    reqs = sample("math", cap=4096)
    gen = np.array([r.generated_tokens for r in reqs])
    assert len(reqs) == 256 and gen.max() <= 4096
    assert np.mean(gen) > np.median(gen)  # long tail
    assert all(r.prompt_tokens == reqs[4 * (i // 4)].prompt_tokens for i, r in enumerate(reqs))
    assert reqs[5].sample_id == "p/0/1/1"


def test_multi_turn_tasks_have_tools() -> None:
    reqs = sample("search-r1")
    turns = [len(r.turns) for r in reqs]
    assert max(turns) <= 4 and max(turns) > 1
    multi = [r for r in reqs if len(r.turns) > 1]
    assert all(t.tool_latency_s > 0 and t.tool_result_tokens > 0 for r in multi
               for t in r.turns[:-1])
    assert all(r.response_tokens > r.generated_tokens for r in multi)


def test_seeded_and_drift() -> None:
    assert sample("gsm8k", seed=1) == sample("gsm8k", seed=1)
    base = np.mean([r.generated_tokens for r in sample("gsm8k", step=10)])
    grown = np.mean([r.generated_tokens for r in sample("gsm8k", step=10, drift=0.05)])
    assert grown > 1.3 * base


def test_length_trace(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text("# prompt,response\n100,500\n2000\n")
    rows = load_length_trace(p)
    assert rows == [(100, 500), (128, 2000)]
    s = RequestSampler(TASKS["gsm8k"], group_size=2, max_response_tokens=1000, trace=rows)
    reqs = s.sample_step(np.random.default_rng(0), "p", 0, 8)
    assert {r.generated_tokens for r in reqs} <= {500, 1000}
    p.write_text("100,abc\n")
    with pytest.raises(InputError, match="line 1"):
        load_length_trace(p)


# ---------------------------------------------------------------- model and length presets

FAMILIES = {
    "qwen2.5": ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b",
                "qwen2.5-32b"),
    "qwen3": ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"),
    "llama": ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"),
}


def test_model_presets_of_the_families_users_run() -> None:
    from jigsawrl.workload.models import MODELS

    for names in FAMILIES.values():
        sizes = [MODELS[n].num_params for n in names]
        assert sizes == sorted(sizes)
    for m in MODELS.values():
        # the published count and the one the shape implies agree (embeddings counted once
        # when tied)
        assert m.architecture_params() == pytest.approx(m.num_params, rel=0.03), m.name
        assert m.source.startswith("huggingface.co/")
        assert m.num_heads % m.num_kv_heads == 0
    assert MODELS["qwen2-7b"].architecture_params() == MODELS["qwen2.5-7b"].architecture_params()
    assert MODELS["llama-3.2-1b"].tied_embeddings and not MODELS["llama-3.1-8b"].tied_embeddings


@pytest.mark.parametrize(("task", "cap", "mean", "clip"), [
    # reference/gpu-anchors.md "Response lengths in RL": non-thinking 7B-class on GSM8K at 1024:
    # mean 180-230, clip 0.0002-0.003
    ("gsm8k-instruct", 1024, (180, 230), (0.0002, 0.003)),
    # a Qwen3-8B DAPO run at 4096: mean 4,003, 90% at the cap; over half at 8192
    ("dapo-math", 4096, (3900, 4100), (0.85, 0.95)),
    ("dapo-math", 8192, (5000, 8192), (0.5, 0.65)),
    # anchor H: mean 14,255 at the 27,648 cap (thinking, DeepSeek-R1 distill)
    ("math-r1", 27648, (14000, 14500), (0.0, 0.2)),
])
def test_length_presets_match_the_published_statistics(task: str, cap: int, mean: tuple,
                                                       clip: tuple) -> None:
    import math

    from jigsawrl.workload.task_presets import capped_lognormal_mean, clip_ratio

    t = TASKS[task]
    sigma = math.hypot(t.response_sigma, t.prompt_difficulty_sigma)
    assert mean[0] <= capped_lognormal_mean(t.response_median, sigma, cap) <= mean[1]
    assert clip[0] <= clip_ratio(t.response_median, sigma, cap) <= clip[1]
    # and the sampler draws what the formulas say
    s = RequestSampler(t, group_size=4, max_response_tokens=cap)
    gen = np.array([r.generated_tokens for r in s.sample_step(np.random.default_rng(0), "p", 0,
                                                              1000)])
    assert mean[0] * 0.93 <= gen.mean() <= mean[1] * 1.07
    assert "thinking" in t.description or "instruct" in t.description


def test_lognormal_for_inverts_the_statistics() -> None:
    from jigsawrl.workload.task_presets import capped_lognormal_mean, clip_ratio, lognormal_for

    m, s = lognormal_for(1024, mean=183, clip=0.003)
    assert capped_lognormal_mean(m, s, 1024) == pytest.approx(183, rel=1e-3)
    assert clip_ratio(m, s, 1024) == pytest.approx(0.003, rel=1e-3)
    m, s = lognormal_for(192, median=140, clip=0.14)
    assert (m, clip_ratio(m, s, 192)) == (140, pytest.approx(0.14))
    m, s = lognormal_for(4096, mean=859, sigma=0.7)
    assert capped_lognormal_mean(m, s, 4096) == pytest.approx(859, rel=1e-3)
    with pytest.raises(ValueError, match="exactly two"):
        lognormal_for(1024, mean=100)
    with pytest.raises(ValueError):
        lognormal_for(100, mean=500, sigma=0.5)  # no capped mean above the cap
