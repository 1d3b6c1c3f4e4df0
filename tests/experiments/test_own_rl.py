"""The user's own RL end to end: their data (JSON lines, verl's fields), their reward (a file,
verl's ``custom_reward_function``) and their model (a local Hugging Face folder with a chat
template) through ``jigsawrl run``; every input problem is exit 2 before any model is built;
``jigsawrl simulate`` of a data pipeline needs a task preset or a length trace.

Everything the runs read is written here: a tiny random Qwen2 with the character tokenizer and
a chat template (built in code, saved with ``save_pretrained``), a JSONL dataset and a reward
file. One GRPO step each (~10 s on one core).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from jigsawrl.cli.main import app  # noqa: E402
from jigsawrl.config import load_config  # noqa: E402
from jigsawrl.engine.models import build_model, save_model  # noqa: E402
from jigsawrl.errors import ConfigError  # noqa: E402
from jigsawrl.experiments.resolve import resolve  # noqa: E402
from jigsawrl.experiments.sequential import run_experiment  # noqa: E402

torch.set_num_threads(1)
runner = CliRunner()

CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # verl's signature; the response is the text after the prompt
    return 1.0 if solution_str.strip() == str(ground_truth) else 0.1
"""
RAISING = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] % 2:
        raise ZeroDivisionError("my reward has a bug")
    return "high"
"""


def rows(n: int, answers: bool = True) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        a, b = i % 7, (3 * i) % 5
        info: dict[str, Any] = {"split": "train", "index": i}
        if answers:
            info["answer"] = str(a + b)
        out.append({"data_source": "my/sums", "reward_model": {"style": "rule",
                                                               "ground_truth": str(a + b)},
                    "prompt": [{"role": "system", "content": "answer with a number"},
                               {"role": "user", "content": f"{a}+{b}="}],
                    "extra_info": info})
    return out


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's model folder: weights + config + tokenizer with a chat template."""
    path = tmp_path_factory.mktemp("own") / "tiny-qwen2"
    model, tok = build_model("qwen2-1m", seed=3)
    tok.chat_template = CHAT_TEMPLATE
    save_model(model, tok, path)
    return path


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's folder: data and reward file, read by relative paths."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JIGSAWRL_CACHE", str(tmp_path / "cache"))
    write_jsonl(tmp_path / "train.jsonl", rows(12))
    write_jsonl(tmp_path / "val.jsonl", rows(4))
    (tmp_path / "my_reward.py").write_text(REWARD)
    return tmp_path


def config(model: Path | str, **over: Any) -> dict[str, Any]:
    pipe = {"name": "mine", "model": str(model),
            "data": {"train_files": ["train.jsonl"], "val_files": ["val.jsonl"]},
            "custom_reward_function": {"path": "my_reward.py", "name": "compute_score"},
            "batch_size": 2, "group_size": 2, "steps": 1, "max_response_tokens": 8,
            "train": {"warmup_steps": 2, "threads": 1, "eval_size": 2, "micro_batch_size": 4}}
    pipe.update(over)
    return {"cluster": {"accelerator": "cpu-worker", "accelerators_per_node": 1},
            "pipelines": [pipe]}


def write_config(folder: Path, cfg: dict[str, Any]) -> Path:
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_own_model_data_and_reward_through_jigsawrl_run(workdir: Path, model_dir: Path) -> None:
    result = runner.invoke(app, ["run", str(write_config(workdir, config(model_dir))),
                                 "--out", "out"])
    assert result.exit_code == 0, result.output
    (p,) = json.loads((workdir / "out" / "summary.json").read_text())["pipelines"]
    assert p["steps"] == 1 and p["task"] == "data" and p["model"] == str(model_dir)
    assert p["data"] == {"train_files": ["train.jsonl"], "val_files": ["val.jsonl"],
                         "train_rows": 12, "val_rows": 2}
    assert p["reward_function"] == "my_reward.py:compute_score"
    assert p["reward_errors"] == {"total": 0, "by_reason": {}}
    assert "skipped" not in p["warm_start"]  # extra_info.answer gave the demonstrations
    # the file's rewards are 1.0 or 0.1: every sample was scored by it
    assert all(0.1 <= r <= 1.0 for r in p["reward_mean_per_step"])
    assert 0.1 <= p["eval_reward_before"] <= 1.0


