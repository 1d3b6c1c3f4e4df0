"""The engine's small-model presets as data: architecture numbers of the ~1M-50M-parameter
causal LMs that :mod:`jigsawrl.engine.models` builds in code.

Why here and not in the engine: the cost model and the schedulers size real runs from these
numbers (:func:`jigsawrl.workload.realpresets.engine_model_spec`) and must not import torch to
read a table of integers (DESIGN.md §4: band 1 is torch-free).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class EngineModelPreset:
    """Architecture numbers of one small model; the size is for the 100-token char vocabulary."""

    family: str  # "qwen2" | "qwen3" | "llama"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int = 2048
    approx_params: float = 0.0  # with the 100-token vocabulary, tied embeddings counted once
    extra: dict[str, Any] = field(default_factory=dict)


ENGINE_MODELS: dict[str, EngineModelPreset] = {
    # ~1.0M params: 4 layers x 128 wide, GQA 4/2 heads (the "learns addition in minutes" size).
    "qwen2-1m": EngineModelPreset("qwen2", 128, 4, 4, 2, 512, approx_params=1.0e6),
    # ~10.4M params: 6 layers x 384 wide, GQA 6/2 heads.
    "qwen2-10m": EngineModelPreset("qwen2", 384, 6, 6, 2, 1152, approx_params=10.4e6),
    # ~50.4M params: 8 layers x 768 wide, GQA 12/4 heads.
    "qwen2-50m": EngineModelPreset("qwen2", 768, 8, 12, 4, 2048, approx_params=50.4e6),
    # ~1.0M params: Qwen3 (q/k norms, no qkv bias) at the qwen2-1m shape.
    "qwen3-1m": EngineModelPreset("qwen3", 128, 4, 4, 2, 512, approx_params=1.0e6),
    # ~1.0M params: Llama (no qkv bias) at the qwen2-1m shape.
    "llama-1m": EngineModelPreset("llama", 128, 4, 4, 2, 512, approx_params=1.0e6),
}
