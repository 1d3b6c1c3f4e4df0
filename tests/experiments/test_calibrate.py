"""calibrate.py: replaying a run's observed workload in the simulator, and the side by side.

No Ray and no torch: the experiments are built by hand with a small ModelSpec (what
``experiments.resolve.resolve_real`` would build from an engine preset), and the "real" runs are simulated
runs whose events stand in for a real run's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jigsawrl.config import load_config
from jigsawrl.errors import InputError
from jigsawrl.events import SampleFinished, StepFinished
from jigsawrl.experiments.calibrate import (
    TARGET_REL_ERROR,
    Compared,
    ReplaySampler,
    calibrate,
    observed_requests,
    replay_experiment,
    replay_request,
    simulate_replay,
    tool_latency_s,
    tool_result_tokens,
    truth_cost,
)
from jigsawrl.experiments.real import real_belief
from jigsawrl.workload.experiment import Experiment, ResolvedPipeline
from jigsawrl.workload.models import ModelSpec
from jigsawrl.workload.realpresets import CPU_ACCELERATOR
from jigsawrl.workload.requests import RequestTruth, TurnTruth
from jigsawrl.workload.task_presets import RequestSampler, TaskSpec

TINY_MODEL = ModelSpec(name="tiny", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
                       head_dim=32, intermediate_size=512, vocab_size=100, num_params=1e6,
                       source="test")


def config(policy: str = "verl-serial", steps: int = 2) -> object:
    pipes = [
        {"name": "count", "model": "qwen2-1m", "task": "countdown", "batch_size": 2,
         "group_size": 2, "max_response_tokens": 32, "steps": steps, "use_ref": False},
        {"name": "calc", "model": "qwen2-1m", "task": "calculator", "batch_size": 2,
         "group_size": 2, "max_response_tokens": 64, "steps": steps, "use_ref": False,
         "rollout": {"tool_latency_s": 0.2, "task_params": {"tool_latency_s": 0.05}}},
    ]
    return load_config(data={"name": "cal-test", "seed": 3, "pipelines": pipes,
                             "cluster": {"accelerator": "cpu-worker", "num_nodes": 1,
                                         "accelerators_per_node": 2},
                             "scheduler": {"name": policy}})


def experiment(cfg: object) -> Experiment:
    pipes = []
    for i, p in enumerate(cfg.pipelines):  # type: ignore[attr-defined]
        task = TaskSpec(name=p.task, prompt_mean=32, prompt_std=0,  # as experiments.resolve.stub_task
                        response_median=p.max_response_tokens // 4, response_sigma=0.0,
                        prompt_difficulty_sigma=0.0)
        sampler = RequestSampler(task, group_size=p.group_size,
                                 max_response_tokens=p.max_response_tokens)
        pipes.append(ResolvedPipeline(i, p, TINY_MODEL, task, sampler))
    return Experiment(cfg, CPU_ACCELERATOR, tuple(pipes))  # type: ignore[arg-type]


TOOL_TOKENS = {"count": 0.0, "calc": 8.0}


def truth_workload(steps: int = 2) -> dict[str, dict[int, list[RequestTruth]]]:
    """A workload whose shape replay_request reproduces exactly (even turns, 8-token results)."""
    out: dict[str, dict[int, list[RequestTruth]]] = {"count": {}, "calc": {}}
    for s in range(steps):
        out["count"][s] = [RequestTruth(f"count/{s}/{p}/{g}", 20 + p, (TurnTruth(10 + 3 * g + s),))
                           for p in range(2) for g in range(2)]
        out["calc"][s] = [RequestTruth(f"calc/{s}/{p}/{g}", 15, (
            TurnTruth(6 + g, 0.25, 8), TurnTruth(6 + g))) for p in range(2) for g in range(2)]
    return out


def sample(pipeline: str, step: int, p: int, g: int, prompt: int, resp: int,
           turns: int = 1) -> SampleFinished:
    return SampleFinished(pipeline, step, f"{pipeline}/{step}/{p}/{g}", 1.0, prompt, resp, turns)


def test_replay_request_keeps_lengths_and_turns() -> None:
    req = replay_request(sample("calc", 0, 0, 0, 17, 40, turns=3), tool_tokens=8, latency_s=0.3)
    assert req.prompt_tokens == 17 and req.response_tokens == 40 and len(req.turns) == 3
    assert [t.tool_result_tokens for t in req.turns] == [8, 8, 0]
    assert [t.tool_latency_s for t in req.turns] == [0.3, 0.3, 0.0]
    assert req.generated_tokens == 24


def test_replay_request_caps_tool_results_to_leave_a_token_per_turn() -> None:
    req = replay_request(sample("calc", 0, 0, 0, 5, 4, turns=3), tool_tokens=50, latency_s=0.0)
    assert req.response_tokens == 4 and all(t.response_tokens >= 1 for t in req.turns)


def test_replay_uses_generated_tokens_when_an_event_has_them() -> None:
    from jigsawrl.events import SampleFinished

    ev = SampleFinished("calc", 0, "calc/0/0/0", 1.0, 10, 30, 2, 0, generated_tokens=12)
    req = replay_request(ev, tool_tokens=8, latency_s=0.0)
    assert req.generated_tokens == 12 and req.response_tokens == 30
    unknown = SampleFinished("calc", 0, "calc/0/0/0", 1.0, 10, 30, 2, 0)  # -1: estimated
    assert replay_request(unknown, tool_tokens=8, latency_s=0.0).generated_tokens == 22


def test_observed_requests_reproduce_the_observed_lengths_in_engine_order() -> None:
    cfg = config()
    events = [sample("calc", 1, 1, 0, 12, 30, 2), sample("calc", 1, 0, 1, 11, 25, 2),
              sample("count", 0, 0, 0, 9, 7), StepFinished("count", 0, 0.0, 1.0)]
    reqs = observed_requests(events, cfg, tool_tokens=TOOL_TOKENS)
    calc = reqs["calc"][1]
    assert [r.sample_id for r in calc] == ["calc/1/0/1", "calc/1/1/0"]
    assert [(r.prompt_tokens, r.response_tokens, len(r.turns)) for r in calc] == [
        (11, 25, 2), (12, 30, 2)]
    assert calc[0].turns[0].tool_latency_s == pytest.approx(0.25)  # config 0.2 + task 0.05
    assert reqs["count"][0][0].turns == (TurnTruth(7),)


def test_observed_requests_reject_a_pipeline_the_config_lacks() -> None:
    with pytest.raises(InputError, match="'other'"):
        observed_requests([sample("other", 0, 0, 0, 1, 1)], config(), tool_tokens={})


def test_replay_sampler_returns_the_step_and_refuses_to_invent_one() -> None:
    steps = truth_workload(1)["count"]
    s = ReplaySampler("count", [steps[0]])
    assert s.sample_step(None, "count", 0, 99) == steps[0]  # type: ignore[arg-type]
    with pytest.raises(InputError, match="step 1"):
        s.sample_step(None, "count", 1, 2)  # type: ignore[arg-type]


def test_tool_helpers_read_the_task_and_config() -> None:
    cfg = config()
    count, calc = cfg.pipelines
    assert tool_result_tokens(count) == 0.0
    assert 3 <= tool_result_tokens(calc) <= 20  # "<r>123</r>"-sized results
    assert tool_latency_s(calc) == pytest.approx(0.25)


@pytest.mark.parametrize("policy", ["verl-serial", "greedy"])
def test_prediction_of_a_run_with_the_same_cost_model_is_exact(policy: str) -> None:
    """A 'real' run simulated with the built-in cost model, noise off, is predicted exactly by
    replaying its own observed workload with that cost model."""
    cfg = config(policy)
    exp = experiment(cfg)
    measured, events = simulate_replay(replay_experiment(exp, truth_workload()), policy,
                                       truth_cost(exp, None))
    cal = calibrate(cfg, events, policy, exp=exp, tool_tokens=TOOL_TOKENS)
    assert cal.pool["makespan_s"].measured == pytest.approx(measured["makespan_s"])
    assert cal.max_abs_rel_error == pytest.approx(0.0, abs=1e-9)
    assert cal.within_target
    for name in ("count", "calc"):
        c = cal.pipelines[name]["step_latency_s"]
        assert c.predicted == pytest.approx(c.measured)
    assert cal.to_json()["within_target"] is True
    # the replayed workload's realistic bound: no schedule of it beats it on that pool
    assert cal.bound_s is not None and 0 < cal.bound_s <= measured["makespan_s"] * (1 + 1e-9)
    assert cal.bound_tokens_per_s == pytest.approx(measured["tokens"] / cal.bound_s)
    assert cal.to_json()["bound_s"] == cal.bound_s


def write_profile(path: Path, peak_flops: float) -> Path:
    params = {"prefill_eff": 0.5, "decode_compute_eff": 0.5, "hbm_bw_eff": 0.8,
              "logprob_eff": 0.5, "train_eff": 0.5, "iter_overhead_s": 0.004,
              "iter_overhead_per_seq_s": 0.0, "weight_sync_overhead_s": 0.002}
    doc = {"version": 1, "source": "test profile", "fitted": {
        "accelerator": {"peak_flops": peak_flops, "hbm_bytes_per_s": 1e10,
                        "host_link_bytes_per_s": 5e9}, "params": params}}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_profile_is_the_truth_and_a_miss_is_reported(tmp_path: Path) -> None:
    cfg = config("verl-serial")
    exp = experiment(cfg)
    _, events = simulate_replay(replay_experiment(exp, truth_workload()), "verl-serial",
                                truth_cost(exp, None))
    slow = write_profile(tmp_path / "slow.yaml", peak_flops=1e8)  # 1000x slower than preset
    assert truth_cost(exp, slow).accel.peak_flops == 1e8
    cal = calibrate(cfg, events, "verl-serial", profile=slow, exp=exp, tool_tokens=TOOL_TOKENS)
    assert cal.cost_source.startswith("test profile")
    assert cal.pool["makespan_s"].predicted > cal.pool["makespan_s"].measured
    assert cal.max_abs_rel_error is not None and cal.max_abs_rel_error > TARGET_REL_ERROR
    assert not cal.within_target


def test_a_run_on_a_slower_machine_is_predicted_exactly_once_scaled_by_its_probe(
        tmp_path: Path) -> None:
    """The 'real' run ran on the profiled machine 1.5x slower (its probe says so): the raw
    prediction misses by that, the speed-adjusted one is exact; a run without probes gets none."""
    cfg = config("verl-serial")
    exp = experiment(cfg)
    prof = write_profile(tmp_path / "p.yaml", peak_flops=1e10)
    doc = yaml.safe_load(prof.read_text())
    doc["machine"] = {"speed_probe_s": 0.02}
    prof.write_text(yaml.safe_dump(doc))
    measured, events = simulate_replay(replay_experiment(exp, truth_workload()), "verl-serial",
                                       truth_cost(exp, prof, speed_factor=1.5))
    measured["speed_probes_s"] = [0.029, 0.03, 0.031]
    cal = calibrate(cfg, events, "verl-serial", profile=prof, exp=exp, tool_tokens=TOOL_TOKENS,
                    measured=measured)
    assert cal.speed_factor == pytest.approx(1.5)
    raw = cal.pool["makespan_s"].rel_error
    assert raw is not None and raw < -0.1  # the profile's machine was faster
    adjusted = cal.speed_adjusted
    assert adjusted is not None
    assert adjusted["pool"]["makespan_s"]["rel_error"] == pytest.approx(0.0, abs=1e-6)
    for name in ("count", "calc"):
        assert adjusted["pipelines"][name]["step_latency_s"]["rel_error"] == pytest.approx(
            0.0, abs=1e-6)
    for stages in adjusted["stages"].values():
        for c in stages.values():
            assert c["rel_error"] is None or c["rel_error"] == pytest.approx(0.0, abs=1e-6)
    assert cal.to_json()["speed_factor"] == pytest.approx(1.5)
    # the probes after the run count too: the median of both ends
    measured["speed_probes_end_s"] = [0.04, 0.04, 0.04, 0.04]
    both = calibrate(cfg, events, "verl-serial", profile=prof, exp=exp, tool_tokens=TOOL_TOKENS,
                     measured=measured)
    assert both.speed_factor == pytest.approx(0.04 / 0.02)
    del measured["speed_probes_s"], measured["speed_probes_end_s"]
    plain = calibrate(cfg, events, "verl-serial", profile=prof, exp=exp,
                      tool_tokens=TOOL_TOKENS, measured=measured)
    assert plain.speed_factor is None and plain.speed_adjusted is None


def test_a_missing_profile_is_an_input_error(tmp_path: Path) -> None:
    cfg = config()
    with pytest.raises(InputError, match="profile"):
        truth_cost(experiment(cfg), tmp_path / "nope.yaml")


def test_a_run_missing_a_pipeline_or_step_cannot_be_predicted() -> None:
    cfg = config()
    exp = experiment(cfg)
    only_count = [sample("count", s, 0, 0, 9, 7) for s in range(2)]
    with pytest.raises(InputError, match="'calc'"):
        calibrate(cfg, only_count, "verl-serial", exp=exp, tool_tokens=TOOL_TOKENS)


def test_a_pipeline_that_stopped_early_is_replayed_for_its_finished_steps() -> None:
    cfg = config("verl-serial")
    exp = experiment(cfg)
    _, events = simulate_replay(replay_experiment(exp, truth_workload()), "verl-serial",
                                truth_cost(exp, None))
    cut = [e for e in events if not (getattr(e, "pipeline", "") == "calc"
                                     and getattr(e, "step", 0) == 1)]
    cal = calibrate(cfg, cut, "verl-serial", exp=exp, tool_tokens=TOOL_TOKENS)
    assert cal.notes == ["calc: the real run finished 1 of 2 steps; the prediction replays those"]
    steps = {p["name"]: p["steps"] for p in cal.sim_summary["pipelines"]}
    assert steps == {"count": 2, "calc": 1}


def test_compared_rel_error() -> None:
    assert Compared(2.0, 2.2).rel_error == pytest.approx(0.1)
    assert Compared(None, 1.0).rel_error is None and Compared(0.0, 1.0).rel_error is None


def test_a_padding_trainer_costs_its_padded_rows() -> None:
    """With ``train_pads_rows`` (the CPU trainer) a log-prob or update pass over rows of uneven
    lengths costs each micro-batch's rows at its longest row: longer than by real tokens."""
    import dataclasses

    from jigsawrl.costmodel import CostModel

    cfg = config("verl-serial")
    exp = experiment(cfg)
    plain = truth_cost(exp, None)
    padded = CostModel(plain.accel, params=dataclasses.replace(plain.params,
                                                               train_pads_rows=True))

    def compute_s(truth: CostModel) -> dict[str, float]:
        _, events = simulate_replay(replay_experiment(exp, truth_workload()), "verl-serial",
                                    truth)
        out: dict[str, float] = {}
        for e in events:
            if getattr(e, "stage", "") in ("old_logprob", "actor_update"):
                out[e.stage] = out.get(e.stage, 0.0) + e.end_s - e.start_s  # type: ignore
        return out

    base, more = compute_s(plain), compute_s(padded)
    for stage in ("old_logprob", "actor_update"):
        assert more[stage] > base[stage], stage


