"""Per-step metric logging of real runs: console, TensorBoard and Weights & Biases, one module.

What: :class:`Tracking` (verl's name for its multi-backend logger) sends each pipeline's metrics
of each finished step to the backends named in ``trainer.logger`` (:data:`jigsawrl.config.LOGGERS`):

- ``console``: one INFO log line per step (``jigsawrl -v`` shows it; the CLI's progress bar
  shows the reward either way);
- ``tensorboard``: ``<out>/tb/<pipeline>/`` event files, one folder per pipeline so that
  TensorBoard draws the pipelines as separate runs on the same charts, scalars under verl's
  names (``critic/score/mean``, ``actor/pg_loss``, ``timing_s/gen``, ...); nothing without an
  output folder;
- ``wandb``: one W&B run per experiment (``trainer.project_name``, the run's name), each
  pipeline's keys prefixed ``<pipeline>/`` and plotted against its own ``<pipeline>/step``
  (pipelines finish steps in any order under a multiplexing policy). ``WANDB_MODE=offline``
  writes under ``<out>/wandb`` with no network, as wandb itself documents.

Both ways of running use it: ``experiments/sequential.py`` logs each step as it returns;
``experiments/real.py`` logs the executor's per-step metrics after every step the driver
finishes (:class:`StepFeed`) and the driver's verl stage timings (``timing_s/*``) when the run
ends, because only the driver's events carry them.

Why a small module of our own instead of verl's ``Tracking``: verl is not a dependency, and the
three backends are a few lines each. TensorBoard needs the ``tensorboard`` package (engine
extra; without it a warning and no event files, as before); W&B is the optional ``wandb`` extra
and is asked for explicitly, so its absence is an error before the run starts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from jigsawrl.config import LOGGERS, ExperimentConfig
from jigsawrl.errors import ConfigError
from jigsawrl.events import Event, StepFinished

log = logging.getLogger(__name__)

TB_DIR = "tb"


class Backend(Protocol):
    """One destination of metrics."""

    def log(self, pipeline: str, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics row (``step`` and non-numbers dropped)."""
    return {k: float(v) for k, v in metrics.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)}


class ConsoleBackend:
    """One INFO line per pipeline step (library code logs; the CLI decides what is shown)."""

    def log(self, pipeline: str, step: int, metrics: Mapping[str, float]) -> None:
        text = "  ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if math.isfinite(v))
        log.info("%s step %d: %s", pipeline, step, text)

    def close(self) -> None:
        return None


class TensorBoardBackend:
    """A ``SummaryWriter`` per pipeline under ``<out>/tb/<pipeline>``, opened at its first step."""

    def __init__(self, out_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # ImportError: see make_backend

        self._writer_cls = SummaryWriter
        self.root = Path(out_dir) / TB_DIR
        self.writers: dict[str, Any] = {}

    def log(self, pipeline: str, step: int, metrics: Mapping[str, float]) -> None:
        writer = self.writers.get(pipeline)
        if writer is None:
            writer = self.writers[pipeline] = self._writer_cls(log_dir=str(self.root / pipeline))
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)
        writer.flush()  # a user watching TensorBoard sees the step now

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()


class WandbBackend:
    """One W&B run; pipeline ``p``'s keys are ``p/<key>`` against the x-axis ``p/step``."""

    def __init__(self, project: str, name: str, pipelines: Sequence[str],
                 config: Mapping[str, Any] | None, out_dir: Path | None) -> None:
        import wandb  # ImportError: see make_backend

        kwargs: dict[str, Any] = {"project": project, "name": name, "config": dict(config or {})}
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            kwargs["dir"] = str(out_dir)
        self.run = wandb.init(**kwargs)
        for p in pipelines:
            self.run.define_metric(f"{p}/step")
            self.run.define_metric(f"{p}/*", step_metric=f"{p}/step")

    def log(self, pipeline: str, step: int, metrics: Mapping[str, float]) -> None:
        row = {f"{pipeline}/{k}": v for k, v in metrics.items()}
        row[f"{pipeline}/step"] = step
        self.run.log(row)

    def close(self) -> None:
        self.run.finish()


