"""Engine models: preset sizes, seeded builds, save/load, clear errors for broken checkpoints."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from jigsawrl.engine.models import (  # noqa: E402
    ENGINE_MODELS,
    build_model,
    check_tokenizer_matches,
    count_params,
    empty_model,
    kv_call,
    load_local_model,
    save_model,
)
from jigsawrl.engine.tokenizer import build_char_tokenizer  # noqa: E402
from jigsawrl.errors import ConfigError, InputError  # noqa: E402


@pytest.fixture(scope="module")
def small():
    return build_model("qwen2-1m", seed=0)


@pytest.fixture(scope="module")
def saved(small, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    save_model(*small, path)
    return path


@pytest.mark.parametrize("name", sorted(ENGINE_MODELS))
def test_presets_have_the_size_they_are_named_for(name) -> None:
    model, tok = build_model(name, seed=0)
    n = count_params(model)
    assert n == pytest.approx(ENGINE_MODELS[name].approx_params, rel=0.02)
    nominal = float(name.rsplit("-", 1)[1].rstrip("m")) * 1e6
    assert n == pytest.approx(nominal, rel=0.1)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model.config.eos_token_id == tok.eos_token_id


def test_build_is_seeded_and_leaves_the_global_rng_alone(small) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    again, _ = build_model("qwen2-1m", seed=0)
    assert torch.equal(torch.rand(3), expected)
    other, _ = build_model("qwen2-1m", seed=1)
    for a, b in zip(small[0].parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, c) for a, c in zip(again.parameters(), other.parameters(),
                                                      strict=True) if a.dim() == 2)


def test_bad_preset_or_vocab_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown engine model preset"):
        build_model("gpt-9000")
    with pytest.raises(ConfigError, match="smaller than the tokenizer"):
        build_model("qwen2-1m", vocab_size=50)
    model, _ = build_model("llama-1m", vocab_size=128)
    assert model.get_input_embeddings().weight.shape[0] == 128


def test_save_and_load_round_trip(small, saved) -> None:
    model, tok = load_local_model(saved)
    ids = torch.tensor([tok.encode("round trip")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, small[0](ids).logits)
    assert tok.encode("abc") == small[1].encode("abc")
    assert not model.training


@pytest.mark.parametrize("name", sorted(ENGINE_MODELS))
def test_an_empty_model_filled_with_a_state_dict_is_the_model(name) -> None:
    """What an onload builds: the same parameters (tied embeddings one tensor, so an optimizer
    state fits), buffers and outputs as the model whose state dict fills it."""
    model, tok = build_model(name, seed=3)
    empty = empty_model(model.config)
    assert empty.get_input_embeddings().weight is empty.get_output_embeddings().weight
    assert [n for n, _ in empty.named_parameters()] == [n for n, _ in model.named_parameters()]
    empty.load_state_dict(model.state_dict())
    for (n, a), (_, b) in zip(empty.named_buffers(), model.named_buffers(), strict=True):
        assert torch.equal(a, b), n
    ids = torch.tensor([tok.encode("an onload")])
    with torch.no_grad():
        assert torch.equal(empty(ids).logits, model(ids).logits)
    assert not empty.training and next(empty.parameters()).dtype == torch.float32


def test_kv_call_matches_a_full_forward(small) -> None:
    model, tok = small
    ids = torch.tensor([tok.encode("incremental decoding")])
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        first = kv_call(model, ids[:, :10], None, torch.arange(10)[None], cache)
        rest = kv_call(model, ids[:, 10:], None, torch.arange(10, ids.shape[1])[None], cache)
        last = kv_call(model, ids[:, :5], None, None, DynamicCache(config=model.config),
                       logits_to_keep=1)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=1e-5)
    assert last.shape == (1, 1, len(tok))


def _copy(saved, dst):
    dst.mkdir()
    for f in saved.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_missing_directory(tmp_path) -> None:
    with pytest.raises(InputError, match="model directory not found"):
        load_local_model(tmp_path / "absent")


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("no_config", "config.json is missing"),
        ("garbage_config", "not valid JSON"),
        ("no_model_type", "no 'model_type'"),
        ("unknown_model_type", "not a usable model config"),
        ("no_weights", "no \\*.safetensors"),
        ("truncated_weights", "cannot load the weights"),
        ("wrong_shape_config", "cannot load the weights|do not match"),
        ("no_tokenizer", "no tokenizer files"),
    ],
)
def test_broken_checkpoints_are_input_errors(saved, tmp_path, breakage, message) -> None:
    path = _copy(saved, tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    if breakage == "no_config":
        (path / "config.json").unlink()
    elif breakage == "garbage_config":
        (path / "config.json").write_text("{ this is not json")
    elif breakage == "no_model_type":
        (path / "config.json").write_text(json.dumps({"hidden_size": 3}))
    elif breakage == "unknown_model_type":
        (path / "config.json").write_text(json.dumps({**config, "model_type": "nonesuch"}))
    elif breakage == "no_weights":
        (path / "model.safetensors").unlink()
    elif breakage == "truncated_weights":
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif breakage == "wrong_shape_config":
        config["intermediate_size"] = 256
        (path / "config.json").write_text(json.dumps(config))
    elif breakage == "no_tokenizer":
        (path / "tokenizer.json").unlink()
        (path / "tokenizer_config.json").unlink()
    with pytest.raises(InputError, match=message) as info:
        load_local_model(path)
    assert info.value.where and info.value.fix


def test_tokenizer_larger_than_the_embedding(tmp_path) -> None:
    tok = build_char_tokenizer()
    config = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64)
    model = Qwen2ForCausalLM(config)
    with pytest.raises(InputError, match="embedding has 64 rows"):
        check_tokenizer_matches(model, tok)
    save_model(model, tok, tmp_path)
    with pytest.raises(InputError, match="embedding has 64 rows"):
        load_local_model(tmp_path)
