"""The character tokenizer: fixed ids, lossless round trip, unknown characters, offline
save/load."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from jigsawrl.engine.tokenizer import (  # noqa: E402
    CHARACTERS,
    build_char_tokenizer,
    load_tokenizer,
)
from jigsawrl.errors import InputError  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_vocabulary_is_fixed_and_small(tok) -> None:
    assert len(tok) == 100
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.convert_tokens_to_ids(" ") == 4
    assert tok.convert_tokens_to_ids("~") == 98
    assert tok.convert_tokens_to_ids("\n") == 99
    assert build_char_tokenizer().get_vocab() == tok.get_vocab()


def test_every_character_is_one_token_and_round_trips(tok) -> None:
    text = "".join(CHARACTERS) + "  two  spaces\n\nand lines "
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text


def test_no_special_tokens_are_added(tok) -> None:
    assert tok.encode("ab") == [69, 70]
    assert tok("ab").input_ids == [69, 70]


def test_unknown_characters_map_to_unk(tok) -> None:
    ids = tok.encode("aé\tb")
    assert ids == [69, tok.unk_token_id, tok.unk_token_id, 70]
    assert tok.decode(ids, skip_special_tokens=True) == "ab"


def test_special_token_text_is_one_token(tok) -> None:
    assert tok.encode("x<eos>") == [92, tok.eos_token_id]


def test_save_and_load_round_trip_offline(tok, tmp_path) -> None:
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = "Hello, world!\n1+2=3"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(tok.encode(text)) == text
    assert loaded.eos_token_id == tok.eos_token_id and loaded.pad_token_id == 0


def test_load_missing_directory_is_an_input_error(tmp_path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_tokenizer(tmp_path / "nope")


def test_load_directory_without_tokenizer_files(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    with pytest.raises(InputError, match="no tokenizer files"):
        load_tokenizer(tmp_path)


def test_load_garbage_directory_is_an_input_error(tmp_path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(InputError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path)
