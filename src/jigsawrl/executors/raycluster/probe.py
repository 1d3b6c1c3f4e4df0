"""What one Ray call and one tensor transfer between two worker processes cost on this machine.

``jigsawrl profile`` measures the engine's passes in one process; a real run also pays, for
every stage, a Ray actor call from the driver, and for every data-parallel stage and weight sync
a transfer of the model's weights between worker processes through the object store. Those are
measured here, between two probe actors started the way the executor starts its device workers
(``num_cpus=0``, the numpy tensor wire of :mod:`.wire`), so the simulator's truth for a real run
can include them (``CostParams.call_overhead_s``, ``worker_link_bytes_per_s`` and
``worker_link_latency_s``: ``jigsawrl.experiments.profiling.fit_runtime``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from jigsawrl.costmodel.fit import median_time_s
from jigsawrl.executors.raycluster.placement import start_local
from jigsawrl.executors.raycluster.wire import use_numpy_wire

log = logging.getLogger(__name__)


class _Probe:
    """Holds a tensor dict, hands it out, and takes one in (a weight sync in miniature)."""

    def __init__(self) -> None:
        use_numpy_wire()
        self.held: dict[str, Any] = {}

    def ping(self) -> int:
        return 0

    def hold(self, tensors: dict[str, Any]) -> int:
        self.held = tensors
        return 0

    def give(self) -> dict[str, Any]:
        return self.held

    def take(self, tensors: dict[str, Any]) -> int:
        import torch

        total = 0
        for t in tensors.values():  # touch every byte, as a load_state_dict does
            total += int(torch.count_nonzero(t).item() >= 0)
        return total


ProbeActor = ray.remote(num_cpus=0)(_Probe)


def measure_transport(tensors: dict[str, Any], reps: int = 10) -> dict[str, Any]:
    """Median seconds of an empty actor call, and of moving ``tensors`` (and an eighth of them)
    from one actor to another through the object store, driven from this process.

    Starts a local Ray for the measurement when none is running (and stops it after).

    Returns:
        ``{"call_s": float, "transfer": [{"bytes": int, "time_s": float}, ...]}``; each transfer
        time includes its two actor calls (give, take), as a real stage's does.
    """
    started = not ray.is_initialized()
    if started:
        start_local(max(2, os.cpu_count() or 1), log_to_driver=False)
    use_numpy_wire()
    try:
        src, dst = ProbeActor.remote(), ProbeActor.remote()
        ray.get([src.ping.remote(), dst.ping.remote()])
        call_s = median_time_s(lambda: ray.get(src.ping.remote()), 5 * reps)
        names = sorted(tensors)
        small = {k: tensors[k] for k in names[: max(1, len(names) // 8)]}
        transfer = []
        for part in (small, tensors):
            ray.get(src.hold.remote(part))
            nbytes = sum(int(t.numel() * t.element_size()) for t in part.values())
            seconds = median_time_s(lambda: ray.get(dst.take.remote(src.give.remote())), reps)
            transfer.append({"bytes": nbytes, "time_s": seconds})
            log.info("transfer of %.2f MB between workers: %.1f ms", nbytes / 2**20,
                     1e3 * seconds)
        log.info("actor call round trip: %.2f ms", 1e3 * call_s)
        for actor in (src, dst):
            ray.kill(actor)
        return {"call_s": call_s, "transfer": transfer}
    finally:
        if started:
            ray.shutdown()
