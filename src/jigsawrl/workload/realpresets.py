"""Presets for *real* runs: a CPU "accelerator" and cost-model entries for the engine's models.

What: the schedulers size work with a :class:`~jigsawrl.costmodel.CostModel`, which reads an
:class:`AcceleratorSpec` and a :class:`ModelSpec`. The simulator's presets describe GPUs and
billion-parameter models; a real run on this machine multiplexes ~1M-parameter models on CPU
workers. This module gives the cost model something truthful to read for such runs:

- :data:`CPU_ACCELERATOR` ("cpu-worker"): one *logical device* = a slice of this machine (by
  default one core; ``RayExecutor(threads_per_device=...)`` sets how many torch threads a full
  share maps to).
- :func:`engine_model_spec`: a :class:`ModelSpec` built from an ``ENGINE_MODELS`` preset.

Why separate from ``workload/accelerators.py`` and ``workload/models.py``: those tables hold
datasheet numbers for the simulator (``jigsawrl list``); these are rough, local, and meant to be
replaced by measured numbers (``jigsawrl profile``), so they are kept apart and labelled.

The engine's presets are data (:mod:`jigsawrl.workload.engine_models`): no torch here. The cost
parameters of a pool of CPU workers are :func:`jigsawrl.costmodel.cpu.cpu_worker_params`.
"""

from __future__ import annotations

import json
from pathlib import Path

from jigsawrl.errors import ConfigError
from jigsawrl.workload.accelerators import GB, AcceleratorSpec
from jigsawrl.workload.engine_models import ENGINE_MODELS
from jigsawrl.workload.models import ModelSpec

# The character tokenizer of jigsawrl.engine.tokenizer has ~100 tokens; ENGINE_MODELS' sizes are
# quoted for it (models.py: "the size is for the 100-token char vocabulary").
CHAR_VOCAB_SIZE = 100

CPU_ACCELERATOR = AcceleratorSpec(
    name="cpu-worker",
    # ASSUMPTION: one x86 core with AVX-512/AMX runs fp32 matmuls at ~100 GFLOP/s sustained at
    # best; the ~1M-parameter models reach far less (per-step overhead dominates, cpu-notes.md).
    # Only ratios between stages matter to the schedulers; replace with `jigsawrl profile`.
    peak_flops=100e9,
    # A per-worker memory budget (not a hardware size): 4 GB keeps 2 workers + Ray (~0.6 GB)
    # well inside the 23 GiB of a CI machine; a 1M model's rollout peaks at ~0.5 GB RSS.
    hbm_bytes=4 * GB,
    # ASSUMPTION: ~20 GB/s of DRAM bandwidth per core (a share of a server socket's ~100 GB/s).
    hbm_bytes_per_s=20 * GB,
    # "Host" and "device" are the same DRAM: a transfer is a memcpy (~10 GB/s, assumption).
    host_link_bytes_per_s=10 * GB,
    # Workers on one machine exchange tensors through Ray's object store (shared memory):
    # cpu-notes.md measured a 40 MB state dict actor->actor in ~140 ms, i.e. ~0.3 GB/s.
    intra_node_bytes_per_s=0.3 * GB,
    # ASSUMPTION: 10 GbE between machines.
    inter_node_bytes_per_s=1.25 * GB,
    sm_count=1,  # one core per logical device by default (threads_per_device)
    price_per_hour_usd=0.0,  # a local machine: no price; cost columns read 0
    source="rough CPU assumptions (see comments in workload/realpresets.py) and "
    "shared/reference/cpu-notes.md measurements; replace with `jigsawrl profile`",
)

REAL_ACCELERATORS: dict[str, AcceleratorSpec] = {CPU_ACCELERATOR.name: CPU_ACCELERATOR}

def engine_model_spec(preset: str) -> ModelSpec:
    """The cost-model view of an engine model preset (``jigsawrl.workload.engine_models.ENGINE_MODELS``).

    Args:
        preset: a key of ``ENGINE_MODELS`` (e.g. ``"qwen2-1m"``), or a local Hugging Face
            folder (its ``config.json`` gives the shape: :func:`folder_model_spec`).

    Returns:
        A :class:`ModelSpec` with the preset's layers, widths and heads; ``head_dim`` is
        ``hidden / heads`` (as ``engine.models.preset_config`` builds it), the vocabulary is the
        character tokenizer's and ``num_params`` the preset's ``approx_params``.

    Raises:
        ConfigError: neither a preset nor a folder with a readable ``config.json``.
    """
    if preset not in ENGINE_MODELS and Path(preset).is_dir():
        return folder_model_spec(Path(preset))
    if preset not in ENGINE_MODELS:
        raise ConfigError(f"unknown engine model preset {preset!r}", where="pipelines.model",
                          fix=f"use a preset ({', '.join(sorted(ENGINE_MODELS))}) or a local "
                              "Hugging Face folder with config.json")
    p = ENGINE_MODELS[preset]
    return ModelSpec(
        name=preset, num_layers=p.num_layers, hidden_size=p.hidden_size, num_heads=p.num_heads,
        num_kv_heads=p.num_kv_heads, head_dim=p.hidden_size // p.num_heads,
        intermediate_size=p.intermediate_size, vocab_size=CHAR_VOCAB_SIZE,
        num_params=p.approx_params or _count_params(p),
        source=f"jigsawrl.engine.models.ENGINE_MODELS[{preset!r}] (random-init CPU preset)")


def folder_model_spec(folder: Path) -> ModelSpec:
    """The cost-model view of a local Hugging Face folder, from its ``config.json`` alone (the
    standard decoder keys: layers, hidden and intermediate sizes, heads, KV heads, vocabulary;
    parameters counted as a tied-embedding decoder). The engine checks the weights and tokenizer
    themselves (``engine.models.inspect_local_model``)."""
    path = folder / "config.json"
    try:
        cfg = json.loads(path.read_text())
        layers, hidden = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        inter, vocab = int(cfg["intermediate_size"]), int(cfg["vocab_size"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
    except FileNotFoundError:
        raise ConfigError(f"model folder {folder} has no config.json", where="pipelines.model",
                          fix="save the model with save_pretrained (config.json + weights + "
                              "tokenizer files)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} does not describe a decoder model ({type(exc).__name__}: "
                          f"{exc})", where="pipelines.model",
                          fix="a transformers causal-LM config.json with num_hidden_layers, "
                              "hidden_size, num_attention_heads, intermediate_size, "
                              "vocab_size") from None
    attn = hidden * heads * head_dim * 2 + 2 * hidden * kv_heads * head_dim
    params = vocab * hidden + layers * (attn + 3 * hidden * inter + 2 * hidden)
    return ModelSpec(
        name=folder.name, num_layers=layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=inter, vocab_size=vocab,
        num_params=float(params), source=f"{path} (a local Hugging Face folder)")


def _count_params(p: object) -> float:
    """Parameter count of a preset without ``approx_params`` (tied embeddings, no biases)."""
    h, i, n = p.hidden_size, p.intermediate_size, p.num_layers  # type: ignore[attr-defined]
    head = h // p.num_heads  # type: ignore[attr-defined]
    kv = 2 * h * p.num_kv_heads * head  # type: ignore[attr-defined]
    return float(CHAR_VOCAB_SIZE * h + n * (2 * h * h + kv + 3 * h * i + 2 * h))
