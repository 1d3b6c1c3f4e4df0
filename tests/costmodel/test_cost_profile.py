"""load_profile: a profile's fitted section becomes a cpu-worker accelerator and CostParams.

Torch-free: the documents here are written by hand, in the format `jigsawrl profile` writes.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from jigsawrl.costmodel import CostModel, CostParams
from jigsawrl.costmodel.cpu import CPU_WORKER_S_SAT
from jigsawrl.costmodel.profile import (
    PARAM_KEYS,
    UNPROFILED_PARAMS,
    cost_inputs,
    load_profile,
    load_slowdown_table,
)
from jigsawrl.errors import InputError
from jigsawrl.workload.models import ModelSpec

DOC: dict[str, Any] = {
    "version": 1,
    "source": "jigsawrl profile 2026-11-30 on Test CPU",
    "fitted": {
        "accelerator": {"peak_flops": 5e10, "hbm_bytes_per_s": 1.6e10,
                        "host_link_bytes_per_s": 8e9},
        "params": {"prefill_eff": 0.8, "decode_compute_eff": 0.5, "hbm_bw_eff": 1.0,
                   "logprob_eff": 1.0, "train_eff": 0.75, "iter_overhead_s": 6e-3,
                   "iter_overhead_per_seq_s": 1e-4, "weight_sync_overhead_s": 4e-3},
        "slowdown": {"prefill": {0.5: 2.0, 1.0: 1.0}, "decode_small": {0.5: 1.02, 1.0: 1.0}},
    },
}
MODEL = ModelSpec(name="m", num_layers=4, hidden_size=128, num_heads=4, num_kv_heads=2,
                  head_dim=32, intermediate_size=512, vocab_size=100, num_params=1e6, source="t")


def _write(tmp_path: Path, doc: object, text: str | None = None) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(doc))
    return path


def test_round_trip_sets_accelerator_and_params(tmp_path: Path) -> None:
    accel, params = load_profile(_write(tmp_path, DOC))
    assert accel.name == "cpu-worker"
    assert accel.peak_flops == 5e10 and accel.hbm_bytes_per_s == 1.6e10
    assert accel.host_link_bytes_per_s == 8e9
    assert DOC["source"] in accel.source
    for key in PARAM_KEYS:
        assert getattr(params, key) == DOC["fitted"]["params"][key]
    assert params.s_sat == CPU_WORKER_S_SAT  # not profiled: a CPU worker time-slices
    assert params.comm_overlap == CostParams().comm_overlap  # not profiled: the assumption
    cm = CostModel(accel, params=params)
    # 6 ms + 1e-4 s/seq + (2 P b + A ctx) / (0.5 * 5e10): the profile's decode line.
    expected = 6e-3 + 1e-4 * 4 + (2e6 * 4 + MODEL.attn_flops_per_token_per_ctx() * 400) / 2.5e10
    assert cm.decode_iter_time_s(MODEL, 1, 4, 400) == pytest.approx(expected)


def test_full_share_must_be_the_runs_threads_per_device(tmp_path: Path) -> None:
    """A profile of 1 and 2 threads prices a device at 2 threads; a run of one thread per
    device is refused with the command that profiles it right."""
    two = copy.deepcopy(DOC)
    two["fitted"]["full_share_threads"] = 2
    path = _write(tmp_path, two)
    with pytest.raises(InputError) as exc:
        load_profile(path, threads_per_device=1)
    assert "2 torch thread(s)" in str(exc.value) and "gives each device 1" in str(exc.value)
    assert "jigsawrl profile --threads 1" in exc.value.fix
    accel, _ = load_profile(path, threads_per_device=2)  # the same count: accepted
    assert accel.peak_flops == 5e10
    assert load_profile(path)[0].peak_flops == 5e10  # no run to match: not checked
    # a profile written before the field existed is not checked
    assert load_profile(_write(tmp_path, DOC), threads_per_device=1)[0].peak_flops == 5e10


def test_train_pads_rows_flag_is_read_and_defaults_off(tmp_path: Path) -> None:
    assert load_profile(_write(tmp_path, DOC))[1].train_pads_rows is False  # an older profile
    doc = _broken(("fitted", "params", "train_pads_rows"), True)
    assert load_profile(_write(tmp_path, doc))[1].train_pads_rows is True


def test_pass_tokens_counts_padding_of_the_widest_shard() -> None:
    accel, params = cost_inputs(DOC)
    lens = [10, 2, 4, 4, 8, 1]
    plain = CostModel(accel, params=params)
    assert plain.pass_tokens(lens, 2, 64) == sum(lens)  # padding removed: real tokens
    padded = CostModel(accel, params=dataclasses.replace(params, train_pads_rows=True))
    assert padded.pass_tokens(lens, 1, 64) == 6 * 10  # one micro-batch padded to 10
    assert padded.pass_tokens(lens, 1, 2) == 2 * 10 + 2 * 4 + 2 * 8  # three micro-batches
    assert padded.pass_tokens(lens, 2, 64) == 2 * (3 * 10)  # shards [10,2,4] and [4,8,1]
    assert padded.pass_tokens(lens, 8, 64) == 8 * 10  # more devices than rows: a row each
    assert padded.pass_tokens([], 2, 64) == 0


def test_pass_tokens_of_the_shared_prompt_forward() -> None:
    """Counted as the shared-prompt forward computes: each group's prompt once (padded to the
    micro-batch's longest prompt), the responses in the engine's length buckets."""
    accel, params = cost_inputs(DOC)
    shared = CostModel(accel, params=dataclasses.replace(params, train_pads_rows=True,
                                                         train_shares_prompt=True))
    prompts = [10] * 4 + [6] * 4  # two groups of four
    resp = [3, 3, 3, 3, 40, 40, 40, 40]
    lens = [p + r for p, r in zip(prompts, resp, strict=True)]
    # one micro-batch: 2 prompts padded to 10, buckets {3 x4} and {40 x4}
    assert shared.pass_tokens(lens, 1, 64, prompts, 4) == 2 * 10 + 4 * 3 + 4 * 40
    # a micro-batch per group: each its own prompt and one bucket
    assert shared.pass_tokens(lens, 1, 4, prompts, 4) == (10 + 4 * 3) + (6 + 4 * 40)
    # two devices: the widest shard (the second group), times two
    assert shared.pass_tokens(lens, 2, 64, prompts, 4) == 2 * (6 + 4 * 40)
    padded = CostModel(accel, params=dataclasses.replace(params, train_pads_rows=True))
    assert padded.pass_tokens(lens, 1, 64, prompts, 4) == 8 * 46  # the flag off: every row
    assert shared.pass_tokens(lens, 1, 64) == 8 * 46  # no prompt lengths: every row
    # rows of their own prompt and one length: the same count either way (the profile's shape)
    square = [128] * 16
    assert shared.pass_tokens(square, 1, 16, [64] * 16, 1) == padded.pass_tokens(square, 1, 16)
    unpadded = CostModel(accel, params=dataclasses.replace(params, train_shares_prompt=True))
    assert unpadded.pass_tokens(lens, 2, 64, prompts, 4) == 10 + 6 + sum(resp)
    with pytest.raises(ValueError, match="prompt lengths"):
        shared.pass_tokens(lens, 1, 64, prompts[:3], 4)
    # each forward call beyond a profiled pass's two (prompts, one bucket) costs
    # bucket_overhead_tokens positions: one micro-batch of two buckets is one call more ...
    calls = CostModel(accel, params=dataclasses.replace(
        params, train_pads_rows=True, train_shares_prompt=True, bucket_overhead_tokens=50.0))
    assert calls.pass_tokens(lens, 1, 64, prompts, 4) == 2 * 10 + 4 * 3 + 4 * 40 + 50
    # ... two micro-batches of one bucket each are two more (a prompt call and a bucket)
    assert calls.pass_tokens(lens, 1, 4, prompts, 4) == (10 + 4 * 3) + (6 + 4 * 40) + 2 * 50
    # the profile's own shape (one micro-batch, one bucket) adds nothing
    assert calls.pass_tokens(square, 1, 16, [64] * 16, 1) == padded.pass_tokens(square, 1, 16)


def test_train_shares_prompt_flag_is_read_and_defaults_off(tmp_path: Path) -> None:
    assert load_profile(_write(tmp_path, DOC))[1].train_shares_prompt is False
    doc = _broken(("fitted", "params", "train_shares_prompt"), True)
    assert load_profile(_write(tmp_path, doc))[1].train_shares_prompt is True


def test_unprofiled_params_are_the_rest() -> None:
    assert "s_sat" in UNPROFILED_PARAMS and "comm_overlap" in UNPROFILED_PARAMS
    assert not set(UNPROFILED_PARAMS) & set(PARAM_KEYS)


def test_slowdown_table(tmp_path: Path) -> None:
    table = load_slowdown_table(_write(tmp_path, DOC))
    assert table["prefill"] == {0.5: 2.0, 1.0: 1.0}


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found") as exc:
        load_profile(tmp_path / "nope.yaml")
    assert exc.value.where == str(tmp_path / "nope.yaml") and exc.value.fix


def test_invalid_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not valid YAML"):
        load_profile(_write(tmp_path, None, text="a: [1, 2\n"))
    with pytest.raises(InputError, match="mapping"):
        load_profile(_write(tmp_path, [1, 2]))


def _broken(path: tuple[str, ...], value: object) -> dict[str, Any]:
    doc = copy.deepcopy(DOC)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@pytest.mark.parametrize(("path", "value", "match"), [
    (("version",), 99, "version"),
    (("source",), KeyError, "source"),
    (("fitted",), KeyError, "fitted"),
    (("fitted", "params"), "x", "params"),
    (("fitted", "accelerator", "peak_flops"), KeyError, "peak_flops"),
    (("fitted", "accelerator", "peak_flops"), 0, "> 0"),
    (("fitted", "params", "iter_overhead_s"), -1.0, ">= 0"),
    (("fitted", "params", "iter_overhead_s"), "fast", "finite number"),
    (("fitted", "params", "train_eff"), 1.5, "train_eff"),
    (("fitted", "params", "train_pads_rows"), "yes", "true or false"),
])
def test_malformed_values(tmp_path: Path, path: tuple[str, ...], value: object,
                          match: str) -> None:
    with pytest.raises(InputError, match=match) as exc:
        load_profile(_write(tmp_path, _broken(path, value)))
    assert str(tmp_path) in (exc.value.where or "") and exc.value.fix
