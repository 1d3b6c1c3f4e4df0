"""Load a machine profile written by ``jigsawrl profile`` into cost-model inputs.

What: ``jigsawrl profile`` (``jigsawrl.experiments.profiling``) times the real engine's sub-stages on this
CPU and fits the cost model's shape; this module turns the fitted section of that YAML file into
an :class:`AcceleratorSpec` ("cpu-worker") and a :class:`CostParams`, so that
``CostModel(accel, params=params)`` predicts this machine instead of the rough assumptions of
``workload/realpresets.py``.

Why a separate, torch-free module: the simulator and the schedulers load profiles without the
engine extra (DESIGN.md §4), and every constant must name its source (DESIGN.md §6): the
accelerator's ``source`` is the profile's ``source`` string.

What a profile sets: ``peak_flops``, ``hbm_bytes_per_s`` and ``host_link_bytes_per_s`` of the
accelerator; ``prefill_eff``, ``decode_compute_eff``, ``hbm_bw_eff``, ``logprob_eff``,
``train_eff``, ``iter_overhead_s``, ``iter_overhead_per_seq_s`` and ``weight_sync_overhead_s`` of
:class:`CostParams`. What it cannot set stays an assumption (:data:`UNPROFILED_PARAMS`): the
share-to-bandwidth saturation ``s_sat`` (decode on these CPU models is not memory-bound, so the
timings do not constrain it), the collective latencies and ``comm_overlap`` (one device, no
collectives), the training micro-batch size, ``devices_per_node``, the reward and host-transfer
costs and the memory reserve.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import yaml

from jigsawrl.costmodel.cpu import cpu_worker_params
from jigsawrl.costmodel.roofline import CostParams
from jigsawrl.errors import InputError
from jigsawrl.workload.accelerators import AcceleratorSpec
from jigsawrl.workload.realpresets import CPU_ACCELERATOR

log = logging.getLogger(__name__)

PROFILE_VERSION = 1
ACCEL_KEYS: tuple[str, ...] = ("peak_flops", "hbm_bytes_per_s", "host_link_bytes_per_s")
PARAM_KEYS: tuple[str, ...] = (
    "prefill_eff", "decode_compute_eff", "hbm_bw_eff", "logprob_eff", "train_eff",
    "iter_overhead_s", "iter_overhead_per_seq_s", "weight_sync_overhead_s",
)
# Measured since a later profile; absent from older profile files, which load with 0.
OPTIONAL_PARAM_KEYS: tuple[str, ...] = (
    "logprob_overhead_s", "train_overhead_s",
    # the runtime pass (rewards; Ray calls and transfers between worker processes)
    "reward_s_per_sample", "reward_overhead_s", "call_overhead_s", "worker_link_bytes_per_s",
    "worker_link_latency_s", "state_onload_s", "state_offload_s", "rollout_setup_s",
    "stage_gap_s", "host_slots", "host_load_slots", "weight_sync_s",
    "decode_ctx_s_per_token",
    # the shared-prompt forward's extra calls, from a GRPO-shaped pass
    "bucket_overhead_tokens")
# Facts about the profiled engine (true/false), also absent from older files (default False).
OPTIONAL_FLAG_KEYS: tuple[str, ...] = ("train_pads_rows", "train_shares_prompt",
                                        "rollout_shares_prompt")
UNPROFILED_PARAMS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(CostParams)
    if f.name not in PARAM_KEYS + OPTIONAL_PARAM_KEYS + OPTIONAL_FLAG_KEYS)
_FIX = "re-run `jigsawrl profile --out <path>` to write a fresh profile"


def _number(section: dict[str, Any], key: str, where: str, *, positive: bool) -> float:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"'{key}' must be a finite number, got {value!r}", where=where, fix=_FIX)
    if value < 0 or (positive and value == 0):
        raise InputError(f"'{key}' must be {'> 0' if positive else '>= 0'}, got {value}",
                         where=where, fix=_FIX)
    return float(value)


def _section(doc: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise InputError(f"missing or malformed '{key}' section", where=where, fix=_FIX)
    return value


def cost_inputs(doc: dict[str, Any], where: str = "profile") -> tuple[AcceleratorSpec, CostParams]:
    """The accelerator and parameters of a parsed profile document (see :func:`load_profile`)."""
    if not isinstance(doc, dict):
        raise InputError("a profile is a YAML mapping", where=where, fix=_FIX)
    if doc.get("version") != PROFILE_VERSION:
        raise InputError(f"unsupported profile version {doc.get('version')!r} "
                         f"(expected {PROFILE_VERSION})", where=where, fix=_FIX)
    source = doc.get("source")
    if not isinstance(source, str) or not source:
        raise InputError("missing 'source' string", where=where, fix=_FIX)
    fitted = _section(doc, "fitted", where)
    accel_sec = _section(fitted, "accelerator", f"{where}: fitted")
    param_sec = _section(fitted, "params", f"{where}: fitted")
    accel_vals = {k: _number(accel_sec, k, f"{where}: fitted.accelerator", positive=True)
                  for k in ACCEL_KEYS}
    param_vals = {k: _number(param_sec, k, f"{where}: fitted.params",
                             positive=k.endswith("_eff")) for k in PARAM_KEYS}
    param_vals.update({k: _number(param_sec, k, f"{where}: fitted.params", positive=False)
                       for k in OPTIONAL_PARAM_KEYS if k in param_sec})
    for key in OPTIONAL_FLAG_KEYS:
        if key in param_sec:
            if not isinstance(param_sec[key], bool):
                raise InputError(f"'{key}' must be true or false, got {param_sec[key]!r}",
                                 where=f"{where}: fitted.params", fix=_FIX)
            param_vals[key] = param_sec[key]
    try:
        params = dataclasses.replace(cpu_worker_params(), **param_vals)
    except ValueError as exc:
        raise InputError(str(exc), where=f"{where}: fitted.params", fix=_FIX) from exc
    accel = dataclasses.replace(CPU_ACCELERATOR, **accel_vals,
                                source=f"{source} (measured: {', '.join(ACCEL_KEYS)}); "
                                f"other fields: {CPU_ACCELERATOR.source}")
    return accel, params


def read_profile(path: str | Path) -> dict[str, Any]:
    """The raw YAML document of a profile file.

    Raises:
        InputError: a missing file or one that is not YAML.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("profile file not found", where=str(path),
                         fix="write one with `jigsawrl profile --out <path>`")
    try:
        doc = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError(f"not valid YAML: {exc}", where=str(path), fix=_FIX) from exc
    if not isinstance(doc, dict):
        raise InputError("a profile is a YAML mapping", where=str(path), fix=_FIX)
    return doc


