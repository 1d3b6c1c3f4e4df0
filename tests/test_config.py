"""Config loading, overrides and the clear errors users get for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from jigsawrl.config import apply_override, dump_config, load_config
from jigsawrl.errors import ConfigError, JigsawError
from jigsawrl.experiments.resolve import resolve

BASE = {
    "cluster": {"accelerator": "h100-80gb", "num_nodes": 1, "accelerators_per_node": 8},
    "pipelines": [{"name": "a", "model": "qwen3-4b", "task": "gsm8k"}],
}


def cfg(**pipe_overrides) -> dict:  # noqa: ANN003
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    d["pipelines"] = [dict(BASE["pipelines"][0], **pipe_overrides)]
    return d


def test_example_configs_load_and_resolve() -> None:
    for path in sorted(Path("configs").glob("*.yaml")):
        resolve(load_config(path))


def test_defaults_and_dump_roundtrip(tmp_path: Path) -> None:
    c = load_config(data=cfg())
    assert c.pipelines[0].batch_size == 64 and c.scheduler.name == "verl"
    p = tmp_path / "c.yaml"
    p.write_text(dump_config(c))
    assert load_config(p) == c


def test_dotted_overrides() -> None:
    c = load_config(data=cfg(), overrides=["pipelines.0.batch_size=128", "seed=3",
                                           "scheduler.params.placement=serial"])
    assert c.pipelines[0].batch_size == 128 and c.seed == 3
    assert c.scheduler.params == {"placement": "serial"}


@pytest.mark.parametrize("item,msg", [
    ("nokey", "no '='"),
    ("pipelines.x.batch_size=1", "must be a list index"),
    ("pipelines.5.batch_size=1", "out of range"),
])
def test_bad_overrides(item: str, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        apply_override(cfg(), item)


@pytest.mark.parametrize("data,where,msg", [
    (cfg(batch_sise=3), "pipelines.0.batch_sise", "did you mean 'batch_size'"),
    (cfg(batch_size=-1), "pipelines.0.batch_size", "greater than or equal to 1"),
    (cfg(batch_size="many"), "pipelines.0.batch_size", "valid integer"),
    (cfg(mode="sync", max_staleness=2), "pipelines.0", "max_staleness must be 0"),
    (cfg(name="a/b"), "pipelines.0.name", "pattern"),
    ({"pipelines": []}, "pipelines", "at least 1"),
])
def test_schema_errors_name_the_key(data: dict, where: str, msg: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(data=data)
    assert where in str(exc.value) and msg in str(exc.value)


@pytest.mark.parametrize("overrides,where,msg", [
    (["cluster.accelerator=h100"], "cluster.accelerator", "did you mean"),
    (["pipelines.0.model=qwen3-5b"], "pipelines.0.model", "unknown model"),
    (["pipelines.0.task=gsm9k"], "pipelines.0.task", "unknown task"),
    (["pipelines.0.rollout_tp=16"], "pipelines.0.rollout_tp", "larger than a node"),
    (["pipelines.0.model=qwen3-32b", "cluster.accelerators_per_node=1"], "pipelines.0.model",
     "cannot train"),
    (["pipelines.0.num_devices=9"], "pipelines.0.num_devices", "cluster has 8"),
    (["pipelines.0.length_trace=/nonexistent.txt"], "/nonexistent.txt", "not found"),
])
def test_semantic_errors(overrides: list[str], where: str, msg: str) -> None:
    with pytest.raises(JigsawError) as exc:  # ConfigError, or InputError for files
        resolve(load_config(data=cfg(), overrides=overrides))
    assert where in str(exc.value) and msg in str(exc.value)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelines: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
