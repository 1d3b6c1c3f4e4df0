"""Data files as a task (tasks/dataset.py, tasks/factory.py): verl's rows, every bad row named by
file, line and field, parquet with and without a reader, and how task / data / reward compose.
Pure Python: the data the tests read is written by them."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from jigsawrl.config import DataSpec, PipelineSpec
from jigsawrl.errors import ConfigError, InputError
from jigsawrl.tasks import DatasetTask, build_task, get_task, plain_chat, safe_score
from jigsawrl.tasks.factory import absolute_paths


def row(**over: Any) -> dict[str, Any]:
    base = {"data_source": "arithmetic",
            "prompt": [{"role": "user", "content": "2+3="}],
            "reward_model": {"style": "rule", "ground_truth": "5"},
            "extra_info": {"split": "train", "index": 0, "answer": "5"}}
    base.update(over)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def spec(tmp: Path, data: dict[str, Any], **over: Any) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "p", "model": "qwen2-1m", "data": data,
                                        "max_response_tokens": 64, **over})


def task_of(files: list[Path], **keys: Any) -> DatasetTask:
    return DatasetTask(DataSpec(train_files=[str(f) for f in files], **keys), pipeline="p")


def test_verl_rows_become_examples(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "train.jsonl", [
        row(),
        row(prompt="plain text prompt", reward_model={"ground_truth": 7}, extra_info=_DROP,
            data_source=_DROP),
    ])
    t = task_of([f])
    a, b = t.make_dataset(10, seed=0)
    assert a.prompt == "user: 2+3=\nassistant: " == plain_chat(a.messages)
    assert a.messages == ({"role": "user", "content": "2+3="},)
    assert (a.ground_truth, a.data_source, a.demo) == ("5", "arithmetic", "5")
    assert a.extra_info == {"split": "train", "index": 0, "answer": "5"}
    # a string prompt is used as it is; ground truth keeps its JSON type; defaults
    assert (b.prompt, b.messages, b.ground_truth, b.extra_info, b.demo) == (
        "plain text prompt", None, 7, {}, "")
    assert b.data_source == "train"  # the file's stem when there is no task
    assert t.size("train") == 2 and t.size("test") == 0 and t.make_dataset(5, 0, "test") == []
    assert [loc for loc, _ in t.rows("train")] == [f"{f}:1", f"{f}:2"]
    assert t.response_end is None and not t.multi_turn  # raw data: a response ends at EOS
    assert t.has_demos


def test_json_list_files_and_blank_lines(tmp_path: Path) -> None:
    lst = tmp_path / "rows.json"
    lst.write_text(json.dumps([row(), row()]))
    jl = tmp_path / "rows.jsonl"
    jl.write_text(json.dumps(row()) + "\n\n   \n" + json.dumps(row()) + "\n")
    assert task_of([lst, jl]).size("train") == 4
    assert [loc for loc, _ in task_of([jl]).rows("train")] == [f"{jl}:1", f"{jl}:4"]


BAD_ROWS = [
    (row(prompt=_DROP), "'prompt': missing"),
    (row(prompt=""), "'prompt': empty prompt"),
    (row(prompt="   "), "'prompt': empty prompt"),
    (row(prompt=[]), "'prompt': empty list"),
    (row(prompt=42), "'prompt': int is not a prompt"),
    (row(prompt=[{"role": "user"}]), "'prompt.0.content': missing"),
    (row(prompt=[{"role": "user", "content": 3}]), "'prompt.0.content': int, not a string"),
    (row(prompt=["hi"]), "'prompt.0': a message must be an object"),
    (row(prompt=[{"role": "user", "content": ""}]), "every message's content is empty"),
    (row(prompt=[{"role": " ", "content": "x"}]), "'prompt.0.role': empty role"),
    (row(reward_model=_DROP), "'reward_model': missing"),
    (row(reward_model="5"), "'reward_model': str, not an object"),
    (row(reward_model={"style": "rule"}), "'reward_model.ground_truth': missing"),
    (row(reward_model={"ground_truth": None}), "'reward_model.ground_truth': null"),
    (row(data_source=3), "'data_source': int is not a non-empty string"),
    (row(extra_info=[1]), "'extra_info': list, not an object"),
    (row(extra_info={"answer": [1]}), "'extra_info.answer': list is not a response"),
    ([1, 2], "a row must be a JSON object, got list"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_ROWS, ids=[m for _, m in BAD_ROWS])
def test_a_bad_row_names_file_line_and_field(tmp_path: Path, bad: Any, message: str) -> None:
    f = write_jsonl(tmp_path / "d.jsonl", [row(), row(), bad])
    with pytest.raises(InputError) as err:
        task_of([f])
    assert err.value.where == f"{f}:3"
    assert message in str(err.value) and err.value.fix


def test_unreadable_lines_and_files(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(row()) + "\n{not json\n")
    with pytest.raises(InputError, match="not a JSON object") as err:
        task_of([f])
    assert err.value.where == f"{f}:2"
    f.write_bytes(json.dumps(row()).encode() + b"\n\xff\xfe\n")
    with pytest.raises(InputError, match="not UTF-8") as err:
        task_of([f])
    assert err.value.where == f"{f}:2"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(InputError, match="no rows"):
        task_of([empty])
    other = tmp_path / "d.csv"
    other.write_text("a,b\n")
    with pytest.raises(InputError, match="unknown data file type '.csv'"):
        task_of([other])
    with pytest.raises(InputError, match=r"data file not found \(pipeline 'p': data.train_files"
                       ) as err:
        task_of([tmp_path / "missing.jsonl"])
    assert err.value.where == str(tmp_path / "missing.jsonl")


def test_response_key(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "d.jsonl", [row(solution="five", extra_info={}),
                                           row(solution=5, extra_info={})])
    t = task_of([f], response_key="solution")
    assert [ex.demo for ex in t.make_dataset(2, 0)] == ["five", "5"]
    assert not task_of([f]).has_demos  # the default key (extra_info.answer) is absent
    g = write_jsonl(tmp_path / "g.jsonl", [row(solution="x"), row()])
    with pytest.raises(InputError, match="'solution': missing") as err:
        task_of([g], response_key="solution")
    assert err.value.where == f"{g}:2"


def test_parquet_without_a_reader_says_how_to_install(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "pandas", None)
    f = tmp_path / "train.parquet"
    f.write_bytes(b"PAR1")
    with pytest.raises(InputError, match="pip install pyarrow") as err:
        task_of([f])
    assert err.value.where == str(f)


def test_parquet_rows_through_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyarrow's ``read_table(path).to_pylist()`` (faked: pyarrow is optional); numpy-like
    values (what pandas gives for list columns) are turned into plain lists."""
    class Arr(list):
        def tolist(self) -> list:
            return list(self)

    rows = [row(), row(prompt=Arr([{"role": "user", "content": "1+1="}]),
                       reward_model={"ground_truth": None})]
    parquet = types.ModuleType("pyarrow.parquet")
    parquet.read_table = lambda path: types.SimpleNamespace(to_pylist=lambda: rows)
    pa = types.ModuleType("pyarrow")
    pa.parquet = parquet
    monkeypatch.setitem(sys.modules, "pyarrow", pa)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", parquet)
    f = tmp_path / "train.parquet"
    f.write_bytes(b"PAR1")
    with pytest.raises(InputError, match="'reward_model.ground_truth': null") as err:
        task_of([f])
    assert err.value.where == f"{f}: row 2"
    rows[1]["reward_model"] = {"ground_truth": "2"}
    t = task_of([f])
    assert t.make_dataset(2, 0)[1].messages == ({"role": "user", "content": "1+1="},)


