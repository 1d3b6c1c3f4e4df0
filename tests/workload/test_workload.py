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
