"""Small causal LMs for the real CPU engine: presets built in code, and local HF checkpoints.

No package ships small causal-LM weights and the project machines cannot reach a model hub, so
the engine's models are transformers architectures (Qwen2, Qwen3, Llama) built from a config at
1M-50M parameters with random, seeded weights, paired with the character tokenizer of
`jigsawrl.engine.tokenizer`. A user who has a local Hugging Face directory (config.json +
safetensors + tokenizer files) loads it with `load_local_model`; every way such a directory can
be broken ends in an `InputError` that names the file and the fix, never in a traceback from
deep inside transformers.

`kv_call` is the one place that knows how the installed transformers names the KV-cache argument
of ``forward`` (5.24 renamed ``past_key_values=`` to ``cache=``; the old name is deprecated and
announced for removal in 5.40). `load_weights_checked` copies a trainer's state dict into a model
after checking that it fits (what the rollout engine's weight sync calls).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen3Config,
)

from jigsawrl.engine.tokenizer import build_char_tokenizer, load_tokenizer
from jigsawrl.errors import ConfigError, InputError
from jigsawrl.workload.engine_models import ENGINE_MODELS, EngineModelPreset  # noqa: F401 (re-export)

log = logging.getLogger(__name__)

_CONFIG_CLASSES: dict[str, type[PretrainedConfig]] = {
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "llama": LlamaConfig,
}


def preset_config(preset_name: str, vocab_size: int, tokenizer: PreTrainedTokenizerBase) -> Any:
    """The transformers config of a preset, with the tokenizer's special-token ids."""
    if preset_name not in ENGINE_MODELS:
        raise ConfigError(
            f"unknown engine model preset {preset_name!r}",
            where="model",
            fix=f"use one of {sorted(ENGINE_MODELS)}",
        )
    p = ENGINE_MODELS[preset_name]
    return _CONFIG_CLASSES[p.family](
        vocab_size=vocab_size,
        hidden_size=p.hidden_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_kv_heads,
        head_dim=p.hidden_size // p.num_heads,
        intermediate_size=p.intermediate_size,
        max_position_embeddings=p.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **p.extra,
    )


def build_model(
    preset_name: str, vocab_size: int | None = None, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Build a preset with random weights (seeded, fp32, eval mode) and the char tokenizer.

    Args:
        preset_name: a key of `ENGINE_MODELS`.
        vocab_size: embedding rows; default the tokenizer's size. Must be >= the tokenizer's size.
        seed: weights depend on it only (the global torch RNG is left as it was).

    Raises:
        ConfigError: unknown preset, or a vocabulary smaller than the tokenizer's.
    """
    tokenizer = build_char_tokenizer()
    vocab_size = len(tokenizer) if vocab_size is None else vocab_size
    if vocab_size < len(tokenizer):
        raise ConfigError(
            f"vocab_size {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens",
            where="model.vocab_size",
            fix=f"use vocab_size >= {len(tokenizer)} or leave it unset",
        )
    config = preset_config(preset_name, vocab_size, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    log.info("built %s: %.2fM params, seed %d", preset_name, count_params(model) / 1e6, seed)
    return model, tokenizer


def empty_model(config: PretrainedConfig, device: torch.device | None = None) -> PreTrainedModel:
    """The architecture of ``config`` (fp32, eval mode) with its weights left uninitialised,
    for a state dict to fill: what an onload of a train state builds (``RealPipeline.
    import_train_state``). Skipping the random init that the state dict overwrites makes the
    build and load 3x cheaper (qwen2-1m at one thread: 26 ms built with init, 9 ms without and
    loaded, measured); buffers computed at construction (the rotary frequencies) are built as
    usual. A local model's config gives its architecture without reading its weights again.
    """
    with _no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()  # the context skips tying too: one tensor for tied embeddings again
    model.eval()
    return model if device is None else model.to(device)


def _no_init_weights() -> Any:
    """transformers' context that skips weight initialisation (moved from ``modeling_utils``
    to ``initialization`` in 5.x)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - older transformers
        from transformers.modeling_utils import no_init_weights  # type: ignore[no-redef]
    return no_init_weights()


def count_params(model: torch.nn.Module) -> int:
    """Parameters counted once each (tied embeddings are one tensor)."""
    return sum(p.numel() for p in model.parameters())


def save_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path
) -> None:
    """Write a HF directory (config.json, model.safetensors, tokenizer files) that
    `load_local_model` reads back."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


def load_local_model(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local HF directory (config.json + safetensors + tokenizer), fp32, eval mode.

    Raises:
        InputError: missing directory; missing or malformed config.json; missing, corrupt or
            incomplete safetensors weights; no tokenizer; a tokenizer larger than the embedding.
    """
    path = _check_model_folder(Path(path))
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=torch.float32, output_loading_info=True
        )
    except Exception as exc:  # safetensors / transformers raise many types for bad files
        raise InputError(f"cannot load the weights: {type(exc).__name__}: {exc}", where=str(path),
                         fix="re-save the checkpoint; the safetensors file may be truncated"
                         ) from exc
    bad = [*info.get("missing_keys", []), *info.get("mismatched_keys", [])]
    if bad:
        raise InputError(f"weights do not match config.json: {sorted(map(str, bad))[:5]}",
                         where=str(path), fix="use the config.json the weights were saved with")
    tokenizer = load_tokenizer(path)
    pad_with_eos(tokenizer)
    check_tokenizer_matches(model, tokenizer)
    model.eval()
    return model, tokenizer


