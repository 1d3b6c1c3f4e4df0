"""Where a worker call's wall time went: its process's CPU time, garbage collection, the pass.

Why: model passes inside real runs were predicted 20-50% short, and it was not known whether
the run made them slow or the cost model priced them wrong. A call's wall time beside the CPU
time its process used in it tells the two kinds of cause apart: CPU time well below the wall
means the process waited (descheduled by the VM or by other processes, or blocked), CPU time
close to it means the work itself was slower (or more of it). Measured on the demo: on the CPU
93-96% of every pass, the collector <= 0.1% (BENCHMARKS.md, "Speed probe, where a pass's time
goes, ..."). The garbage collector's share is timed
through ``gc.callbacks``. :class:`CallClock` measures one call; the executor sums them per
pipeline and stage into the run's summary (``pass_breakdown``).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

_gc_state = {"t0": 0.0, "total_s": 0.0}


def _gc_timer(phase: str, _info: dict[str, int]) -> None:
    if phase == "start":
        _gc_state["t0"] = time.perf_counter()
    else:
        _gc_state["total_s"] += time.perf_counter() - _gc_state["t0"]


def _install() -> None:
    if _gc_timer not in gc.callbacks:
        gc.callbacks.append(_gc_timer)


@dataclass(slots=True)
class CallClock:
    """Process CPU and garbage-collection seconds from :meth:`start` to :meth:`stop` (plus
    ``pass_s``, the caller's own timing of the model pass inside the call); the call's wall
    time is its result's own ``t_end - t_start``."""

    cpu_s: float = 0.0
    gc_s: float = 0.0
    pass_s: float = 0.0
    # the call's own work outside the pass, timed by the caller: a train state onloaded for
    # it, and the step's batch built from the trajectories on its first pass (the simulator
    # charges the first, not the second: docs/BENCHMARKS.md, "The real pool")
    onload_s: float = 0.0
    build_s: float = 0.0
    _t: tuple[float, float] = (0.0, 0.0)

    def start(self) -> CallClock:
        _install()
        self._t = (time.process_time(), _gc_state["total_s"])
        return self

    def stop(self) -> CallClock:
        cpu, gcs = self._t
        self.cpu_s = time.process_time() - cpu
        self.gc_s = _gc_state["total_s"] - gcs
        return self

    def as_tuple(self) -> tuple[float, ...]:
        """``(cpu_s, gc_s, pass_s, onload_s, build_s)``."""
        return self.cpu_s, self.gc_s, self.pass_s, self.onload_s, self.build_s


# what Clocks sums per call, in order: the wall, then CallClock.as_tuple's fields
FIELDS = ("wall_s", "cpu_s", "gc_s", "pass_s", "onload_s", "build_s")


class Clocks:
    """Per pipeline and stage, the sums of its calls' :class:`CallClock` readings (the
    executor's, for the run's summary: ``pass_breakdown``)."""

    def __init__(self) -> None:
        self._sums: dict[tuple[str, str], list[float]] = {}

    def add(self, pipeline: str, stage: str, wall_s: float,
            reading: tuple[float, ...]) -> None:
        """One call: its wall seconds and its :meth:`CallClock.as_tuple` (a shorter, older
        reading counts its missing fields as 0)."""
        sums = self._sums.setdefault((pipeline, stage), [0.0] * (len(FIELDS) + 1))
        for i, v in enumerate((wall_s, *reading[:len(FIELDS) - 1])):
            sums[i] += v
        sums[-1] += 1

    def to_json(self) -> dict[str, dict[str, dict[str, float]]]:
        """``{pipeline: {stage: {calls, wall_s, cpu_s, gc_s, pass_s, onload_s, build_s,
        cpu_fraction}}}`` (sums; ``cpu_fraction``: CPU over wall time, < 1 where the process
        waited)."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (pipeline, stage), sums in sorted(self._sums.items()):
            row = {"calls": sums[-1], **dict(zip(FIELDS, sums, strict=False))}
            row["cpu_fraction"] = row["cpu_s"] / row["wall_s"] if row["wall_s"] > 0 else 0.0
            out.setdefault(pipeline, {})[stage] = row
        return out

