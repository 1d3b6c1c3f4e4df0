"""How much of a host's CPU a real run takes besides its device workers (the profile's host-load
probe; ``CostParams.host_slots`` / ``host_load_slots``).

Why: on a CPU pool the device workers are not alone on the host. The driver (its decisions, Ray
waits and dispatches), Ray's daemons and the reward workers need CPU too, and where every core
has a worker that CPU comes out of the workers' calls. In `jigsawrl bench real` (2 cores, two
1-thread workers) the log-prob and update passes ran 16-17% slower than predicted while the
other device was busy and 1-4% while it was idle; two processes running the same passes with no
driver beside them slowed each other by 3-13%, and sampling every process's CPU during a run
found the driver, reward workers and daemons taking ~0.27 cores while steps ran
(docs/BENCHMARKS.md, "Host load"). The simulator charges this as a slowdown of a node's busy
devices when they and this load want more cores than the node has (:mod:`jigsawrl.sim.hostload`).

How: :class:`HostSampler` reads ``/proc`` (the host's busy CPU time, and that of the processes
whose command line names the device-worker actor) a few times a second in a thread while a run
goes, and :func:`load_while_busy` keeps the intervals in which the workers computed (at least
:data:`BUSY_WORKER_CORES` of a core): the host's busy cores minus the workers' there, averaged.
Linux only: elsewhere nothing is measured and the simulator charges nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WORKER_MARK = b"DeviceWorker"  # what a device worker's command line holds (Ray names it so)
BUSY_WORKER_CORES = 0.5  # an interval whose workers used less computed little: not kept
SAMPLE_S = 0.1


@dataclass(frozen=True)
class Sample:
    """Cumulative CPU seconds at one instant: the host's busy time and the device workers'."""

    t_s: float
    host_s: float
    workers_s: float


def _host_busy_s(proc: Path) -> float:
    """Busy CPU seconds of the whole host since boot (``/proc/stat``: all but idle and iowait)."""
    fields = (proc / "stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _workers_s(proc: Path) -> float:
    """CPU seconds (user + system) of the processes whose command line names a device worker."""
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if WORKER_MARK not in (entry / "cmdline").read_bytes():
                continue
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def take_sample(proc: Path = Path("/proc")) -> Sample:
    return Sample(time.perf_counter(), _host_busy_s(proc), _workers_s(proc))


def load_while_busy(samples: Sequence[Sample], start_s: float = float("-inf"),
                    end_s: float = float("inf")) -> dict[str, float] | None:
    """``{"load_cores", "worker_cores", "seconds"}`` over the intervals between consecutive
    samples (both within ``[start_s, end_s]``, ``time.perf_counter`` seconds) in which the
    workers used at least :data:`BUSY_WORKER_CORES`; None if none did.
    A process that ended between two samples takes its CPU time with it: such an interval
    (the workers' total going down) is not kept."""
    busy_s = load_s = work_s = 0.0
    for a, b in zip(samples, samples[1:], strict=False):
        dt = b.t_s - a.t_s
        if a.t_s < start_s or b.t_s > end_s:
            continue
        work = b.workers_s - a.workers_s
        if dt <= 0 or work < 0 or work / dt < BUSY_WORKER_CORES:
            continue
        busy_s += dt
        work_s += work
        load_s += max(0.0, (b.host_s - a.host_s) - work)
    if busy_s <= 0:
        return None
    return {"load_cores": load_s / busy_s, "worker_cores": work_s / busy_s, "seconds": busy_s}


class HostSampler:
    """Samples ``/proc`` every ``every_s`` in a daemon thread between ``__enter__`` and
    ``__exit__``; :meth:`result` is :func:`load_while_busy` of what it took (None off Linux)."""

    def __init__(self, every_s: float = SAMPLE_S, proc: Path = Path("/proc")) -> None:
        self.every_s = every_s
        self.proc = proc
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def supported(self) -> bool:
        return (self.proc / "stat").is_file()

    def __enter__(self) -> HostSampler:
        if self.supported:
            self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(take_sample(self.proc))
            except (OSError, ValueError, IndexError) as err:  # an unreadable /proc: stop
                log.warning("host load not sampled (%s)", err)
                return
            self._stop.wait(self.every_s)

    def result(self, start_s: float = float("-inf"), end_s: float = float("inf")
               ) -> dict[str, float] | None:
        return load_while_busy(self.samples, start_s, end_s)