def make_backend(name: str, *, out_dir: Path | None, project: str, run_name: str,
                 pipelines: Sequence[str], config: Mapping[str, Any] | None) -> Backend | None:
    """The backend ``name`` (None: TensorBoard without an output folder or without the package).

    Raises:
        ConfigError: an unknown name, or ``wandb`` asked for and not installed.
    """
    if name == "console":
        return ConsoleBackend()
    if name == "tensorboard":
        if out_dir is None:
            log.debug("no output folder: no TensorBoard event files")
            return None
        try:
            return TensorBoardBackend(out_dir)
        except ImportError:  # tensorboard is in the engine extra; the run works without it
            log.warning("tensorboard is not installed: no TensorBoard scalars written")
            return None
    if name == "wandb":
        try:
            return WandbBackend(project, run_name, pipelines, config, out_dir)
        except ImportError:
            raise ConfigError("logger 'wandb' needs the wandb package, which is not installed",
                              where="trainer.logger",
                              fix="pip install -e '.[wandb]' (it does not change torch), or "
                                  "drop wandb from trainer.logger") from None
    raise ConfigError(f"unknown logger {name!r}", where="trainer.logger",
                      fix=f"use any of: {', '.join(LOGGERS)}")


class Tracking:
    """Sends each pipeline's step metrics to every configured backend (module docstring).

    Args:
        backends: the started backends (see :meth:`from_config`).
    """

    def __init__(self, backends: Iterable[Backend]) -> None:
        self.backends = list(backends)

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, out_dir: Path | None,
                    run_name: str | None = None) -> Tracking:
        """The backends of ``cfg.trainer.logger`` for a run writing to ``out_dir``.

        Raises:
            ConfigError: ``wandb`` asked for and not installed.
        """
        name = run_name or cfg.name or "run"
        config = cfg.model_dump(mode="json")
        made = [make_backend(b, out_dir=out_dir, project=cfg.trainer.project_name,
                             run_name=name, pipelines=[p.name for p in cfg.pipelines],
                             config=config) for b in cfg.trainer.logger]
        return cls(b for b in made if b is not None)

    def log(self, pipeline: str, step: int, metrics: Mapping[str, Any]) -> None:
        """Log one step of one pipeline (``step`` as the pipeline counts it, from 0)."""
        values = scalars(metrics)
        if not values:
            return
        for backend in self.backends:
            backend.log(pipeline, step, values)

    def close(self) -> None:
        """Flush and close every backend (safe to call twice)."""
        for backend in self.backends:
            backend.close()
        self.backends = []

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StepFeed:
    """Logs the rows of a growing ``pipeline -> [{"step": n, ...}, ...]`` mapping once each
    (the Ray executor's ``synced_metrics``: complete rows only), fed after every finished step."""

    def __init__(self, tracking: Tracking) -> None:
        self.tracking = tracking
        self.logged: set[tuple[str, int]] = set()

    def feed(self, rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """Log the rows not logged yet."""
        for pipeline, steps in rows.items():
            for row in steps:
                key = (pipeline, int(row["step"]))
                if key not in self.logged:
                    self.logged.add(key)
                    self.tracking.log(pipeline, key[1], row)


def log_step_timings(tracking: Tracking, events: Iterable[Event],
                     offsets: Mapping[str, int] | None = None) -> None:
    """Log the driver's verl stage timings of every finished step (``timing_s/gen``, ...,
    ``timing_s/step``) at the pipeline's absolute step (``offsets``: steps before a resume)."""
    for e in events:
        if isinstance(e, StepFinished):
            step = (offsets or {}).get(e.pipeline, 0) + e.step
            tracking.log(e.pipeline, step, {f"timing_s/{k}": v for k, v in e.timings_s.items()})
