"""Devices that run one call at a time: the Ray executor's CPU workers, in the simulator.

Why: a GPU runs co-located sub-stages at once, each on its share of the SMs, and the simulator
lets them advance at their shares. A Ray CPU worker does not: it is one process running one call
after another (docs/RAY.md, "Compute shares on a CPU"), so a log-prob pass queued behind
another pipeline's update waits for the whole update, and a rollout rank runs in time slices
(the executor's ``chunk_s``) between the other calls on its device. Letting both advance at
their shares made the simulator predict a multiplexing policy's real runs 40-65% too fast on the
bench (docs/BENCHMARKS.md).

What: :class:`DeviceGates` is a first-come, first-served gate per device. A compute work or a
rollout rank holds the gates of all its devices while it runs (a data-parallel pass holds its
helpers' devices too: the holder's call waits for theirs); others queue. Gates are taken one at
a time in device order, so two multi-device claims never deadlock. A rank gives its gate back
when a slice ends and someone waits, or when all its requests wait for tools; a work keeps it
until it ends. A grant is delivered as a wake-up event at the current instant, never inside the
release that caused it.

Which calls take a gate is the executor's: model passes and the scheduler's onloads (a normal
worker call); not rewards (a reward worker), weight syncs and offloads (the worker's control
group, beside whatever runs). On: when the truth cost model's ``serial_slice_s`` > 0 (the
CPU-worker parameters).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable

from jigsawrl.sim.hostload import HostLoad
from jigsawrl.sim.kernel import PRIO_WAKE, EventQueue
from jigsawrl.stages import MODEL_PASSES, Stage

# Stages whose call queues on its devices' workers (the module docstring).
GATED_STAGES: frozenset[str] = frozenset(MODEL_PASSES) | {Stage.ONLOAD}


class DeviceGates:
    """One first-come, first-served gate per device (see the module docstring).

    Args:
        q: the event queue (grants are delivered on it, at the current instant).
        num_devices: devices of the pool.
        slice_s: how long a rollout rank holds its gate before it yields to a waiter.
        host: told when a device's gate is taken or given back (a held device computes:
            :mod:`.hostload`).
    """

    def __init__(self, q: EventQueue, num_devices: int, slice_s: float,
                 host: HostLoad | None = None) -> None:
        self.q = q
        self.slice_s = slice_s
        self.host = host
        self._holder: list[Hashable | None] = [None] * num_devices
        self._queue: list[deque[Hashable]] = [deque() for _ in range(num_devices)]
        self._claims: dict[Hashable, tuple[tuple[int, ...], Callable[[], None]]] = {}
        self._held: dict[Hashable, int] = {}  # key -> how many of its gates it holds

    def holds(self, key: Hashable) -> bool:
        """Whether ``key`` holds every gate it asked for (it may run)."""
        claim = self._claims.get(key)
        return claim is not None and self._held.get(key, 0) == len(claim[0])

    def claimed(self, key: Hashable) -> bool:
        """Whether ``key`` holds or waits for gates."""
        return key in self._claims

    def request(self, key: Hashable, devices: tuple[int, ...], on_grant: Callable[[], None]
                ) -> None:
        """Ask for the gates of ``devices``; ``on_grant`` runs (as an event) once all are held.
        A device-less claim is granted at once."""
        if key in self._claims:
            return
        devs = tuple(sorted(set(devices)))
        self._claims[key] = (devs, on_grant)
        self._held[key] = 0
        self._next(key)

    def release(self, key: Hashable) -> None:
        """Give back every gate ``key`` holds (or stop waiting for them)."""
        claim = self._claims.pop(key, None)
        if claim is None:
            return
        self._held.pop(key, None)
        for d in claim[0]:
            if self._holder[d] == key:
                self._hold(d, None)
                self._grant_next(d)
            elif key in self._queue[d]:
                self._queue[d].remove(key)

    def waited_on(self, key: Hashable) -> bool:
        """Whether another claim waits for a gate ``key`` holds."""
        claim = self._claims.get(key)
        return claim is not None and any(self._holder[d] == key and self._queue[d]
                                         for d in claim[0])

    # ------------------------------------------------------------------ internals
    def _next(self, key: Hashable) -> None:
        """Take ``key``'s next gate, or queue for it; once all are held, deliver the grant."""
        devs, on_grant = self._claims[key]
        i = self._held[key]
        while i < len(devs):
            d = devs[i]
            if self._holder[d] is None and not self._queue[d]:
                self._hold(d, key)
                i += 1
                continue
            self._held[key] = i
            self._queue[d].append(key)
            return
        self._held[key] = i
        self.q.schedule(self.q.now_s, (self._deliver, key, on_grant), PRIO_WAKE)

    def _deliver(self, key: Hashable, on_grant: Callable[[], None]) -> None:
        if self.holds(key):
            on_grant()

    def _hold(self, d: int, key: Hashable | None) -> None:
        self._holder[d] = key
        if self.host is not None:
            self.host.set_busy(d, key is not None)

    def _grant_next(self, d: int) -> None:
        queue = self._queue[d]
        if queue and self._holder[d] is None:
            key = queue.popleft()
            self._hold(d, key)
            self._held[key] += 1
            self._next(key)
