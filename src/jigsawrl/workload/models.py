"""Model presets: the public architecture numbers of the dense models users train with RL.

Each entry is read from the model's ``config.json`` on its public Hugging Face model card
(named in ``source``): layers, hidden size, attention and KV heads, head size, MLP size,
vocabulary, whether the input and output embeddings are tied, whether q/k/v carry a bias.
``num_params`` is the published total parameter count (embeddings included; tied embeddings
counted once); :meth:`ModelSpec.architecture_params` recomputes it from the shape, and a test
keeps the two within 3%.

Families: Qwen2.5 (0.5B–32B; Qwen2-7B shares Qwen2.5-7B's shape), Qwen3 dense (0.6B–32B),
Llama-3.2 (1B, 3B), Llama-3.1-8B, and the DeepSeek-R1 distills of Qwen2.5 (1.5B, 14B). Only the
architecture is here: whether a model *thinks* (long responses) is a property of the task preset
a pipeline picks (``workload/task_presets.py``), not of these numbers.
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
    tied_embeddings: bool = False  # config.json tie_word_embeddings
    qkv_bias: bool = False  # Qwen2 / Qwen2.5: q, k, v projections carry a bias

    def kv_bytes_per_token(self, dtype_bytes: int = BF16_BYTES) -> float:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def weight_bytes(self, dtype_bytes: int = BF16_BYTES) -> float:
        return self.num_params * dtype_bytes

    def attn_flops_per_token_per_ctx(self) -> float:
        """Attention score + value FLOPs per (query token, context token) pair, all layers."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim

    def architecture_params(self) -> float:
        """Parameters implied by the shape: embeddings (once if tied), and per layer the q, k,
        v, o projections (+ biases), the SwiGLU MLP (gate, up, down) and two RMSNorms, plus the
        final norm. (Qwen3's per-head q/k norms, 2 x head_dim per layer, are counted too.)"""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, \
            self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h + 2 * self.head_dim
        emb = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return float(self.num_layers * per_layer + emb + h)


def _hf(repo: str, count: str) -> str:
    return f"huggingface.co/{repo} config.json; model card: {count} params"


