"""Where the engine's tensors live: the one place that turns a device setting into a device.

What: :func:`resolve_device` maps a pipeline's ``train.device`` (``auto``, ``cpu``, ``cuda``,
``cuda:N``) to a ``torch.device``. ``auto`` is CUDA when torch sees a GPU, else the CPU; under
Ray a device worker passes ``gpus_assigned`` (whether Ray gave it a GPU, ``ray.get_gpu_ids()``),
and ``auto`` is then CUDA exactly when it did — Ray sets ``CUDA_VISIBLE_DEVICES`` to the
assigned GPU, so it is ``cuda:0`` in that process — and the CPU otherwise, even on a GPU node.
:func:`to_device` and :func:`to_host` move tensors, dicts, lists and dataclasses (a
``TrainBatch``, an optimizer state dict) in one call: ``to_device`` onto the engine's device
(what arrives from another process is on the CPU: ``executors/raycluster/wire.py``), ``to_host``
onto the CPU before anything leaves the process or is written to disk.

Why the sampling generators stay on the CPU (``engine/sampling.py``): a request draws one uniform
number per token from its own ``torch.Generator``; on the CPU those draws are the same on every
device and the generator's state exports as bytes with the request, so a request migrated between
a GPU worker and a CPU worker draws what it would have drawn. Weights are built on the CPU with a
forked, seeded RNG (``models.build_model``) and then moved, so a preset's initial weights do not
depend on the device either.

The CPU path is unchanged by design: moving a CPU tensor to the CPU returns it as it is.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from jigsawrl.errors import ConfigError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")
_SPEC = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def resolve_device(spec: str | torch.device = "auto", *, gpus_assigned: bool | None = None,
                   where: str = "train.device") -> torch.device:
    """The device a pipeline's engine runs on.

    Args:
        spec: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        gpus_assigned: under Ray, whether the worker was assigned a GPU; ``auto`` then follows
            it (None: not under Ray, ``auto`` follows ``torch.cuda.is_available()``).
        where: the config key named in errors.

    Raises:
        ConfigError: an unknown spec, or CUDA asked for (or assigned by Ray) where torch sees no
            GPU or fewer GPUs than the index.
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    text = str(spec).strip().lower()
    if not _SPEC.match(text):
        raise ConfigError(f"unknown device {spec!r}", where=where,
                          fix=f"use one of {', '.join(DEVICE_CHOICES)}")
    if text == "auto":
        if gpus_assigned is None:
            text = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            text = "cuda" if gpus_assigned else "cpu"
            where = f"{where} (auto: Ray assigned this worker a GPU)"
    if text == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {text!r} asked for, but torch sees no CUDA device "
                          f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})",
                          where=where,
                          fix="use 'auto' or 'cpu', or install a CUDA build of torch on a machine "
                              "with a GPU")
    index = int(text.split(":")[1]) if ":" in text else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"device {text!r} asked for, but torch sees {count} CUDA device(s)",
                          where=where, fix=f"use cuda:0..cuda:{count - 1} or 'auto'")
    return torch.device("cuda", index)


def to_device(obj: Any, device: torch.device | str) -> Any:
    """``obj`` with every tensor in it on ``device`` (dicts, lists and tuples rebuilt; a
    dataclass instance, e.g. a ``TrainBatch``, updated in place and returned). Tensors already
    there are returned as they are (no copy)."""
    return _map_tensors(obj, lambda t: t.to(device))


def to_host(obj: Any, *, copy: bool = False) -> Any:
    """``obj`` with every tensor in it detached and on the CPU (what crosses a process or goes
    to disk). ``copy``: always a fresh copy, also of CPU tensors (a snapshot that later updates
    in place do not change)."""
    return _map_tensors(obj, lambda t: t.detach().to("cpu", copy=copy))


def _map_tensors(obj: Any, fn: Any) -> Any:
    """``obj`` with ``fn`` applied to each tensor in it; a container none of whose tensors
    changed is returned as it is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        items = [(k, v, _map_tensors(v, fn)) for k, v in obj.items()]
        if all(m is v for _, v, m in items):
            return obj
        out = type(obj)((k, m) for k, _, m in items)
        if hasattr(obj, "_metadata"):  # a module's state dict: keep its version metadata
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list | tuple) and not hasattr(obj, "_fields"):
        moved = [_map_tensors(v, fn) for v in obj]
        if all(m is v for m, v in zip(moved, obj, strict=True)):
            return obj
        return type(obj)(moved)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            moved = _map_tensors(value, fn)
            if moved is not value:
                object.__setattr__(obj, f.name, moved)
        return obj
    return obj


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (the CPU for a model without any)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): call before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