def pad_with_eos(tokenizer: PreTrainedTokenizerBase) -> None:
    """A tokenizer without a pad token pads with its EOS (as TRL and verl do); padded
    positions are masked out of every pass, so the choice does not change a result."""
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token


def inspect_local_model(path: str | Path) -> tuple[PreTrainedTokenizerBase, Any]:
    """The tokenizer and config of a local HF folder, checked without loading the weights
    (what a run checks before it builds anything).

    Raises:
        InputError: missing folder, config.json or weights file; no tokenizer; a tokenizer
            with ids past config.json's ``vocab_size``.
    """
    path = _check_model_folder(Path(path))
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    tokenizer = load_tokenizer(path)
    pad_with_eos(tokenizer)
    rows = getattr(config, "vocab_size", None)
    if rows is None and hasattr(config, "get_text_config"):
        rows = getattr(config.get_text_config(), "vocab_size", None)
    if rows is not None:
        check_vocab_rows(int(rows), tokenizer, where=str(path),
                         what="config.json's vocab_size gives the embedding")
    return tokenizer, config


def folder_fingerprint(path: str | Path) -> str:
    """A short key of a model folder's files (names, sizes, modification times): a cache entry
    keyed by it is not reused after the folder's weights, config or tokenizer are re-saved."""
    import hashlib

    path = Path(path).resolve()
    h = hashlib.sha256(str(path).encode())
    for f in sorted(path.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def _check_model_folder(path: Path) -> Path:
    """``path`` if it is a model folder with a valid config.json and safetensors weights.

    Raises:
        InputError: a missing folder, config.json or weights file (names the fix).
    """
    if not path.is_dir():
        raise InputError("model directory not found", where=str(path),
                         fix="pass a directory holding config.json, *.safetensors and a tokenizer")
    _check_config_file(path / "config.json")
    if not any(path.glob("*.safetensors")):
        raise InputError("no *.safetensors weight file", where=str(path),
                         fix="save the model with save_pretrained (safetensors is its default)")
    return path


def _check_config_file(config_path: Path) -> None:
    where = str(config_path)
    if not config_path.is_file():
        raise InputError("config.json is missing", where=where,
                         fix="save the model with save_pretrained, which writes config.json")
    try:
        raw = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"config.json is not valid JSON: {exc}", where=where,
                         fix="restore config.json from the checkpoint's source") from exc
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise InputError("config.json has no 'model_type'", where=where,
                         fix="restore config.json from the checkpoint's source")
    try:
        AutoConfig.from_pretrained(str(config_path.parent), local_files_only=True)
    except Exception as exc:
        raise InputError(f"config.json is not a usable model config: {exc}", where=where,
                         fix="use a model_type this transformers version knows (qwen2, llama, ...)"
                         ) from exc


def check_tokenizer_matches(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Raise InputError when the tokenizer can produce ids the model's embedding does not have.

    A tokenizer smaller than the embedding is fine (models often pad their vocabulary).
    """
    check_vocab_rows(model.get_input_embeddings().weight.shape[0], tokenizer)


def check_vocab_rows(rows: int, tokenizer: PreTrainedTokenizerBase, where: str = "tokenizer",
                     what: str = "the model's embedding has") -> None:
    """Raise InputError when ``tokenizer`` has ids at or past ``rows`` embedding rows."""
    ids = [len(tokenizer) - 1] + [
        i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id)
        if i is not None
    ]
    if max(ids) >= rows:
        raise InputError(
            f"tokenizer has {len(tokenizer)} tokens (max id {max(ids)}) but {what} {rows} rows",
            where=where,
            fix="load the tokenizer saved with this model, or build the model with a larger vocab",
        )


def load_weights_checked(model: PreTrainedModel, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy ``state_dict`` into ``model`` after checking that it fits (a tied output embedding
    may be left out: it is the input embedding).

    Raises:
        InputError: missing or unexpected keys, or tensors of the wrong shape.
    """
    own = model.state_dict()
    tied_out = tied_output_key(model)
    missing = set(own) - set(state_dict) - ({tied_out} if tied_out else set())
    unexpected = set(state_dict) - set(own)
    wrong = [k for k, v in state_dict.items()
             if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        raise InputError(
            f"state dict does not fit the model: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}, wrong shape {wrong[:3]}",
            where="load_weights", fix="send the state dict of the same architecture")
    with torch.no_grad():
        model.load_state_dict(state_dict, strict=False)


def tied_output_key(model: PreTrainedModel) -> str | None:
    """The state-dict key of the output embedding when it is tied to the input one, else None."""
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if out is None or out.weight is not inp.weight:
        return None
    return next((k for k, m in model.named_modules() if m is out), "lm_head") + ".weight"


@functools.cache
def _cache_kwarg(model_cls: type) -> str:
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def kv_call(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    cache: Any,
    *,
    logits_to_keep: int = 0,
) -> torch.Tensor:
    """One forward pass with a KV cache; returns the logits (``[batch, kept positions, vocab]``).

    The cache argument is passed as ``cache=`` (transformers >= 5.24) or ``past_key_values=``
    (older), whichever the model's ``forward`` declares. ``logits_to_keep=1`` computes logits of
    the last position only (prefill of long prompts with a large vocabulary).
    """
    kwargs = {_cache_kwarg(type(model)): cache}
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        **kwargs,
    )
    return out.logits
