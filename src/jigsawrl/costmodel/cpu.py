"""Cost-model parameters of a pool of Ray CPU workers (real runs on this machine).

The accelerator of such a pool is :data:`jigsawrl.workload.realpresets.CPU_ACCELERATOR`; these are
the :class:`~jigsawrl.costmodel.roofline.CostParams` that go with it, the base that a CPU profile's
measured values replace (``jigsawrl profile``).
"""

from __future__ import annotations

import dataclasses

from jigsawrl.costmodel.roofline import CostParams

# A CPU worker runs one call at a time (docs/RAY.md, "Compute shares on a CPU"): co-located
# sub-stages time-slice it, so a share s of the device gives s of its memory bandwidth too.
# s_sat = 1 says so (the GPU default, 0.4, lets a decode at 40% of the SMs use all of HBM —
# true of a GPU, where co-located kernels run at once, and false here).
CPU_WORKER_S_SAT = 1.0


def cpu_worker_params(devices_per_node: int | None = None) -> CostParams:
    """The cost-model parameters of a pool of Ray CPU workers (the belief of a real run and
    the base that a CPU profile's measured values replace); ``devices_per_node`` defaults to
    ``CostParams``'s."""
    params = CostParams(s_sat=CPU_WORKER_S_SAT)
    if devices_per_node is None:
        return params
    return dataclasses.replace(params, devices_per_node=devices_per_node)
