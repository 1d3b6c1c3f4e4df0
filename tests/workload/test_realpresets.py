"""The cost-model view of the engine's models: presets, and local Hugging Face folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jigsawrl.errors import ConfigError
from jigsawrl.workload.realpresets import engine_model_spec


def _folder(tmp_path: Path, cfg: dict | None) -> Path:
    folder = tmp_path / "my-model"
    folder.mkdir()
    if cfg is not None:
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


QWEN = {"num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 100}


def test_a_folder_reads_its_shape_from_config_json(tmp_path: Path) -> None:
    spec = engine_model_spec(str(_folder(tmp_path, QWEN)))
    preset = engine_model_spec("qwen2-1m")  # the same shape as a preset
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads, spec.head_dim) == \
        (preset.num_layers, preset.hidden_size, preset.num_kv_heads, preset.head_dim)
    assert spec.num_params == pytest.approx(preset.num_params, rel=0.1)
    assert "config.json" in spec.source


@pytest.mark.parametrize("cfg, says", [(None, "no config.json"),
                                       ({"hidden_size": 8}, "does not describe a decoder")])
def test_a_broken_folder_is_a_clear_config_error(tmp_path: Path, cfg: dict | None,
                                                 says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        engine_model_spec(str(_folder(tmp_path, cfg)))


def test_an_unknown_name_names_the_presets_and_folders() -> None:
    with pytest.raises(ConfigError, match="Hugging Face folder"):
        engine_model_spec("qwen9-1t")
