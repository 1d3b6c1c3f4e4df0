"""Memory side of the cost model: bytes per device of weights, KV cache, training state, activations.

Why: whether two sub-stages can share a device depends on memory as much as on compute; a
rollout engine's KV budget bounds its running batch, and training a model on too few devices
is a configuration error that should be reported up front with the numbers. All results are
bytes *per device*. The formulas are standard mixed-precision accounting (ZeRO paper, Rajbhandari
et al. 2020: 16 bytes per parameter for bf16 params + grads, fp32 master copy and Adam m, v) and
activation accounting with per-layer checkpointing (Korthikanti et al. 2022, adapted to GQA and
SwiGLU); where a constant is assumed, :class:`~jigsawrl.costmodel.roofline.CostParams` says so.

:class:`MemoryCosts` is the cost model's memory side: these functions bound to its accelerator and
params.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jigsawrl.costmodel.core import CostCore
from jigsawrl.costmodel.roofline import CostParams, kv_bytes_per_token_per_device
from jigsawrl.workload.accelerators import AcceleratorSpec
from jigsawrl.workload.models import BF16_BYTES, ModelSpec

if TYPE_CHECKING:
    from jigsawrl.costmodel.protocol import CostModelProtocol

GB = 1e9
# bf16 param (2) + bf16 grad (2) + fp32 master param (4) + fp32 Adam m (4) + fp32 Adam v (4).
TRAIN_STATE_BYTES_PER_PARAM = 16.0


def rollout_weight_bytes(model: ModelSpec, tp: int) -> float:
    """bf16 weights of a rollout engine, split evenly over its ``tp`` devices."""
    return model.weight_bytes() / tp


def kv_bytes(model: ModelSpec, tokens: float, tp: int) -> float:
    """KV cache of ``tokens`` tokens (bf16) on one device of a TP group of ``tp``."""
    return kv_bytes_per_token_per_device(model, tp) * tokens


def kv_budget_tokens(model: ModelSpec, tp: int, mem_bytes: float) -> int:
    """How many KV tokens fit in ``mem_bytes`` on each device of a TP group (0 if none)."""
    if mem_bytes <= 0:
        return 0
    return int(mem_bytes // kv_bytes_per_token_per_device(model, tp))


def response_kv_room(cost: CostModelProtocol, model: ModelSpec, tp: int,
                     max_response_tokens: int, hbm_bytes: float,
                     gpu_memory_utilization: float) -> tuple[float, float]:
    """(KV memory a rollout engine of TP ``tp`` has per device, what one response of
    ``max_response_tokens`` and a prompt's worth of context needs there): a rollout TP with
    the first below the second cannot run the config."""
    budget = gpu_memory_utilization * hbm_bytes - cost.rollout_weight_bytes(model, tp)
    return budget, cost.kv_bytes(model, max_response_tokens + 512, tp)


def train_state_bytes(model: ModelSpec, n_devices: int) -> float:
    """Parameters, gradients and Adam state (~16 B/param), sharded ZeRO-3 style over n_devices."""
    return TRAIN_STATE_BYTES_PER_PARAM * model.num_params / n_devices


def _layer_activation_elems_per_token(model: ModelSpec) -> float:
    """Elements one layer keeps for its backward pass, per token (no checkpointing).

    Attention: norm input, QKV input, Q, K, V, attention output (flash attention keeps no score
    matrix), output-projection input, residual. SwiGLU MLP: norm input, MLP input, gate, up and
    activated products. A simplification of Korthikanti et al. (2022) for GQA + SwiGLU.
    """
    h = model.hidden_size
    q = model.num_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    attention = 3 * h + q + 2 * kv + 2 * q
    mlp = 2 * h + 3 * model.intermediate_size
    return float(attention + mlp)


def activation_bytes(model: ModelSpec, micro_batch_tokens: int, n_devices: int,
                     params: CostParams | None = None) -> float:
    """Peak activation and working memory of one training micro-batch, per device.

    Assumes activation checkpointing per layer (as verl enables by default): every layer keeps
    only its bf16 input, and one layer at a time is recomputed with its full activations. Adds
    the logits of the micro-batch (``params.logits_bytes_per_entry`` bytes per vocabulary entry)
    and, when ``n_devices > 1``, FSDP's all-gathered bf16 parameters of two layers (the current
    one and the prefetched next one). ``micro_batch_tokens`` is per device.
    """
    p = params or CostParams()
    t = float(micro_batch_tokens)
    checkpoints = model.num_layers * t * model.hidden_size * BF16_BYTES
    recompute = t * _layer_activation_elems_per_token(model) * BF16_BYTES
    logits = t * model.vocab_size * p.logits_bytes_per_entry
    gathered = 0.0
    if n_devices > 1:
        gathered = 2.0 * model.weight_bytes() / model.num_layers
    return checkpoints + recompute + logits + gathered


def training_bytes_per_device(model: ModelSpec, n_devices: int,
                              params: CostParams | None = None) -> float:
    """Train state + activations of one default micro-batch + the reserve, per device."""
    p = params or CostParams()
    return (train_state_bytes(model, n_devices)
            + activation_bytes(model, p.train_micro_batch_tokens, n_devices, p)
            + p.mem_reserve_bytes)


def fits_training(model: ModelSpec, accel: AcceleratorSpec, n_devices: int,
                  params: CostParams | None = None) -> tuple[bool, str]:
    """Whether training ``model`` over ``n_devices`` fits in device memory, and why not if not.

    Returns ``(True, "")`` or ``(False, reason)`` where the reason states the bytes needed, the
    bytes available, and the smallest number of devices that would fit (without CPU offload).
    """
    if n_devices < 1:
        return False, f"n_devices must be >= 1, got {n_devices}"
    p = params or CostParams()
    need = training_bytes_per_device(model, n_devices, p)
    if need <= accel.hbm_bytes:
        return True, ""
    min_devices = _min_training_devices(model, accel, p)
    if min_devices is None:
        hint = "use a smaller micro-batch (cost.train_micro_batch_tokens) or CPU offload"
    else:
        hint = f"use at least {min_devices} devices (or offload optimizer state to the host)"
    act = activation_bytes(model, p.train_micro_batch_tokens, n_devices, p)
    plural = "device" if n_devices == 1 else "devices"
    reason = (
        f"{model.name} needs {need / GB:.1f} GB per device for training on {n_devices} {plural} "
        f"(train state {train_state_bytes(model, n_devices) / GB:.1f} GB + activations "
        f"{act / GB:.1f} GB for {p.train_micro_batch_tokens} tokens + "
        f"{p.mem_reserve_bytes / GB:.0f} GB reserve), "
        f"{accel.name} has {accel.hbm_bytes / GB:.0f} GB; {hint}"
    )
    return False, reason


def _min_training_devices(model: ModelSpec, accel: AcceleratorSpec, p: CostParams,
                          limit: int = 4096) -> int | None:
    """Smallest device count (up to ``limit``) on which training fits, or None."""
    fixed = training_bytes_per_device(model, 2, p) - train_state_bytes(model, 2)
    room = accel.hbm_bytes - fixed
    if room <= 0:
        return None
    n = max(2, int(-(-TRAIN_STATE_BYTES_PER_PARAM * model.num_params // room)))
    return n if n <= limit else None


class MemoryCosts(CostCore):
    """Bytes per device of rollout weights, KV cache, train state and activations."""

    def rollout_weight_bytes(self, model: ModelSpec, tp: int) -> float:
        return rollout_weight_bytes(model, tp)

    def kv_bytes(self, model: ModelSpec, tokens: int, tp: int) -> float:
        return kv_bytes(model, tokens, tp)

    def kv_budget_tokens(self, model: ModelSpec, tp: int, mem_bytes: float) -> int:
        return kv_budget_tokens(model, tp, mem_bytes)

    def train_state_bytes(self, model: ModelSpec, n_devices: int) -> float:
        return train_state_bytes(model, n_devices)

    def activation_bytes(self, model: ModelSpec, micro_batch_tokens: int,
                         n_devices: int) -> float:
        return activation_bytes(model, micro_batch_tokens, n_devices, self.params)

    def fits_training(self, model: ModelSpec, n_devices: int) -> tuple[bool, str]:
        return fits_training(model, self.accel, n_devices, self.params)