def load_profile(path: str | Path, threads_per_device: int | None = None
                 ) -> tuple[AcceleratorSpec, CostParams]:
    """A "cpu-worker" :class:`AcceleratorSpec` and :class:`CostParams` measured on a machine.

    ``CostModel(accel, params=params)`` then predicts the profiled machine (one full share = the
    profile's largest thread count). Fields listed in :data:`UNPROFILED_PARAMS` keep their
    documented :class:`CostParams` defaults. ``threads_per_device``: the torch threads a run
    gives a device's full share; given, the profile must have measured the same
    (:func:`check_full_share`).

    Raises:
        InputError: a missing file, invalid YAML, a wrong version, a missing section or key, a
            value that is not a finite number in range, or a full share of another thread count.
    """
    doc = read_profile(path)
    if threads_per_device is not None:
        check_full_share(doc, threads_per_device, str(path))
    accel, params = cost_inputs(doc, where=str(path))
    log.info("loaded profile %s: peak %.3g FLOP/s, iter overhead %.3g s", path,
             accel.peak_flops, params.iter_overhead_s)
    return accel, params


def check_full_share(doc: dict[str, Any], threads_per_device: int, where: str) -> None:
    """A profile's full share of a device (its largest thread count, ``fitted.full_share_threads``)
    must be what the run gives a device (``threads_per_device`` torch threads; one per Ray CPU
    worker by default).

    Why: a profile of 1 and 2 threads prices a device at 2 threads; a run of one thread per
    device then trains 1.6-1.8× slower than the scheduler believes and its prediction says
    (measured on the pipelines of ``configs/real/bench-tools.yaml``: updates 0.15 s against
    0.087 predicted).
    A profile written before the field existed is not checked.

    Raises:
        InputError: the two differ.
    """
    fitted = doc.get("fitted")
    top = fitted.get("full_share_threads") if isinstance(fitted, dict) else None
    if top is None or top == threads_per_device:
        return
    raise InputError(
        f"the profile measured a device's full share as {top} torch thread(s), but this run "
        f"gives each device {threads_per_device}: the scheduler and the prediction would price "
        "every pass at the wrong speed", where=where,
        fix=f"profile with `jigsawrl profile --threads {threads_per_device} --out {where}` "
            f"(the largest count is the full share), or give the run {top} thread(s) per device")


def profile_probe_s(doc: dict[str, Any], where: str = "profile") -> float | None:
    """The speed probe's seconds stored in a profile document (``machine.speed_probe_s``,
    ``engine/speedprobe.py``), or None in a profile written before the probe existed.

    Raises:
        InputError: a value that is not a positive finite number.
    """
    machine = doc.get("machine")
    if not isinstance(machine, dict) or machine.get("speed_probe_s") is None:
        return None
    return _number(machine, "speed_probe_s", f"{where}: machine", positive=True)


def load_slowdown_table(path: str | Path) -> dict[str, dict[float, float]]:
    """The measured slowdown table (stage -> {compute share: slowdown}) of a profile.

    Raises:
        InputError: as :func:`load_profile`, or a malformed ``fitted.slowdown`` section.
    """
    where = str(path)
    fitted = _section(read_profile(path), "fitted", where)
    table = _section(fitted, "slowdown", f"{where}: fitted")
    try:
        return {str(stage): {float(s): float(v) for s, v in row.items()}
                for stage, row in table.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise InputError(f"malformed slowdown table: {exc}", where=f"{where}: fitted.slowdown",
                         fix=_FIX) from exc