MODELS: dict[str, ModelSpec] = {
    # ---- Qwen2.5 (qkv bias; 0.5B-3B tie their embeddings)
    "qwen2.5-0.5b": ModelSpec(
        name="qwen2.5-0.5b", num_layers=24, hidden_size=896, num_heads=14, num_kv_heads=2,
        head_dim=64, intermediate_size=4864, vocab_size=151936, num_params=0.494e9,
        source=_hf("Qwen/Qwen2.5-0.5B-Instruct", "0.49B"), tied_embeddings=True,
        qkv_bias=True),
    "qwen2.5-1.5b": ModelSpec(
        name="qwen2.5-1.5b", num_layers=28, hidden_size=1536, num_heads=12, num_kv_heads=2,
        head_dim=128, intermediate_size=8960, vocab_size=151936, num_params=1.54e9,
        source=_hf("Qwen/Qwen2.5-1.5B-Instruct", "1.54B"), tied_embeddings=True,
        qkv_bias=True),
    "qwen2.5-3b": ModelSpec(
        name="qwen2.5-3b", num_layers=36, hidden_size=2048, num_heads=16, num_kv_heads=2,
        head_dim=128, intermediate_size=11008, vocab_size=151936, num_params=3.09e9,
        source=_hf("Qwen/Qwen2.5-3B-Instruct", "3.09B"), tied_embeddings=True, qkv_bias=True),
    "qwen2.5-7b": ModelSpec(
        name="qwen2.5-7b", num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4,
        head_dim=128, intermediate_size=18944, vocab_size=152064, num_params=7.62e9,
        source=_hf("Qwen/Qwen2.5-7B-Instruct", "7.62B"), qkv_bias=True),
    "qwen2.5-14b": ModelSpec(
        name="qwen2.5-14b", num_layers=48, hidden_size=5120, num_heads=40, num_kv_heads=8,
        head_dim=128, intermediate_size=13824, vocab_size=152064, num_params=14.7e9,
        source=_hf("Qwen/Qwen2.5-14B-Instruct", "14.7B"), qkv_bias=True),
    "qwen2.5-32b": ModelSpec(
        name="qwen2.5-32b", num_layers=64, hidden_size=5120, num_heads=40, num_kv_heads=8,
        head_dim=128, intermediate_size=27648, vocab_size=152064, num_params=32.5e9,
        source=_hf("Qwen/Qwen2.5-32B-Instruct", "32.5B"), qkv_bias=True),
    # Qwen2-7B: the shape Qwen2.5-7B kept (anchor B of reference/gpu-anchors.md trains it).
    "qwen2-7b": ModelSpec(
        name="qwen2-7b", num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4,
        head_dim=128, intermediate_size=18944, vocab_size=152064, num_params=7.62e9,
        source=_hf("Qwen/Qwen2-7B-Instruct", "7.62B"), qkv_bias=True),
    # ---- Qwen3 dense (no qkv bias, q/k norms; 0.6B-4B tie their embeddings)
    "qwen3-0.6b": ModelSpec(
        name="qwen3-0.6b", num_layers=28, hidden_size=1024, num_heads=16, num_kv_heads=8,
        head_dim=128, intermediate_size=3072, vocab_size=151936, num_params=0.6e9,
        source=_hf("Qwen/Qwen3-0.6B", "0.6B"), tied_embeddings=True),
    "qwen3-1.7b": ModelSpec(
        name="qwen3-1.7b", num_layers=28, hidden_size=2048, num_heads=16, num_kv_heads=8,
        head_dim=128, intermediate_size=6144, vocab_size=151936, num_params=1.7e9,
        source=_hf("Qwen/Qwen3-1.7B", "1.7B"), tied_embeddings=True),
    "qwen3-4b": ModelSpec(
        name="qwen3-4b", num_layers=36, hidden_size=2560, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=9728, vocab_size=151936, num_params=4.0e9,
        source=_hf("Qwen/Qwen3-4B", "4.0B"), tied_embeddings=True),
    "qwen3-8b": ModelSpec(
        name="qwen3-8b", num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=12288, vocab_size=151936, num_params=8.2e9,
        source=_hf("Qwen/Qwen3-8B", "8.2B")),
    "qwen3-14b": ModelSpec(
        name="qwen3-14b", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=8,
        head_dim=128, intermediate_size=17408, vocab_size=151936, num_params=14.8e9,
        source=_hf("Qwen/Qwen3-14B", "14.8B")),
    "qwen3-32b": ModelSpec(
        name="qwen3-32b", num_layers=64, hidden_size=5120, num_heads=64, num_kv_heads=8,
        head_dim=128, intermediate_size=25600, vocab_size=151936, num_params=32.8e9,
        source=_hf("Qwen/Qwen3-32B", "32.8B")),
    # ---- Llama (no bias; 3.2 1B and 3B tie their embeddings)
    "llama-3.2-1b": ModelSpec(
        name="llama-3.2-1b", num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128256, num_params=1.24e9,
        source=_hf("meta-llama/Llama-3.2-1B-Instruct", "1.24B"), tied_embeddings=True),
    "llama-3.2-3b": ModelSpec(
        name="llama-3.2-3b", num_layers=28, hidden_size=3072, num_heads=24, num_kv_heads=8,
        head_dim=128, intermediate_size=8192, vocab_size=128256, num_params=3.21e9,
        source=_hf("meta-llama/Llama-3.2-3B-Instruct", "3.21B"), tied_embeddings=True),
    "llama-3.1-8b": ModelSpec(
        name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, num_params=8.03e9,
        source=_hf("meta-llama/Llama-3.1-8B-Instruct", "8.03B")),
    # ---- DeepSeek-R1 distills (Qwen2.5 shapes, untied embeddings)
    "deepseek-r1-distill-qwen-1.5b": ModelSpec(
        name="deepseek-r1-distill-qwen-1.5b", num_layers=28, hidden_size=1536, num_heads=12,
        num_kv_heads=2, head_dim=128, intermediate_size=8960, vocab_size=151936,
        num_params=1.78e9,
        source=_hf("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "1.78B")
        + " (Qwen2.5-Math-1.5B architecture)", qkv_bias=True),
    "deepseek-r1-distill-qwen-14b": ModelSpec(
        name="deepseek-r1-distill-qwen-14b", num_layers=48, hidden_size=5120, num_heads=40,
        num_kv_heads=8, head_dim=128, intermediate_size=13824, vocab_size=152064,
        num_params=14.8e9,
        source="huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-14B config.json "
        "(Qwen2.5-14B architecture); 14.8B params", qkv_bias=True),
}
