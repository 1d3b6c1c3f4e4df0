"""``compare_policies`` degrades, never aborts: a policy that cannot run the workload is skipped
with its reason, the baseline moves to the next policy if it was the one, and only "no policy can
run" (or a bad config) is an error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from jigsawrl.config import load_config
from jigsawrl.driver.loop import SchedulerStalled
from jigsawrl.driver.state import InvariantError
from jigsawrl.errors import ConfigError
from jigsawrl.experiments import compare as cmp
from jigsawrl.experiments.compare import compare_policies
from jigsawrl.experiments.simulated import SimRun

TINY = ["pipelines.0.steps=1", "pipelines.1.steps=1", "pipelines.0.batch_size=4",
        "pipelines.1.batch_size=4"]


def tiny() -> Any:
    return load_config("configs/two-gsm8k.yaml", TINY)


def eight_on_one_node() -> Any:
    pipes = [{"name": f"p{i}", "model": "qwen3-4b", "task": "gsm8k", "batch_size": 4,
              "group_size": 2, "max_response_tokens": 512, "steps": 1} for i in range(8)]
    return load_config(data={"cluster": {"accelerator": "h100-80gb",
                                         "accelerators_per_node": 8}, "pipelines": pipes})


@pytest.fixture
def fake_sim(monkeypatch: pytest.MonkeyPatch) -> dict[str, Exception]:
    """Simulations replaced by instant fakes; a label in the returned dict raises its error."""
    fails: dict[str, Exception] = {}

    def simulate(cfg: Any, *, policy: str, seed: int, solo: Any) -> SimRun:
        if policy in fails:
            raise fails[policy]
        tput = {"verl-split": 100.0, "verl-serial": 80.0, "jigsaw": 120.0}.get(policy, 50.0)
        summary = {"policy": policy, "throughput_tokens_per_s": tput + seed}
        return SimRun(policy, seed, [], summary, None)  # type: ignore[arg-type]

    monkeypatch.setattr(cmp, "simulate", simulate)
    monkeypatch.setattr(cmp, "solo_latencies", lambda cfg, seed: {})
    return fails


@pytest.mark.parametrize("error", [
    ConfigError("does not fit", where="pipelines"),
    InvariantError("device 0 over-committed"),
    SchedulerStalled("started nothing while nothing ran"),
])
def test_a_policy_that_cannot_run_is_skipped_with_its_reason(
        fake_sim: dict[str, Exception], error: Exception) -> None:
    fake_sim["jigsaw"] = error
    res = compare_policies(tiny(), ["verl-split", "jigsaw", "verl-serial"], seeds=2,
                           baseline="verl-split")
    assert res.policies == ["verl-split", "verl-serial"] and res.baseline == "verl-split"
    assert res.skipped == {"jigsaw": f"{type(error).__name__}: {error}"}
    doc = json.loads(json.dumps(res.to_json()))
    assert doc["skipped"] == res.skipped and set(doc["runs"]) == {"verl-split", "verl-serial"}
    assert "requested_baseline" not in doc
    assert len(res.runs["verl-split"]) == 2


def test_a_skipped_baseline_is_replaced_by_the_first_policy_left(
        fake_sim: dict[str, Exception]) -> None:
    fake_sim["verl-split"] = ConfigError("no device for each pipeline")
    res = compare_policies(tiny(), ["verl-split", "verl-serial", "jigsaw"],
                           baseline="verl-split")
    assert res.baseline == "verl-serial" and res.requested_baseline == "verl-split"
    assert res.ratios()["jigsaw"]["verl-serial"] == pytest.approx(1.5)
    assert res.to_json()["requested_baseline"] == "verl-split"


def test_no_policy_can_run_is_one_error_with_every_reason(
        fake_sim: dict[str, Exception]) -> None:
    fake_sim["verl-split"] = ConfigError("split: no room", fix="use more devices")
    fake_sim["jigsaw"] = InvariantError("jigsaw: over-committed")
    with pytest.raises(ConfigError) as exc:
        compare_policies(tiny(), ["verl-split", "jigsaw"])
    text = str(exc.value)
    assert exc.value.where == "--policies" and "no policy can run this workload" in text
    assert "verl-split: ConfigError: split: no room; fix: use more devices" in text
    assert "jigsaw: InvariantError: jigsaw: over-committed" in text


def test_skip_failed_false_lets_the_error_through(fake_sim: dict[str, Exception]) -> None:
    fake_sim["jigsaw"] = InvariantError("over-committed")
    with pytest.raises(InvariantError):
        compare_policies(tiny(), ["verl-split", "jigsaw"], skip_failed=False)


def test_a_bug_is_not_a_skip(fake_sim: dict[str, Exception]) -> None:
    fake_sim["jigsaw"] = ZeroDivisionError("a bug")
    with pytest.raises(ZeroDivisionError):
        compare_policies(tiny(), ["verl-split", "jigsaw"])


def test_no_solo_reference_is_a_note_not_an_abort(fake_sim: dict[str, Exception],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def no_solo(cfg: Any, seed: int) -> dict[str, float]:
        raise InvariantError("solo run over-committed")

    monkeypatch.setattr(cmp, "solo_latencies", no_solo)
    res = compare_policies(tiny(), ["verl-split", "jigsaw"])
    assert set(res.runs) == {"verl-split", "jigsaw"}
    assert res.notes and "solo run over-committed" in res.notes[0]
    assert res.to_json()["notes"] == res.notes


def test_config_errors_and_unknown_names_are_errors_not_skips(
        fake_sim: dict[str, Exception]) -> None:
    with pytest.raises(ConfigError, match="did you mean 'muxserve'"):
        compare_policies(tiny(), ["verl", "muxserv"])
    bad = load_config("configs/two-gsm8k.yaml", [*TINY, "pipelines.0.num_devices=9"])
    with pytest.raises(ConfigError) as exc:
        compare_policies(bad, ["verl-split", "jigsaw"])
    assert exc.value.where == "pipelines.0.num_devices"


def test_muxserve_with_eight_pipelines_on_a_node_is_skipped_for_real() -> None:
    """The case the issue measured: muxserve cannot keep 8 Qwen3-4B pipelines resident."""
    res = compare_policies(eight_on_one_node(), ["verl-serial", "muxserve"],
                           baseline="verl-serial")
    assert res.policies == ["verl-serial"]
    assert res.skipped["muxserve"].startswith("ConfigError: pipelines: muxserve keeps all 8")
    assert res.mean_summaries["verl-serial"]["throughput_tokens_per_s"] > 0
