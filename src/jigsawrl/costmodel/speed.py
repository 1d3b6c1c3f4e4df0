"""A cost model for the same machine running ``factor`` times slower (or faster, < 1).

Why: a profile is timed at one moment, and this VM's speed drifts by up to 1.6x within minutes.
The engine's speed probe (``engine/speedprobe.py``) is timed with the profile and again before a
real run's clock starts; their ratio is the ``factor`` here, and the calibration predicts the run
with the profile as measured and with :func:`slower` applied, so that the VM's drift and the
cost model's own error show apart.

What scales (a simplification, said so): every machine cost alike. The accelerator's rates
(FLOP/s, memory and link bandwidths) divide by ``factor``; the fixed times of
:class:`~jigsawrl.costmodel.roofline.CostParams` (:data:`MACHINE_TIMES`) multiply by it, its
byte rates (:data:`MACHINE_RATES`) divide. Settings that are not the machine's speed stay:
the executor's time slice (``serial_slice_s``), efficiencies, shapes and flags.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jigsawrl.costmodel.roofline import CostParams
from jigsawrl.workload.accelerators import AcceleratorSpec

ACCEL_RATES: tuple[str, ...] = ("peak_flops", "hbm_bytes_per_s", "host_link_bytes_per_s",
                                "intra_node_bytes_per_s", "inter_node_bytes_per_s")
MACHINE_TIMES: tuple[str, ...] = (
    "iter_overhead_s", "iter_overhead_per_seq_s", "eager_iter_overhead_s_per_layer",
    "allreduce_latency_s", "collective_step_latency_s", "weight_sync_overhead_s",
    "logprob_overhead_s", "train_overhead_s", "call_overhead_s", "worker_link_latency_s",
    "state_onload_s", "state_offload_s", "rollout_setup_s", "stage_gap_s",
    "weight_sync_s", "decode_ctx_s_per_token",
    "host_transfer_latency_s", "reward_s_per_sample", "reward_overhead_s")
MACHINE_RATES: tuple[str, ...] = ("worker_link_bytes_per_s", "offload_bytes_per_s")
# CostParams times that are not the machine's speed (tests check every ``*_s`` field is named).
NOT_MACHINE_TIMES: tuple[str, ...] = ("serial_slice_s",)


def slower(accel: AcceleratorSpec, params: CostParams, factor: float
           ) -> tuple[AcceleratorSpec, CostParams]:
    """``accel`` and ``params`` for the machine ``factor`` times slower (module docstring)."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"a speed factor must be a finite number > 0, got {factor!r}")
    a = dataclasses.replace(accel, **{k: getattr(accel, k) / factor for k in ACCEL_RATES})
    changes: dict[str, Any] = {k: getattr(params, k) * factor for k in MACHINE_TIMES}
    changes.update({k: getattr(params, k) / factor for k in MACHINE_RATES})
    return a, dataclasses.replace(params, **changes)

