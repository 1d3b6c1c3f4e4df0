"""Reward functions from a file (tasks/custom_reward.py): verl's signature, called by keyword;
a broken file fails when the task is built, naming the file; a reward that raises or returns a
non-number scores 0 with its reason. Pure Python; the reward files are written by the tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jigsawrl.config import PipelineSpec, RewardFunctionSpec
from jigsawrl.errors import ConfigError
from jigsawrl.tasks import (
    RewardFunctionTask,
    build_task,
    get_task,
    load_reward_function,
    reward_error_kind,
    safe_score,
)

GOOD = """
CALLS = []

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    CALLS.append((data_source, solution_str, ground_truth, extra_info))
    return (1.0 if solution_str.strip() == str(ground_truth) else 0.0) + bonus

def as_dict(data_source, solution_str, ground_truth, extra_info):
    return {"score": 0.5, "acc": True}

def boom(data_source, solution_str, ground_truth, extra_info):
    raise ZeroDivisionError("no")

def text(data_source, solution_str, ground_truth, extra_info):
    return "high"

def kwargs_only(**kwargs):
    return 1.0

NOT_A_FUNCTION = 3

async def later(data_source, solution_str, ground_truth, extra_info):
    return 1.0

def two(a, b):
    return 0.0
"""


def reward_file(tmp: Path, text: str = GOOD, name: str = "my_reward.py") -> Path:
    f = tmp / name
    f.write_text(text)
    return f


def load(path: Path | str, name: str = "compute_score", **kwargs: Any) -> Any:
    return load_reward_function(RewardFunctionSpec(path=str(path), name=name,
                                                   reward_kwargs=kwargs))


def test_a_good_file_scores_with_verls_call(tmp_path: Path) -> None:
    f = reward_file(tmp_path)
    inner = get_task("arithmetic")
    task = RewardFunctionTask(inner, load(f), {"bonus": 0.25}, f"{f}:compute_score")
    ex = inner.make_dataset(1, seed=0)[0]
    assert safe_score(task, f"{ex.ground_truth}\n", ex) == (1.25, {})
    fn = load(f)
    assert fn.__globals__["CALLS"][-1] == (ex.data_source, f"{ex.ground_truth}\n",
                                           ex.ground_truth, ex.extra_info)
    # everything but the reward is the inner task's
    assert (task.name, task.stop, task.multi_turn) == (inner.name, inner.stop, inner.multi_turn)
    assert task.make_dataset(3, 0) == inner.make_dataset(3, 0)
    assert task.format_score == inner.format_score  # delegated attribute
    assert load(f, "kwargs_only")(data_source="", solution_str="", ground_truth="",
                                  extra_info=None) == 1.0
    dict_task = RewardFunctionTask(inner, load(f, "as_dict"))
    assert safe_score(dict_task, "x", ex) == (0.5, {"score": 0.5, "acc": True})


@pytest.mark.parametrize(("name", "kind", "reason"), [
    ("boom", "ZeroDivisionError", "compute_score raised ZeroDivisionError: no"),
    ("text", "not_a_number", "compute_score returned str, not a number"),
])
def test_a_reward_that_raises_or_returns_text_scores_zero(tmp_path: Path, name: str, kind: str,
                                                          reason: str) -> None:
    inner = get_task("arithmetic")
    task = RewardFunctionTask(inner, load(reward_file(tmp_path), name))
    score, info = safe_score(task, "1", inner.make_dataset(1, 0)[0])
    assert (score, info) == (0.0, {"error": reason})
    assert reward_error_kind(info["error"]) == kind


def test_error_kinds() -> None:
    assert reward_error_kind("compute_score returned a dict without 'score'") == "no_score"
    assert reward_error_kind("compute_score returned nan") == "not_finite"


BROKEN = [
    ("missing file", None, "compute_score", "reward file 'nowhere.py' not found"),
    ("syntax error", "def compute_score(:\n", "compute_score", "SyntaxError"),
    ("import error", "import no_such_module_xyz\n", "compute_score",
     "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("raises at import", "raise RuntimeError('config missing')\n", "compute_score",
     "RuntimeError: config missing"),
    ("exits at import", "import sys\nsys.exit(3)\n", "compute_score", "SystemExit"),
    ("missing function", GOOD, "score_it", "has no function 'score_it' (it defines: as_dict, "
                                           "boom, compute_score, kwargs_only, later, text, two)"),
    ("not callable", GOOD, "NOT_A_FUNCTION", "'NOT_A_FUNCTION' is a int, not a function"),
    ("async", GOOD, "later", "later is async"),
    ("wrong signature", GOOD, "two", "two(a, b) cannot be called as compute_score(data_source, "
                                     "solution_str, ground_truth, extra_info)"),
]


@pytest.mark.parametrize(("case", "text", "name", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_reward_file_is_a_config_error_naming_it(tmp_path: Path, case: str,
                                                         text: str | None, name: str,
                                                         message: str) -> None:
    path: Path | str = "nowhere.py" if text is None else reward_file(tmp_path, text,
                                                                     f"r_{len(case)}.py")
    with pytest.raises(ConfigError) as err:
        load(path, name)
    assert message in str(err.value)
    assert str(path) in str(err.value)
    assert err.value.fix and err.value.where.startswith("custom_reward_function.")


def test_reward_kwargs_must_fit_the_signature(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"reward_kwargs \['nope'\]"):
        load(reward_file(tmp_path), nope=1)


def test_build_task_wraps_a_task_or_data_and_checks_before_running(tmp_path: Path) -> None:
    f = reward_file(tmp_path)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"data_source": "anything", "prompt": "q",
                                "reward_model": {"ground_truth": "a"}}) + "\n")

    def pipe(**over: Any) -> PipelineSpec:
        return PipelineSpec.model_validate({"name": "p", "model": "qwen2-1m", **over})

    t = build_task(pipe(task="countdown", custom_reward_function={"path": str(f)}))
    assert isinstance(t, RewardFunctionTask) and t.name == "countdown"
    t = build_task(pipe(data={"train_files": [str(data)]},
                        custom_reward_function={"path": str(f)}))
    ex = t.make_dataset(1, 0)[0]
    assert safe_score(t, "a", ex) == (1.0, {})  # no task named 'anything' is needed
    assert t.size("train") == 1  # DatasetTask's methods reach through the wrapper
    # verl's default `path: null` means no custom reward
    t = build_task(pipe(task="countdown", custom_reward_function={"path": None}))
    assert t.name == "countdown" and not isinstance(t, RewardFunctionTask)
    with pytest.raises(ConfigError, match="SyntaxError") as err:
        build_task(pipe(task="countdown", custom_reward_function={
            "path": str(reward_file(tmp_path, "def (", "bad.py"))}), "pipelines.2")
    assert err.value.where == "pipelines.2.custom_reward_function.path"
