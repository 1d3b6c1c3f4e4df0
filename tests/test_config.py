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
    (cfg(use_ref=False, train={"kl_coef": 0.1}), "pipelines.0", "set use_ref: true"),
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


# ------------------------------------------------------------------ reliability: every input

def test_measured_crashes_are_now_clear_errors() -> None:
    """The two tracebacks the issue measured: a MemoryError and a NaN cast."""
    with pytest.raises(ConfigError, match=r"pipelines\.0\.batch_size: .*less than or equal"):
        load_config(data=cfg(batch_size=1_000_000_000))
    with pytest.raises(ConfigError, match=r"pipelines\.0\.length_drift_per_step: .*finite"):
        load_config(data=cfg(length_drift_per_step=float("nan")))


def test_range_errors_say_what_the_key_is_and_its_valid_range() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(data=cfg(group_size=0))
    assert "responses per prompt; valid: 1 to 1,024" in str(exc.value)
    with pytest.raises(ConfigError, match=r"valid: > -1 and <= 1"):
        load_config(data=cfg(length_drift_per_step=-1))


def test_a_shrinking_drift_is_valid_and_shortens_responses() -> None:
    import numpy as np

    exp = resolve(load_config(data=cfg(length_drift_per_step=-0.5, steps=3)))
    sampler = exp.pipelines[0].sampler

    def mean_len(step: int) -> float:
        reqs = sampler.sample_step(np.random.default_rng(0), "a", step, 16)
        return sum(r.response_tokens for r in reqs) / len(reqs)

    assert mean_len(2) < mean_len(0)


def test_growth_past_float_range_is_the_cap_not_a_crash() -> None:
    import numpy as np

    exp = resolve(load_config(data=cfg(length_drift_per_step=1.0, steps=2000, batch_size=1,
                                       group_size=1, max_response_tokens=64)))
    sampler = exp.pipelines[0].sampler
    assert sampler.growth(1500) == float("inf")
    (req,) = sampler.sample_step(np.random.default_rng(0), "a", 1500, 1)
    assert req.response_tokens == 64


def test_free_form_params_must_be_finite() -> None:
    with pytest.raises(ConfigError, match=r"scheduler\.params: depth must be a finite number"):
        load_config(data=cfg(), overrides=["scheduler.params.depth=.nan"])
    with pytest.raises(ConfigError, match=r"pipelines\.0\.rollout\.task_params: a\.0"):
        load_config(data=cfg(), overrides=["pipelines.0.rollout.task_params.a=[.inf]"])


def test_length_trace_that_does_not_exist_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        resolve(load_config(data=cfg(length_trace="no/such/trace.txt")))
    text = str(exc.value)
    assert text.startswith("pipelines.0.length_trace: 'no/such/trace.txt'")
    assert "not found" in text and "current folder" in text
    bad = tmp_path / "t.txt"
    bad.write_text("12,abc\n")
    with pytest.raises(ConfigError, match=r"pipelines\.0\.length_trace: .*line 1"):
        resolve(load_config(data=cfg(length_trace=str(bad))))


@pytest.mark.parametrize("overrides,where,suggestion", [
    (["cluster.accelerator=h100-80g"], "cluster.accelerator", "did you mean 'h100-80gb'"),
    (["pipelines.0.model=qwen3-4"], "pipelines.0.model", "did you mean 'qwen3-4b'"),
    (["pipelines.0.task=gsm8"], "pipelines.0.task", "did you mean 'gsm8k'"),
    (["scheduler.name=jigsw"], "scheduler.name", "did you mean 'jigsaw'"),
])
def test_vocabularies_suggest_on_a_typo(overrides: list[str], where: str,
                                        suggestion: str) -> None:
    from jigsawrl.experiments.simulated import simulate

    with pytest.raises(ConfigError) as exc:
        simulate(load_config(data=cfg(), overrides=overrides), solo=False)
    assert exc.value.where == where and suggestion in str(exc.value)


@pytest.mark.parametrize("overrides,where,suggestion", [
    (["cluster.accelerator=cpu-workr"], "cluster.accelerator", "did you mean 'cpu-worker'"),
    (["pipelines.0.model=qwen2-1n"], "pipelines.0.model", "did you mean 'qwen2-1m'"),
    (["pipelines.0.task=countdwn"], "pipelines.0.task", "did you mean 'countdown'"),
    (["scheduler.name=jigsaww"], "scheduler.name", "did you mean 'jigsaw'"),
])
def test_real_vocabularies_suggest_on_a_typo(overrides: list[str], where: str,
                                             suggestion: str) -> None:
    from jigsawrl.experiments.resolve import resolve_real

    with pytest.raises(ConfigError) as exc:
        resolve_real(load_config("configs/real/bench.yaml", overrides))
    assert exc.value.where == where and suggestion in str(exc.value)


