"""The main job (`make demo`, configs/real/demo.yaml) learns: a rising correctness reward.

Why two tests: the learning check runs the demo's three recipes to the end at two seeds (minutes
of CPU, so ``slow``); the fast check guards what makes that result mean something — every
pipeline's reward is correctness only (``format_score: 0``), and each quarter of a run has enough
steps and samples for a 0.1 gain not to be noise of a step or two.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jigsawrl.config import load_config

DEMO = Path(__file__).parents[2] / "configs" / "real" / "demo.yaml"
MIN_GAIN = 0.1  # the bar: last quarter's mean correctness >= first quarter's + 0.1


def quarter_gain(curve: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter of a per-step reward curve (at least 1 step)."""
    q = max(1, len(curve) // 4)
    return sum(curve[:q]) / q, sum(curve[-q:]) / q


def test_quarter_gain_reads_quarters() -> None:
    first, last = quarter_gain([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5])
    assert (first, last) == (0.0, 0.5)


def test_demo_rewards_are_correctness_only() -> None:
    cfg = load_config(DEMO, [])
    assert len(cfg.pipelines) == 3
    for p in cfg.pipelines:
        assert p.rollout.task_params.get("format_score") == 0.0, p.name
        assert p.steps >= 16 and p.batch_size * p.group_size >= 64, p.name


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("seed", [0, 1])
def test_demo_recipes_raise_correctness(seed: int) -> None:
    """Each demo pipeline, run alone (no Ray; same prompts and sampling seeds as under Ray),
    gains >= 0.1 mean correctness from its first to its last quarter of steps."""
    pytest.importorskip("torch")
    from jigsawrl.experiments.sequential import run_experiment

    cfg = load_config(DEMO, [f"seed={seed}"])
    summary = run_experiment(cfg, None)
    for p in summary["pipelines"]:
        first, last = quarter_gain(p["reward_mean_per_step"])
        assert last >= first + MIN_GAIN, f"{p['name']} seed {seed}: {first:.3f} -> {last:.3f}"
