"""jigsawrl profile: the fitter recovers known costs, and a quick real profile loads and is sane.

The fitting tests build raw timings from known parameters with the cost model's own formulas (no
torch), so the fit's accuracy is checked exactly. The end-to-end test runs ``jigsawrl profile
--quick --threads 1`` on this CPU; its wall-clock timings depend on the machine and its load, so it
only checks that the written profile loads and predicts each measurement within a factor of two
(which catches unit and shape bugs, not accuracy; accuracy is reported by ``jigsawrl profile``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jigsawrl.costmodel import CostModel
from jigsawrl.costmodel.fit import (
    DecodeFit,
    ProfileSettings,
    build_profile,
    fit_decode,
    fit_runtime,
    interleaved_median_times,
    nnls,
    parse_threads,
    slowdown_table,
)
from jigsawrl.costmodel.profile import load_profile, load_slowdown_table
from jigsawrl.costmodel.roofline import prefill_flops
from jigsawrl.errors import ConfigError
from jigsawrl.workload.models import ModelSpec

MODEL = ModelSpec(name="m", num_layers=4, hidden_size=128, num_heads=4, num_kv_heads=2,
                  head_dim=32, intermediate_size=512, vocab_size=100, num_params=1e6, source="t")
TRUE = {"overhead": 5e-3, "per_seq": 1e-4, "decode": 1e10, "prefill": 2e10, "logprob": 3e10,
        "train": 2.5e10, "bw": 1e10, "sync": 4e-3}


def _raw(rng: np.random.Generator | None = None, share: float = 1.0,
         slow: float = 1.0) -> dict[str, Any]:
    """Raw medians of one thread count from TRUE, with optional 2% noise.

    Decode follows the cost model's shape at ``share`` (FLOP term / share); every other stage is
    ``slow`` times slower (those shares are only tabulated, not fitted).
    """
    def noisy(t: float, factor: float = slow) -> float:
        return factor * t * (1.0 + (0.02 * rng.standard_normal() if rng is not None else 0.0))

    p, a = MODEL.num_params, MODEL.attn_flops_per_token_per_ctx()
    decode, prefill = [], []
    for length in (16, 192):
        for b in (1, 4, 16, 64):
            ctx = b * (length + 8)
            flops = (2 * p * b + a * ctx) / share
            t = TRUE["overhead"] + TRUE["per_seq"] * b + flops / TRUE["decode"]
            decode.append({"batch": b, "ctx_tokens": ctx, "time_s": noisy(t, 1.0)})
            f = prefill_flops(MODEL, b * length, 0, b)
            t = TRUE["overhead"] + TRUE["per_seq"] * b + f / TRUE["prefill"]
            prefill.append({"tokens": b * length, "seqs": b, "time_s": noisy(t)})
    tok, nbytes = 2048, 64 * 2**20
    return {
        "decode": decode, "prefill": prefill,
        "logprob": {"tokens": tok, "time_s": noisy(2 * p * tok / TRUE["logprob"])},
        "train": {"tokens": tok, "time_s": noisy(6 * p * tok / TRUE["train"] + 30 * p / TRUE["bw"])},
        "weight_sync": {"time_s": noisy(2 * MODEL.weight_bytes() / TRUE["bw"] + TRUE["sync"])},
        "memcpy": {"bytes": nbytes, "time_s": 2 * nbytes / TRUE["bw"]},
    }


def load_profile_doc() -> tuple[Any, Any]:
    """The accelerator and params of the synthetic profile (no runtime pass)."""
    from jigsawrl.costmodel.profile import cost_inputs

    return cost_inputs(_profile())


def _profile(rng: np.random.Generator | None = None) -> dict[str, Any]:
    raw = {1: _raw(rng, share=0.5, slow=1.8), 2: _raw(rng)}
    return build_profile(MODEL, ProfileSettings(model="m"), raw, {"cpu": "Test CPU"})


def test_nnls_matches_lstsq_and_clamps() -> None:
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    assert nnls(a, np.array([1.0, 3.0, 5.0])) == pytest.approx([1.0, 2.0])
    assert nnls(a, np.array([5.0, 3.0, 1.0])) == pytest.approx([3.0, 0.0])  # slope would be < 0


def test_fit_decode_recovers_exact_line() -> None:
    """At two shares every term is recovered; at one the per-sequence overhead cannot be told
    from the FLOP term (a sequence's dense FLOPs are 2 P), which carries it: same times."""
    both = [*_raw()["decode"], *({**q, "share": 0.5} for q in _raw(share=0.5)["decode"])]
    fit = fit_decode(MODEL, both)
    assert fit.overhead_s == pytest.approx(TRUE["overhead"], rel=1e-6)
    assert fit.per_seq_s == pytest.approx(TRUE["per_seq"], rel=1e-6)
    assert 1.0 / fit.s_per_flop == pytest.approx(TRUE["decode"], rel=1e-6)
    attention = MODEL.attn_flops_per_token_per_ctx() / TRUE["decode"]  # its FLOPs' price
    assert fit.s_per_ctx_token == pytest.approx(attention, rel=1e-6)
    one = fit_decode(MODEL, _raw()["decode"])
    assert one.overhead_s == pytest.approx(TRUE["overhead"], rel=1e-6) and one.per_seq_s == 0.0
    assert one.s_per_ctx_token == pytest.approx(attention, rel=1e-6)
    for q in _raw()["decode"]:
        b, ctx = q["batch"], q["ctx_tokens"]
        assert one.overhead_s + one.s_per_flop * 2 * MODEL.num_params * b + \
            one.s_per_ctx_token * ctx == pytest.approx(q["time_s"], rel=1e-6)
    with pytest.raises(ValueError):
        fit_decode(MODEL, _raw()["decode"][:2])


def test_the_decode_fit_prices_the_context_beyond_its_flops() -> None:
    """A CPU whose attention costs more per KV token than its FLOPs: the fit finds that cost
    (decode_ctx_s_per_token) and the cost model's decode iteration charges it."""
    extra = 3e-7  # seconds per KV token attended
    both = [*_raw()["decode"], *({**q, "share": 0.5} for q in _raw(share=0.5)["decode"])]
    pts = [{**q, "time_s": q["time_s"] + extra * q["ctx_tokens"] / q.get("share", 1.0)}
           for q in both]
    fit = fit_decode(MODEL, pts)
    attention = MODEL.attn_flops_per_token_per_ctx() / TRUE["decode"]
    assert fit.s_per_ctx_token == pytest.approx(attention + extra, rel=1e-6)
    assert fit.per_seq_s == pytest.approx(TRUE["per_seq"], rel=1e-6)
    pts = [q for q in pts if "share" not in q]
    raw = _raw()
    raw["decode"] = pts  # one share: the per-sequence overhead rides the FLOP term
    doc = build_profile(MODEL, ProfileSettings(model="m"), {1: raw}, {"cpu": "Test CPU"})
    got = doc["fitted"]["params"]["decode_ctx_s_per_token"]
    assert got == pytest.approx(attention + extra, rel=1e-6)
    assert max(abs(r["rel_error"]) for r in doc["fitted"]["decode_errors"]) < 1e-6


def test_fit_params_recovers_known_costs() -> None:
    fitted = _profile()["fitted"]
    acc, par = fitted["accelerator"], fitted["params"]
    peak = max(TRUE[k] for k in ("decode", "prefill", "logprob", "train"))
    assert acc["peak_flops"] == pytest.approx(peak)
    assert acc["hbm_bytes_per_s"] == pytest.approx(TRUE["bw"])
    for stage in ("decode", "prefill", "logprob", "train"):
        key = "decode_compute_eff" if stage == "decode" else f"{stage}_eff"
        assert par[key] == pytest.approx(TRUE[stage] / peak, rel=1e-6), key
    assert par["iter_overhead_s"] == pytest.approx(TRUE["overhead"])
    assert par["weight_sync_overhead_s"] == pytest.approx(TRUE["sync"])
    assert fitted["slowdown"]["actor_update"] == {0.5: pytest.approx(1.8), 1.0: 1.0}
    assert max(abs(r["rel_error"]) for r in fitted["decode_errors"]) < 1e-6  # both shares


def test_fit_is_robust_to_noise() -> None:
    fitted = _profile(np.random.default_rng(3))["fitted"]
    par = fitted["params"]
    assert par["iter_overhead_s"] == pytest.approx(TRUE["overhead"], rel=0.1)
    peak = fitted["accelerator"]["peak_flops"]
    assert peak * par["prefill_eff"] == pytest.approx(TRUE["prefill"], rel=0.1)
    assert max(abs(r["rel_error"]) for r in fitted["decode_errors"]) < 0.08


def test_profile_round_trips_through_load_profile(tmp_path: Path) -> None:
    from jigsawrl.costmodel.fit import write_profile

    doc = _profile()
    path = write_profile(doc, tmp_path / "sub" / "cpu.yaml")
    accel, params = load_profile(path)
    cm = CostModel(accel, params=params)
    q = doc["raw"]["2"]["decode"][-1]
    assert cm.decode_iter_time_s(MODEL, 1, q["batch"], q["ctx_tokens"]) == pytest.approx(
        q["time_s"])
    assert load_slowdown_table(path)["prefill"][1.0] == 1.0
    assert doc["source"].startswith("jigsawrl profile ") and doc["source"].endswith("Test CPU")


def test_slowdown_table_single_thread_count() -> None:
    assert slowdown_table({1: _raw()})["decode_large"] == {1.0: 1.0}


def test_parse_threads() -> None:
    assert parse_threads("2, 1,2") == (1, 2)
    for bad in ("", "0", "a,1"):
        with pytest.raises(ConfigError):
            parse_threads(bad)


def test_decode_fit_dataclass_is_plain() -> None:
    assert DecodeFit(1.0, 2.0, 3.0).per_seq_s == 2.0


@pytest.mark.torch
def test_quick_profile_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from jigsawrl.cli.main import app
    from jigsawrl.costmodel.profile import read_profile
    from jigsawrl.workload.realpresets import engine_model_spec

    out = tmp_path / "cpu.yaml"
    res = CliRunner().invoke(app, ["profile", "--quick", "--threads", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    accel, params = load_profile(out)
    assert accel.name == "cpu-worker" and "jigsawrl profile" in accel.source
    cm = CostModel(accel, params=params)
    spec = engine_model_spec("qwen2-1m")
    errors = []
    for q in read_profile(out)["raw"]["1"]["decode"]:
        pred = cm.decode_iter_time_s(spec, 1, int(q["batch"]), int(q["ctx_tokens"]))
        errors.append(pred / q["time_s"] - 1.0)
    print("decode prediction errors:", [f"{e:+.1%}" for e in errors])
    assert all(-0.5 < e < 1.0 for e in errors), errors
    # the runtime pass ran (through a local Ray) and its costs are in the cost model
    assert params.call_overhead_s > 0 and params.worker_link_bytes_per_s > 0
    assert 0 < params.reward_s_per_sample < 0.01 and params.train_pads_rows
    # a train state's moves, through the engine's export / import
    assert params.state_onload_s > 0 and params.state_offload_s >= 0
    assert params.rollout_setup_s > 0  # a rank's fresh engine, through the worker's slice
    # the wait between two stages, through a short real run on the Ray executor
    gap = read_profile(out)["raw_runtime"]["stage_gap"]
    assert gap["transitions"] >= 8 and gap["gap_s"] > 0 and "rollout->reward" in gap[
        "by_transition"]
    assert params.stage_gap_s == pytest.approx(max(gap["gap_s"] - params.call_overhead_s, 0.0))
    # the weight sync, timed whole on the same run
    assert gap["weight_sync_s"] > 0 and params.weight_sync_s == gap["weight_sync_s"]
    # the host's load beside the workers, sampled through the same run (Linux: /proc)
    host = read_profile(out)["raw_runtime"]["host_load"]
    assert host["cores"] >= 1 and host["seconds"] > 0 and host["worker_cores"] >= 0.5
    assert params.host_slots == host["cores"] and params.host_load_slots == host["load_cores"]
    # the speed probe, timed at the profile's start and end (engine/speedprobe.py)
    from jigsawrl.costmodel.profile import profile_probe_s

    doc = read_profile(out)
    assert len(doc["machine"]["speed_probes_s"]) == 2
    # the GRPO-shaped pass: several buckets, and what a further forward call costs
    assert doc["raw"]["1"]["logprob_grpo"]["buckets"] >= 2
    assert params.bucket_overhead_tokens >= 0.0
    assert set(doc["fitted"]["bucket_overhead_tokens_by_pass"]) == {"logprob", "train"}
    assert profile_probe_s(doc) == pytest.approx(sum(doc["machine"]["speed_probes_s"]) / 2)


def test_fit_runtime_recovers_the_transfer_line() -> None:
    call, lat, bw = 1e-3, 4e-3, 2e8
    raw = {"reward_s_per_sample": 5e-5, "ray": {"call_s": call, "transfer": [
        {"bytes": b, "time_s": 2 * call + lat + b / bw} for b in (4e6, 5e5)]}}
    fit = fit_runtime(raw)
    assert fit["call_overhead_s"] == fit["reward_overhead_s"] == call
    assert fit["worker_link_bytes_per_s"] == pytest.approx(bw)
    assert fit["worker_link_latency_s"] == pytest.approx(lat)
    assert fit["reward_s_per_sample"] == 5e-5
    assert fit_runtime({}) == {}
    assert "call_overhead_s" not in fit_runtime({"reward_s_per_sample": 1e-5})  # no Ray


def test_fit_runtime_keeps_what_the_bytes_leave_of_a_state_move() -> None:
    from jigsawrl.costmodel.memory import TRAIN_STATE_BYTES_PER_PARAM
    from jigsawrl.costmodel.roofline import CostParams

    link, params = 4e9, 1e6
    by_bytes = TRAIN_STATE_BYTES_PER_PARAM * params / link + CostParams().host_transfer_latency_s
    raw = {"state_move": {"onload_s": 0.040, "offload_s": 0.002, "num_params": params}}
    fit = fit_runtime(raw, link)
    assert fit["state_onload_s"] == pytest.approx(0.040 - by_bytes)
    assert fit["state_offload_s"] == 0.0  # faster than its bytes: nothing fixed is left
    assert "state_onload_s" not in fit_runtime({"reward_s_per_sample": 1e-5})


def test_dispatch_time_adds_calls_and_weight_moves() -> None:
    import dataclasses

    accel, params = load_profile_doc()
    cm = CostModel(accel, params=params)
    assert cm.dispatch_time_s(MODEL, "actor_update", 2) == 0.0  # nothing measured: not modelled
    p = dataclasses.replace(params, call_overhead_s=1e-3, worker_link_bytes_per_s=4e8,
                            worker_link_latency_s=2e-3)
    cm = CostModel(accel, params=p)
    move = 2e-3 + 4 * MODEL.num_params / 4e8  # fp32 weights
    assert cm.dispatch_time_s(MODEL, "reward", 1) == 0.0  # its call is reward_overhead_s
    assert cm.dispatch_time_s(MODEL, "old_logprob", 1) == pytest.approx(1e-3)
    assert cm.dispatch_time_s(MODEL, "old_logprob", 2) == pytest.approx(1e-3 + move)
    assert cm.dispatch_time_s(MODEL, "actor_update", 2) == pytest.approx(1e-3 + 2 * move)
    assert cm.dispatch_time_s(MODEL, "weight_sync", 1) == pytest.approx(1e-3 + move)
    # a data-parallel update of 3 PPO epochs: a call and the moves per epoch
    assert cm.dispatch_time_s(MODEL, "actor_update", 2, rounds=3) == pytest.approx(
        3 * (1e-3 + 2 * move))


@pytest.mark.torch
def test_cli_rejects_bad_threads(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from jigsawrl.cli.main import app

    res = CliRunner().invoke(app, ["profile", "--threads", "0", "--out", str(tmp_path / "p")])
    assert res.exit_code == 2


def test_bucket_tokens_recover_the_cost_of_a_forward_call() -> None:
    """A GRPO-shaped pass whose 5 buckets cost 40 positions each beyond the first: the fit
    finds 40; without the point, or with one bucket, it finds nothing."""
    from jigsawrl.costmodel.fit import bucket_tokens

    slope, over, adam = 1e-5, 0.05, 0.01
    raw = {"train_grpo": {"tokens": 3000, "buckets": 5,
                          "time_s": over + slope * (3000 + 4 * 40) + adam}}
    assert bucket_tokens(raw, "train", (slope, over), adam) == pytest.approx(40.0)
    assert bucket_tokens(raw, "logprob", (slope, over), 0.0) is None
    one = {"train_grpo": {"tokens": 3000, "buckets": 1, "time_s": 1.0}}
    assert bucket_tokens(one, "train", (slope, over), adam) is None
    fast = {"train_grpo": {"tokens": 3000, "buckets": 5, "time_s": over + slope * 2000}}
    assert bucket_tokens(fast, "train", (slope, over), 0.0) == 0.0  # never negative


def test_pass_line_separates_per_call_overhead() -> None:
    from jigsawrl.costmodel.fit import pass_line

    raw = {"train": {"tokens": 2048, "time_s": 0.05 + 2048e-5 + 0.01},
           "train_small": {"tokens": 256, "time_s": 0.05 + 256e-5 + 0.01}}
    slope, over = pass_line(raw, "train", 0.01)  # 0.01 s of optimizer step taken off first
    assert slope == pytest.approx(1e-5) and over == pytest.approx(0.05)
    noisy = {"logprob": {"tokens": 2048, "time_s": 0.1}, "logprob_small": {"tokens": 256,
                                                                           "time_s": 0.2}}
    assert pass_line(noisy, "logprob", 0.0) == (pytest.approx(0.1 / 2048), 0.0)
    assert pass_line({"logprob": {"tokens": 100, "time_s": 1.0}}, "logprob", 0.0) == (0.01, 0.0)


def test_interleaved_timing_calls_every_point_once_a_round() -> None:
    """A slow spell must hit one round of every point, not every repeat of one: the calls go
    round-robin after one warm-up each, and each point keeps its median."""
    import time as _time

    calls: list[str] = []
    slow = {"b": [0.0, 0.0, 0.02, 0.0]}  # b's warm-up, then rounds 1-3: round 2 slow

    def fn(key: str):  # noqa: ANN202
        def run() -> None:
            calls.append(key)
            delays = slow.get(key)
            if delays:
                _time.sleep(delays.pop(0))
        return run

    got = interleaved_median_times({"a": fn("a"), "b": fn("b")}, 3)
    assert calls == ["a", "b", "a", "b", "a", "b", "a", "b"]
    assert set(got) == {"a", "b"} and got["b"] < 0.01  # the slow round is not the median