def test_a_raising_reward_scores_zero_with_the_reason_counted(workdir: Path) -> None:
    write_jsonl(workdir / "train.jsonl", rows(12, answers=False))
    (workdir / "my_reward.py").write_text(RAISING)
    cfg = load_config(data=config("qwen2-1m", steps=2))
    events: list[dict[str, Any]] = []
    summary = run_experiment(cfg, None, on_step=events.append, cache_dir=workdir / "cache")
    (p,) = summary["pipelines"]
    metrics = [e["metrics"] for e in events if e["event"] == "step"]
    assert len(metrics) == 2
    for m in metrics:
        assert m["critic/score/mean"] == 0.0
        assert m["reward/errors"] == 4.0
        assert (m.get("reward/errors/ZeroDivisionError", 0.0)
                + m.get("reward/errors/not_a_number", 0.0)) == 4.0
    by = p["reward_errors"]["by_reason"]
    assert p["reward_errors"]["total"] == 8 and sum(by.values()) == 8
    assert set(by) == {"ZeroDivisionError", "not_a_number"}  # seeded: both kinds occur
    # the eval (greedy, 2 rows of val.jsonl: index 0 and 1) meets both kinds of failure
    assert p["eval_reward_before"] == 0.0
    assert "no demonstrations" in p["warm_start"]["skipped"]  # no response field in the rows


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a model fails the test: every input error must come before."""
    def tripwire(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a model was built before the input error")

    monkeypatch.setattr("jigsawrl.engine.pipeline.build_model_and_tokenizer", tripwire)


def run_cli(folder: Path, cfg: dict[str, Any]) -> tuple[int, str]:
    result = runner.invoke(app, ["run", str(write_config(folder, cfg))])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, " ".join(result.output.split())


def test_input_errors_exit_2_before_any_model(workdir: Path, model_dir: Path,
                                              no_model: None) -> None:
    code, out = run_cli(workdir, config(model_dir, data={"train_files": ["nope.jsonl"]}))
    assert code == 2 and "nope.jsonl" in out and "data file not found" in out
    bad = rows(3)
    del bad[2]["reward_model"]["ground_truth"]
    write_jsonl(workdir / "bad.jsonl", bad)
    code, out = run_cli(workdir, config(model_dir, data={"train_files": ["bad.jsonl"]}))
    assert code == 2 and "bad.jsonl:3" in out and "'reward_model.ground_truth': missing" in out
    (workdir / "broken.py").write_text("import not_installed_anywhere\n")
    code, out = run_cli(workdir, config(model_dir, custom_reward_function={"path": "broken.py"}))
    assert code == 2 and "broken.py" in out and "No module named 'not_installed_anywhere'" in out
    code, out = run_cli(workdir, config(model_dir, custom_reward_function={
        "path": "my_reward.py", "name": "score"}))
    assert code == 2 and "has no function 'score'" in out
    # a second pipeline's error stops the run before the first one starts
    cfg = config(model_dir)
    cfg["pipelines"].append({**cfg["pipelines"][0], "name": "two",
                             "custom_reward_function": {"path": "missing.py"}})
    code, out = run_cli(workdir, cfg)
    assert code == 2 and "pipelines.1.custom_reward_function.path" in out


def test_simulate_needs_a_preset_or_a_length_trace_for_a_data_pipeline(workdir: Path) -> None:
    sim = {"cluster": {"accelerator": "h100-80gb", "accelerators_per_node": 8},
           "pipelines": [{"name": "mine", "model": "qwen3-4b", "steps": 2, "batch_size": 8,
                          "data": {"train_files": ["train.jsonl"]}}]}
    with pytest.raises(ConfigError, match="needs a task preset or a length_trace") as err:
        resolve(load_config(data=sim))
    assert err.value.where == "pipelines.0.data" and "gsm8k" in err.value.fix
    result = runner.invoke(app, ["simulate", str(write_config(workdir, sim)), "--no-solo",
                                 "--no-timeline"])
    assert result.exit_code == 2 and "length_trace" in result.output
    assert "Traceback" not in result.output
    (workdir / "lengths.txt").write_text("100,300\n120,500\n")
    sim["pipelines"][0]["length_trace"] = "lengths.txt"
    exp = resolve(load_config(data=sim))
    assert exp.pipelines[0].sampler.trace == [(100, 300), (120, 500)]
    del sim["pipelines"][0]["length_trace"]
    sim["pipelines"][0]["task"] = "gsm8k"
    assert resolve(load_config(data=sim)).pipelines[0].task.name == "gsm8k"


def test_own_model_data_and_reward_through_jigsawrl_run_ray(workdir: Path, model_dir: Path) -> None:
    """The same user files under ``--ray``: the reward file is loaded in the reward worker,
    the data and the model folder in the device workers (relative paths from the user's
    folder); the folder's shape comes from its config.json for the planner's cost model."""
    pytest.importorskip("ray")
    cfg = config(model_dir, steps=2)
    cfg["scheduler"] = {"name": "jigsaw"}
    result = runner.invoke(app, ["run", str(write_config(workdir, cfg)), "--ray", "--out", "out"])
    assert result.exit_code == 0, result.output
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    (p,) = summary["pipelines"]
    assert p["steps"] == 2
    rewards = [m["critic/score/mean"] for m in summary["pipeline_metrics"]["mine"]]
    assert len(rewards) == 2 and all(0.1 <= r <= 1.0 for r in rewards)  # the file scored them
