"""Per-step metric loggers: ``trainer.logger`` validation, the dispatch to console, TensorBoard
and W&B (a fake ``wandb`` module, and the real one offline when installed)."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from jigsawrl.config import load_config
from jigsawrl.errors import ConfigError
from jigsawrl.events import StepFinished
from jigsawrl.experiments.loggers import StepFeed, Tracking, log_step_timings, scalars


def cfg(*logger: str, name: str = "logs") -> Any:
    return load_config(data={"name": name, "trainer": {"logger": list(logger),
                                                       "project_name": "proj"},
                             "pipelines": [{"name": "a", "model": "qwen2-1m", "task": "arithmetic"},
                                           {"name": "b", "model": "qwen2-1m", "task": "search"}]})


def test_trainer_logger_is_validated_in_verls_spelling() -> None:
    assert load_config("configs/real/multi.yaml").trainer.logger == ["console", "tensorboard"]
    one = load_config("configs/real/multi.yaml", ["trainer.logger=wandb"])
    assert one.trainer.logger == ["wandb"]  # a single name, as verl accepts
    both = load_config("configs/real/multi.yaml", ["trainer.logger=[console,wandb,console]"])
    assert both.trainer.logger == ["console", "wandb"]
    with pytest.raises(ConfigError, match=r"trainer\.logger: unknown logger 'tensorbord' "
                                          r"\(did you mean 'tensorboard'\?\); allowed: "
                                          r"console, tensorboard, wandb"):
        load_config("configs/real/multi.yaml", ["trainer.logger=[console,tensorbord]"])
    with pytest.raises(ConfigError, match=r"trainer\.logger: unknown logger 'mlflow'"):
        load_config("configs/real/multi.yaml", ["trainer.logger=[mlflow]"])


class FakeRun:
    def __init__(self, **kwargs: Any) -> None:
        self.init = kwargs
        self.defined: list[tuple[str, str | None]] = []
        self.rows: list[dict[str, float]] = []
        self.finished = False

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        self.defined.append((name, step_metric))

    def log(self, row: dict[str, float]) -> None:
        self.rows.append(dict(row))

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[FakeRun]:
    runs: list[FakeRun] = []
    module = types.ModuleType("wandb")

    def init(**kwargs: Any) -> FakeRun:
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    module.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


def test_dispatch_sends_each_step_to_every_backend(fake_wandb: list[FakeRun], tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jigsawrl.experiments.loggers")
    with Tracking.from_config(cfg("console", "wandb"), tmp_path) as tracking:
        tracking.log("b", 1, {"step": 1, "critic/score/mean": 0.5, "note": "text"})
        tracking.log("a", 0, {"critic/score/mean": 0.25, "actor/pg_loss": -0.1})
        tracking.log("a", 2, {})  # nothing numeric: nothing logged
    (run,) = fake_wandb
    assert run.init["project"] == "proj" and run.init["name"] == "logs"
    assert run.init["dir"] == str(tmp_path) and run.init["config"]["trainer"]["project_name"]
    assert ("a/*", "a/step") in run.defined and ("b/*", "b/step") in run.defined
    assert run.rows == [{"b/critic/score/mean": 0.5, "b/step": 1},
                        {"a/critic/score/mean": 0.25, "a/actor/pg_loss": -0.1, "a/step": 0}]
    assert run.finished
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["b step 1: critic/score/mean=0.5",
                     "a step 0: actor/pg_loss=-0.1  critic/score/mean=0.25"]


def test_missing_wandb_fails_before_the_run_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match=r"trainer\.logger: .*wandb.*\n.*\[wandb\]"):
        Tracking.from_config(cfg("console", "wandb"), None)
    assert Tracking.from_config(cfg("console"), None).backends  # not asked for: no error


def test_tensorboard_writes_one_folder_per_pipeline(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Tracking.from_config(cfg("tensorboard"), tmp_path) as tracking:
        feed = StepFeed(tracking)
        feed.feed({"a": [{"step": 0, "critic/score/mean": 0.1}], "b": []})
        feed.feed({"a": [{"step": 0, "critic/score/mean": 0.1},
                         {"step": 1, "critic/score/mean": 0.3}],
                   "b": [{"step": 0, "critic/score/mean": 0.7}]})  # rows logged once each
        log_step_timings(tracking, [StepFinished("a", 0, 0.0, 2.0, {"gen": 1.5, "step": 2.0})],
                         offsets={"a": 5})
    assert Tracking.from_config(cfg("tensorboard"), None).backends == []  # no folder: none
    acc = EventAccumulator(str(tmp_path / "tb" / "a"))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("critic/score/mean")] == [
        (0, 0.1), (1, 0.3)]
    assert [(e.step, e.value) for e in acc.Scalars("timing_s/gen")] == [(5, 1.5)]
    acc_b = EventAccumulator(str(tmp_path / "tb" / "b"))
    acc_b.Reload()
    assert [e.step for e in acc_b.Scalars("critic/score/mean")] == [0]


def test_scalars_keeps_numbers_only() -> None:
    assert scalars({"step": 3, "x": 1, "y": 0.5, "ok": True, "s": "t"}) == {"x": 1.0, "y": 0.5}


def test_real_wandb_offline_writes_a_local_run(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """WANDB_MODE=offline: the run is written under the output folder, no network, no key."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with Tracking.from_config(cfg("wandb"), tmp_path) as tracking:
        tracking.log("a", 0, {"critic/score/mean": 0.25})
        tracking.log("b", 0, {"critic/score/mean": 0.75})
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