# ---------------------------------------------------------------------------- composition

def test_without_task_or_reward_data_source_must_name_a_task(tmp_path: Path) -> None:
    ok = write_jsonl(tmp_path / "ok.jsonl", [row()])
    t = build_task(spec(tmp_path, {"train_files": [str(ok)]}))
    ex = t.make_dataset(1, 0)[0]
    for answer in ("2+3=5\n", "2+3=6\n", "5"):
        assert safe_score(t, answer, ex) == safe_score(get_task("arithmetic"), answer, ex)
    assert safe_score(t, "2+3=5\n", ex)[0] == 1.0
    bad = write_jsonl(tmp_path / "bad.jsonl", [row(), row(data_source="openai/gsm8k")])
    with pytest.raises(ConfigError, match="no reward for data_source 'openai/gsm8k'") as err:
        build_task(spec(tmp_path, {"train_files": [str(bad)]}), "pipelines.0")
    assert f"{bad}:2" in str(err.value) and "custom_reward_function" in err.value.fix


def test_a_task_with_data_keeps_its_format_reward_and_tool(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "d.jsonl", [row(data_source=_DROP)])
    t = build_task(spec(tmp_path, {"train_files": [str(f)]}, task="calculator"))
    calc = get_task("calculator")
    assert (t.name, t.multi_turn, t.stop, t.max_turns) == (calc.name, True, calc.stop,
                                                           calc.max_turns)
    assert t.response_end == "\n"
    ex = t.make_dataset(1, 0)[0]
    assert ex.data_source == "calculator"
    assert t.call_tool("<c>2+3</c>", {}).text == calc.call_tool("<c>2+3</c>", {}).text
    with pytest.raises(ConfigError, match="unknown task 'nope'") as err:
        build_task(spec(tmp_path, {"train_files": [str(f)]}, task="nope"), "pipelines.3")
    assert err.value.where == "pipelines.3.task"


def test_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = spec(tmp_path, {"train_files": ["a.jsonl"], "val_files": ["b.jsonl"]},
             custom_reward_function={"path": "r.py"})
    out = absolute_paths(s)
    assert out.data.train_files == [str(tmp_path / "a.jsonl")]
    assert out.data.val_files == [str(tmp_path / "b.jsonl")]
    assert out.custom_reward_function.path == str(tmp_path / "r.py")
    plain = PipelineSpec.model_validate({"name": "p", "model": "m", "task": "arithmetic"})
    assert absolute_paths(plain) is plain


def test_get_task_without_a_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no task named"):
        get_task(None)  # type: ignore[arg-type]


def test_cache_key_follows_the_contents(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "d.jsonl", [row()])
    key = task_of([f]).cache_key
    assert key == task_of([f]).cache_key
    write_jsonl(f, [row(), row()])
    assert task_of([f]).cache_key != key


def test_locate_characters_names_the_first_row_of_each(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "d.jsonl", [
        row(), row(prompt=[{"role": "user", "content": "caf\u00e9"}]),
        row(prompt="na\u00efve \u00e9", extra_info={"answer": "\u2014"})])
    found = task_of([f]).locate_characters(lambda ch: ch.isascii())
    assert found == sorted([(f"{f}:2", "prompt.0.content", "\u00e9"),
                            (f"{f}:3", "prompt", "\u00ef"),
                            (f"{f}:3", "extra_info.answer", "\u2014")])