def test_a_run_is_predicted_with_the_belief_its_policy_had(tmp_path: Path) -> None:
    """A real run's policy believes the profile it was given (``run_real``'s ``profile``; the
    summary's ``belief_profile``): the prediction gives the replayed policy that belief too, so
    a 'real' run simulated with the profile as truth and belief is predicted exactly, and the
    preset belief would not reproduce it."""
    cfg = config("greedy")
    exp = experiment(cfg)
    prof = write_profile(tmp_path / "p.yaml", peak_flops=1e8)  # far slower than the preset
    belief = real_belief(exp, prof)
    assert belief.accel.peak_flops == 1e8 and real_belief(exp).accel.peak_flops != 1e8
    replay = replay_experiment(exp, truth_workload())
    measured, events = simulate_replay(replay, "greedy", truth_cost(exp, prof), belief=belief)
    measured["belief_profile"] = str(prof)
    cal = calibrate(cfg, events, "greedy", profile=prof, exp=exp, tool_tokens=TOOL_TOKENS,
                    measured=measured)
    assert cal.max_abs_rel_error == pytest.approx(0.0, abs=1e-9)
    preset, _ = simulate_replay(replay, "greedy", truth_cost(exp, prof))
    assert preset["makespan_s"] != pytest.approx(measured["makespan_s"], rel=1e-6)
