"""Cost-model parameters of a pool of Ray CPU workers (real runs on this machine).

The accelerator of such a pool is :data:`jigsawrl.workload.realpresets.CPU_ACCELERATOR`; these are
the :class:`~jigsawrl.costmodel.roofline.CostParams` that go with it, the base that a CPU profile's
measured values replace (``jigsawrl profile``).

They are pinned here, field by field, wherever the GPU defaults of ``CostParams`` have since been
fitted to published GPU runs (``docs/FIDELITY.md``): those fits say nothing about a CPU worker,
so its parameters stay what they were (a flat training efficiency, not the GPU size curves; the
reward and iteration overheads before the GPU fit).
"""

from __future__ import annotations

import dataclasses

from jigsawrl.costmodel.roofline import CostParams

# A CPU worker runs one call at a time (docs/RAY.md, "Compute shares on a CPU"): co-located
# sub-stages time-slice it, so a share s of the device gives s of its memory bandwidth too.
# s_sat = 1 says so (the GPU default, 0.4, lets a decode at 40% of the SMs use all of HBM —
# true of a GPU, where co-located kernels run at once, and false here).
CPU_WORKER_S_SAT = 1.0
# ... and its calls queue: the simulator runs one call at a time per device, rollout ranks in
# slices of the Ray executor's chunk_s (executors/raycluster/records.CHUNK_S; a test keeps the
# two equal), not co-located calls at once at their shares (sim/gates.py).
CPU_WORKER_SLICE_S = 0.2
# The CostParams values a CPU worker keeps although the GPU defaults moved (module docstring).
CPU_WORKER_PINNED: dict[str, object] = {
    "iter_overhead_s": 2e-3, "train_eff": 0.4, "logprob_eff": 0.4,
    "train_mfu_at_1b": None, "kv_bw_eff": None,
    "reward_s_per_sample": 2e-3, "reward_overhead_s": 0.05,
}


def cpu_worker_params(devices_per_node: int | None = None) -> CostParams:
    """The cost-model parameters of a pool of Ray CPU workers (the belief of a real run and
    the base that a CPU profile's measured values replace); ``devices_per_node`` defaults to
    ``CostParams``'s."""
    params = CostParams(s_sat=CPU_WORKER_S_SAT, serial_slice_s=CPU_WORKER_SLICE_S,
                        rollout_shares_prompt=True,  # what jigsawrl's engine does
                        rollout_engine_limits=True,  # ... and its limits
                        **CPU_WORKER_PINNED)  # type: ignore[arg-type]
    if devices_per_node is None:
        return params
    return dataclasses.replace(params, devices_per_node=devices_per_node)
