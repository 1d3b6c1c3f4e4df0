"""Which torch device a Ray device worker puts a pipeline's models on (engine/device.py): a
GPU exactly when Ray assigned the worker one, the CPU otherwise (no Ray started here)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jigsawrl.config import PipelineSpec  # noqa: E402
from jigsawrl.errors import ConfigError  # noqa: E402
from jigsawrl.executors.raycluster import worker_pipes  # noqa: E402


def _spec(device: str = "auto") -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "p", "model": "qwen2-1m", "task": "arithmetic",
                                        "train": {"device": device}})


@pytest.mark.parametrize(("assigned", "available", "want"), [
    (False, True, "cpu"),    # a GPU node, but Ray gave this worker no GPU
    (True, True, "cuda:0"),  # Ray's CUDA_VISIBLE_DEVICES makes the assigned GPU cuda:0
    (None, False, "cpu"),    # not in a Ray worker (in-process use), no GPU
])
def test_worker_device_follows_ray_gpu_assignment(monkeypatch: pytest.MonkeyPatch,
                                                  assigned: bool | None, available: bool,
                                                  want: str) -> None:
    monkeypatch.setattr(worker_pipes, "ray_gpus_assigned", lambda: assigned)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(available))
    assert worker_pipes.worker_device(_spec()) == torch.device(want)


def test_an_assigned_gpu_torch_cannot_use_names_the_pipeline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_pipes, "ray_gpus_assigned", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA") as err:
        worker_pipes.worker_device(_spec())
    assert "pipelines[p].train.device" in str(err.value.where)
    assert worker_pipes.worker_device(_spec("cpu")) == torch.device("cpu")


def test_outside_a_ray_worker_nothing_is_assigned() -> None:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray of another test module is up in this process")
    assert worker_pipes.ray_gpus_assigned() is None
