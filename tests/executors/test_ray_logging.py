"""``run --ray`` logs like a single-pipeline run: TensorBoard event files per pipeline.

One tiny two-pipeline real run (1 step each, the fixtures of conftest.py: a local Ray and the
session's warm-start cache), ~15 s on 2 cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from jigsawrl.config import load_config  # noqa: E402
from jigsawrl.experiments.real import run_real  # noqa: E402


def test_ray_run_writes_tensorboard_per_pipeline(shared_ray: Any, cache: Path,
                                                 tmp_path: Path) -> None:
    sets = [f"pipelines.{i}.{k}={v}" for i in (0, 1) for k, v in (
        ("steps", 1), ("batch_size", 2), ("group_size", 2), ("train.warmup_steps", 2),
        ("train.threads", 1))]
    cfg = load_config("configs/real/multi.yaml", [*sets, "scheduler.name=verl-split"])
    cfg = cfg.model_copy(update={"pipelines": cfg.pipelines[:2]})
    seen: list[int] = []
    summary, _ = run_real(cfg, cache_dir=cache, out_dir=tmp_path,
                          on_progress=lambda done, total: seen.append(done))
    assert seen == [1, 2] and summary["failed_pipelines"] == []
    for p in cfg.pipelines:
        folder = tmp_path / "tb" / p.name
        assert list(folder.glob("events.out.tfevents.*")), f"no event file for {p.name}"
        acc = EventAccumulator(str(folder))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"critic/score/mean", "actor/pg_loss", "timing_s/gen", "timing_s/step"} <= tags
        (score,) = acc.Scalars("critic/score/mean")
        assert score.step == 0
        row = summary["pipeline_metrics"][p.name][0]
        assert score.value == pytest.approx(row["critic/score/mean"])
