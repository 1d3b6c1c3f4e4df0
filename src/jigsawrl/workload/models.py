"""Model presets: the public architecture numbers of the paper's dense models.

Each entry is read from the model's ``config.json`` on its public Hugging Face model card
(named in ``source``). ``num_params`` is the published total parameter count (embeddings
included; tied embeddings counted once).
"""

from __future__ import annotations

from dataclasses import dataclass

BF16_BYTES = 2


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A dense decoder-only transformer as the cost model sees it."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_params: float
    source: str

    def kv_bytes_per_token(self, dtype_bytes: int = BF16_BYTES) -> float:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def weight_bytes(self, dtype_bytes: int = BF16_BYTES) -> float:
        return self.num_params * dtype_bytes

    def attn_flops_per_token_per_ctx(self) -> float:
        """Attention score + value FLOPs per (query token, context token) pair, all layers."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim


MODELS: dict[str, ModelSpec] = {
    "qwen3-0.6b": ModelSpec(
        name="qwen3-0.6b", num_layers=28, hidden_size=1024, num_heads=16, num_kv_heads=8,
        head_dim=128, intermediate_size=3072, vocab_size=151936, num_params=0.6e9,
        source="huggingface.co/Qwen/Qwen3-0.6B config.json; model card: 0.6B params",
    ),
    "qwen3-4b": ModelSpec(
        name="qwen3-4b", num_layers=36, hidden_size=2560, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=9728, vocab_size=151936, num_params=4.0e9,
        source="huggingface.co/Qwen/Qwen3-4B config.json; model card: 4.0B params",
    ),
    "qwen3-32b": ModelSpec(
        name="qwen3-32b", num_layers=64, hidden_size=5120, num_heads=64, num_kv_heads=8,
        head_dim=128, intermediate_size=25600, vocab_size=151936, num_params=32.8e9,
        source="huggingface.co/Qwen/Qwen3-32B config.json; model card: 32.8B params",
    ),
    "llama-3.1-8b": ModelSpec(
        name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, num_params=8.03e9,
        source="huggingface.co/meta-llama/Llama-3.1-8B config.json; model card: 8.03B params",
    ),
    "deepseek-r1-distill-qwen-14b": ModelSpec(
        name="deepseek-r1-distill-qwen-14b", num_layers=48, hidden_size=5120, num_heads=40,
        num_kv_heads=8, head_dim=128, intermediate_size=13824, vocab_size=152064,
        num_params=14.8e9,
        source="huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-14B config.json "
        "(Qwen2.5-14B architecture); 14.8B params",
    ),
}
