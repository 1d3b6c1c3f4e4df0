"""A data task's prompts against the model's tokenizer (engine/prompts.py, check_pipeline):
chat templates, the plain template, unknown characters, prompts that do not fit, and a user's
model folder that does not fit its tokenizer — all caught before a model is built."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from jigsawrl.config import PipelineSpec  # noqa: E402
from jigsawrl.engine.models import build_model, inspect_local_model, save_model  # noqa: E402
from jigsawrl.engine.pipeline import check_pipeline  # noqa: E402
from jigsawrl.engine.prompts import render_examples, render_prompt  # noqa: E402
from jigsawrl.engine.tokenizer import build_char_tokenizer  # noqa: E402
from jigsawrl.engine.trajectory import encode_prompt  # noqa: E402
from jigsawrl.errors import ConfigError, InputError  # noqa: E402

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def own_model(path: Path, chat_template: str | None = TEMPLATE) -> Path:
    """A user's model folder: a tiny random Qwen2 and the character tokenizer, saved."""
    model, tok = build_model("qwen2-1m", seed=0)
    if chat_template:
        tok.chat_template = chat_template
    save_model(model, tok, path)
    return path


def data_file(tmp: Path, rows: list[dict[str, Any]], name: str = "d.jsonl") -> Path:
    f = tmp / name
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def chat_row(content: str = "2+3=", **over: Any) -> dict[str, Any]:
    return {"data_source": "s", "prompt": [{"role": "user", "content": content}],
            "reward_model": {"ground_truth": "5"}, **over}


def pipe(model: str | Path, files: list[Path], **over: Any) -> PipelineSpec:
    data = {"train_files": [str(f) for f in files], **over.pop("data", {})}
    return PipelineSpec.model_validate({
        "name": "p", "model": str(model), "data": data, "max_response_tokens": 16,
        "custom_reward_function": {"path": str(over.pop("reward"))}, **over})


@pytest.fixture
def reward(tmp_path: Path) -> Path:
    f = tmp_path / "r.py"
    f.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                 "    return float(solution_str.strip() == ground_truth)\n")
    return f


def test_chat_messages_use_the_template_else_the_plain_one(tmp_path: Path, reward: Path) -> None:
    folder = own_model(tmp_path / "m")
    tok, _ = inspect_local_model(folder)
    f = data_file(tmp_path, [chat_row(), {**chat_row(), "prompt": "raw text"}])
    task = check_pipeline(pipe(folder, [f], reward=reward))
    chat, raw = render_examples(tok, task.make_dataset(2, 0))
    assert chat.prompt == "<user>2+3=\n<assistant>" == render_prompt(tok, chat)
    assert raw.prompt == "raw text"  # a string prompt is used as it is
    plain, _ = render_examples(build_char_tokenizer(), task.make_dataset(2, 0))
    assert plain.prompt == "user: 2+3=\nassistant: "  # the presets have no chat template


def test_chat_data_for_an_own_model_without_a_template_fails(tmp_path: Path,
                                                            reward: Path) -> None:
    folder = own_model(tmp_path / "m", chat_template=None)
    f = data_file(tmp_path, [chat_row()])
    with pytest.raises(ConfigError, match="no chat template") as err:
        check_pipeline(pipe(folder, [f], reward=reward), "pipelines.0")
    assert err.value.where == "pipelines.0.model" and f"{f}:1" in str(err.value)
    # string prompts need no template; a preset reads chat messages with the plain one
    check_pipeline(pipe(folder, [data_file(tmp_path, [{**chat_row(), "prompt": "q"}], "s.jsonl")],
                        reward=reward))
    check_pipeline(pipe("qwen2-1m", [f], reward=reward))


def test_a_tokenizer_larger_than_the_models_vocab_fails_before_loading(tmp_path: Path,
                                                                      reward: Path) -> None:
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    config = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64)
    save_model(Qwen2ForCausalLM(config), tok, tmp_path / "m")
    with pytest.raises(InputError, match="vocab_size gives the embedding 64 rows") as err:
        check_pipeline(pipe(tmp_path / "m", [data_file(tmp_path, [chat_row()])], reward=reward))
    assert err.value.where == str(tmp_path / "m")


def test_unknown_characters_map_to_unk_with_a_warning_or_are_refused(
        tmp_path: Path, reward: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = data_file(tmp_path, [chat_row(), chat_row("caf\u00e9\t=")])
    with caplog.at_level(logging.WARNING):
        check_pipeline(pipe("qwen2-1m", [f], reward=reward))
    assert "2 character(s)" in caplog.text and f"{f}:2" in caplog.text
    assert "U+00E9" in caplog.text and "U+0009" in caplog.text
    with pytest.raises(InputError, match=r"'prompt.0.content': character '\\t' \(U\+0009\)"
                       ) as err:
        check_pipeline(pipe("qwen2-1m", [f], reward=reward, data={"unknown_chars": "error"}))
    assert err.value.where == f"{f}:2" and "unknown_chars: unk" in err.value.fix
    tok = build_char_tokenizer()
    assert tok.unk_token_id in encode_prompt(tok, "caf\u00e9")  # what 'unk' means


def test_a_prompt_that_does_not_fit_names_its_row(tmp_path: Path, reward: Path) -> None:
    f = data_file(tmp_path, [chat_row(), chat_row("x" * 300)])
    # <bos> + "user: " + 300 + "\n" + "assistant: " = 319 tokens
    with pytest.raises(InputError, match="prompt of 319 tokens does not fit") as err:
        check_pipeline(pipe("qwen2-1m", [f], reward=reward,
                            rollout={"max_batch_tokens": 256}))
    assert err.value.where == f"{f}:2"


def test_missing_files_fail_before_any_model(tmp_path: Path, reward: Path) -> None:
    with pytest.raises(InputError, match="data file not found"):
        check_pipeline(pipe("qwen2-1m", [tmp_path / "nope.jsonl"], reward=reward))
    with pytest.raises(InputError, match="model directory not found"):
        inspect_local_model(tmp_path / "no-model")
    with pytest.raises(ConfigError, match="unknown engine model 'no-model'"):
        check_pipeline(pipe("no-model", [data_file(tmp_path, [chat_row()])], reward=reward))


def test_encode_prompt_without_bos_or_with_bos_already_there() -> None:
    tok = build_char_tokenizer()
    assert encode_prompt(tok, "ab") == [tok.bos_token_id, *tok.encode("ab",
                                                                      add_special_tokens=False)]

    class NoBos:
        bos_token_id = None

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text]

    assert encode_prompt(NoBos(), "ab") == [97, 98]
    bos_text = tok.convert_ids_to_tokens(tok.bos_token_id) + "ab"
    ids = encode_prompt(tok, bos_text)
    assert ids.count(tok.bos_token_id) == 1
