"""How torch tensors cross Ray process boundaries: as numpy buffers, not as pickled storages.

Ray pickles a ``torch.Tensor`` through torch's own ``__reduce_ex__``, which writes every storage
through ``torch.save`` into a byte string: ~30 ms for a ~1M-parameter model's 3.9 MB state dict
on this project's 2-core CPU machine, paid on every put and again on every get. A numpy array, on
the other hand, travels as an out-of-band pickle-5 buffer that Ray copies once into its object
store (~2 ms for the same bytes; measured in ``docs/RAY.md``). Weights published after every
update, train states moved between devices, data-parallel payloads and gradients are all tensor
dicts, so every policy's critical path pays this on every step.

:func:`use_numpy_wire` registers a serializer for ``torch.Tensor`` in the calling process (Ray
applies a registered serializer only in the process that registered it, so the driver and every
worker actor call it). The receiving side needs no registration: the deserializer is a
module-level function that pickle finds by name. Received tensors are copied out of the object
store's read-only buffer, so they are ordinary, writable, owned tensors.

What is kept: values, dtype (bfloat16 and other dtypes numpy lacks travel as same-width integer
views), shape, ``requires_grad``. What is not: the device (tensors arrive on the CPU; a worker
moves what it receives onto its engine's device, ``engine/device.py``) and views' sharing with other tensors (each tensor arrives as its
own contiguous copy, as with the default pickling of a state dict's distinct tensors). Sparse,
quantized and other non-strided tensors fall back to ``torch.save`` bytes.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

_REGISTERED = False

# torch dtypes numpy cannot hold, sent as integer views of the same width
_VIEW_AS = {"bfloat16": "int16", "float8_e4m3fn": "int8", "float8_e5m2": "int8"}


def tensor_to_wire(t: Any) -> tuple[str, Any, bool]:
    """``(dtype name, payload, requires_grad)``: a numpy array where numpy can hold the data,
    else ``torch.save`` bytes (payload type tells :func:`tensor_from_wire` which)."""
    import torch

    dtype = str(t.dtype).removeprefix("torch.")
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        buf = io.BytesIO()
        torch.save(t.detach().cpu(), buf)
        return dtype, buf.getvalue(), t.requires_grad
    data = t.detach().cpu().contiguous()
    if dtype in _VIEW_AS:
        data = data.view(getattr(torch, _VIEW_AS[dtype]))
    return dtype, data.numpy(), t.requires_grad


def tensor_from_wire(wire: tuple[str, Any, bool]) -> Any:
    """The tensor :func:`tensor_to_wire` described, as a fresh writable CPU tensor."""
    import torch

    dtype, payload, requires_grad = wire
    if isinstance(payload, bytes):
        t = torch.load(io.BytesIO(payload), weights_only=True)
    else:
        t = torch.from_numpy(np.array(payload, copy=True))
        if dtype in _VIEW_AS:
            t = t.view(getattr(torch, dtype))
    if requires_grad:
        t.requires_grad_(True)
    return t


def use_numpy_wire() -> None:
    """Register the numpy wire format for ``torch.Tensor`` in this process (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    import ray
    import torch

    ray.util.register_serializer(torch.Tensor, serializer=tensor_to_wire,
                                 deserializer=tensor_from_wire)
    _REGISTERED = True
