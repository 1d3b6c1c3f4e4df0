"""The pipelines one device worker hosts, shared by its rollout side and its train side.

What: every pipeline's spec, its rollout-only copy on this device (task, tokenizer, rollout
engine; built on first use) on the torch device it runs on (:func:`worker_device`), the
per-pipeline locks that keep a weight sync (which runs beside a
rollout slice, in the worker's "control" concurrency group) from reading a train state being
changed, and the worker's wall clock.

Imported only inside a worker process (``executors/raycluster/worker.py``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any


def spec_from_json(spec_json: str) -> Any:
    """A ``PipelineSpec`` sent as JSON (imported lazily: the worker process builds it)."""
    from jigsawrl.config import PipelineSpec

    return PipelineSpec.model_validate_json(spec_json)


def ray_gpus_assigned() -> bool | None:
    """Whether Ray assigned this worker process a GPU (None: not in a Ray worker)."""
    try:
        import ray

        return bool(ray.get_gpu_ids()) if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - no runtime context (in-process use)
        return None


def worker_device(spec: Any) -> Any:
    """The torch device of a pipeline's models on this worker: ``train.device`` where ``auto``
    is a CUDA GPU exactly when Ray assigned this worker one (``cuda:0``: Ray sets
    ``CUDA_VISIBLE_DEVICES`` to it), else the CPU (``engine/device.py``)."""
    from jigsawrl.engine.device import resolve_device

    return resolve_device(spec.train.device, gpus_assigned=ray_gpus_assigned(),
                          where=f"pipelines[{spec.name}].train.device")


def wall_now() -> float:
    """Wall clock: comparable between the driver and the workers of one machine."""
    return time.time()


class LocalPipelines:
    """The pipelines of one device worker.

    Args:
        device: the device index (for logs and errors).
        specs_json: pipeline name -> its ``PipelineSpec`` as JSON.
        seed: the experiment seed.
        cache_dir: warm-start cache (None: the engine's default).
        offsets: pipeline name -> steps already done before this run (``--resume``).
    """

    def __init__(self, device: int, specs_json: dict[str, str], seed: int,
                 cache_dir: str | None = None, offsets: dict[str, int] | None = None) -> None:
        self.device = device
        self.specs = {name: spec_from_json(js) for name, js in specs_json.items()}
        self.seed = seed
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.offsets = dict(offsets or {})
        self.pipes: dict[str, Any] = {}  # name -> RealPipeline (rollout-only or with trainer)
        self.locks = {name: threading.Lock() for name in self.specs}

    def get(self, name: str) -> Any:
        """The pipeline's copy here (rollout-only unless its trainer was built), built on first
        use."""
        pipe = self.pipes.get(name)
        if pipe is None:
            from jigsawrl.engine.pipeline import RealPipeline

            spec = self.specs[name]
            pipe = RealPipeline(spec, self.seed, cache_dir=self.cache_dir,
                                device=worker_device(spec))
            pipe.start(train=False)
            self.pipes[name] = pipe
        return pipe

    def with_trainer(self, name: str, what: str) -> Any:
        """The pipeline's copy holding its train state here.

        Raises:
            RuntimeError: ``what`` (e.g. "no train state of 'x' to offload") when it is not here.
        """
        pipe = self.pipes.get(name)
        if pipe is None or not pipe.has_trainer:
            raise RuntimeError(f"device {self.device}: {what}")
        return pipe

    def absolute_step(self, name: str, step: int) -> int:
        """A step of this run as the pipeline counts it (steps done before a resume included)."""
        return step + self.offsets.get(name, 0)