def test_request_budget_is_checked_before_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    from jigsawrl.experiments import resolve as res
    from jigsawrl.workload.task_presets import RequestSampler

    def never(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("sampled before the budget check")

    monkeypatch.setattr(RequestSampler, "sample_step", never)
    big = load_config(data=cfg(batch_size=1_000_000, group_size=4, steps=10))
    assert res.sampled_requests(big) == 40_000_000
    with pytest.raises(ConfigError) as exc:
        res.resolve(big)
    text = str(exc.value)
    assert exc.value.where == "pipelines"
    assert "40,000,000 requests" in text and "budget of 2,000,000" in text
    assert "pipelines.0 ('a'): 1,000,000 × 4 × 10" in text
    assert "--max-requests 40000000" in text and "JIGSAWRL_MAX_REQUESTS" in text
    with pytest.raises(ConfigError, match="budget of 2,000,000"):
        res.resolve_real(load_config("configs/real/bench.yaml",
                                     ["pipelines.0.batch_size=1000000"]))


def test_request_budget_can_be_raised_and_lowered_for_a_block() -> None:
    from jigsawrl.experiments import resolve as res

    c = load_config(data=cfg(batch_size=8, group_size=2, steps=1))  # 16 requests
    with res.request_budget(15), pytest.raises(ConfigError, match="16 requests"):
        res.resolve(c)
    with res.request_budget(16):
        res.resolve(c)
    assert res.max_requests() == res.DEFAULT_MAX_REQUESTS
    with pytest.raises(ConfigError, match="at least 1"), res.request_budget(0):
        pass


def test_shipped_configs_are_far_below_the_default_budget() -> None:
    import yaml

    from jigsawrl.config import validate_config
    from jigsawrl.experiments.resolve import DEFAULT_MAX_REQUESTS, sampled_requests

    sizes = []
    for path in sorted(Path("configs").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        raw.pop("bench", None)
        sizes.append(sampled_requests(validate_config(raw)))
    assert max(sizes) <= 25_000 and max(sizes) * 50 < DEFAULT_MAX_REQUESTS


def test_a_paper_matrix_file_loads_as_an_ordinary_config() -> None:
    """``simulate`` / ``compare`` run a configs/paper/ file; its bench block is left to
    ``bench paper``, and a bench key in a plain dict is still refused."""
    from pathlib import Path

    from jigsawrl.config import load_config

    path = Path(__file__).resolve().parents[1] / "configs" / "paper" / "sync-gsm8k-math.yaml"
    cfg = load_config(path)
    assert len(cfg.pipelines) == 2
    with pytest.raises(ConfigError, match="bench"):
        load_config(data={"pipelines": [{"name": "a", "model": "qwen3-4b", "task": "gsm8k"}],
                          "bench": {}})


def test_a_real_run_measures_each_task_prompt_length_for_the_priors() -> None:
    """resolve_real fills ``prompt_tokens`` with the mean encoded length of the task's own
    prompts (BOS included), as the engine will read them; a value the config sets is kept."""
    from jigsawrl.engine.pipeline import PROMPT_SAMPLE
    from jigsawrl.engine.tokenizer import build_char_tokenizer
    from jigsawrl.engine.trajectory import encode_prompt
    from jigsawrl.experiments.resolve import resolve_real
    from jigsawrl.tasks import build_task

    c = load_config("configs/real/bench.yaml")
    exp = resolve_real(c)
    tok = build_char_tokenizer()
    for p, spec in zip(exp.pipelines, c.pipelines, strict=True):
        prompts = build_task(spec).make_dataset(PROMPT_SAMPLE, c.seed, "train")
        want = round(sum(len(encode_prompt(tok, ex.prompt)) for ex in prompts) / len(prompts))
        assert p.spec.prompt_tokens == want and 5 <= want <= 60
        assert exp.config.pipelines[p.index].prompt_tokens == want
    kept = resolve_real(load_config("configs/real/bench.yaml", ["pipelines.0.prompt_tokens=77"]))
    assert kept.pipelines[0].spec.prompt_tokens == 77


def test_a_real_run_gives_the_priors_each_task_tool_calls() -> None:
    """resolve_real fills ``prior_tool_calls`` / ``prior_tool_result_tokens`` from the task's
    own estimates (none for a single-turn task); a value the config sets is kept."""
    from jigsawrl.experiments.resolve import resolve_real
    from jigsawrl.tasks import build_task

    c = load_config("configs/real/bench.yaml")
    exp = resolve_real(c)
    by_name = {p.spec.name: p.spec for p in exp.pipelines}
    assert by_name["countdown"].prior_tool_calls == 0.0
    assert by_name["calculator"].prior_tool_calls == 1.0  # num_ops: 1
    search = build_task(next(p for p in c.pipelines if p.name == "search"))
    assert by_name["search"].prior_tool_calls == pytest.approx(1.0 + search.two_hop_fraction)
    assert by_name["search"].prior_tool_result_tokens == 31 * search.top_k
    kept = resolve_real(load_config("configs/real/bench.yaml",
                                    ["pipelines.1.prior_tool_calls=3"]))
    assert kept.pipelines[1].spec.prior_tool_calls == 3.0
