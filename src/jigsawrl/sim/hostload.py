"""A CPU host's cores, shared by its busy devices and by the rest of a run (the driver, Ray's
daemons, reward workers): ``CostParams.host_slots`` and ``host_load_slots``.

Why: a Ray CPU worker computes on its own cores only while nothing else wants them. On this
2-core machine with two 1-thread workers, the driver and daemons took ~0.2-0.3 cores while steps
ran, and a log-prob or update pass ran 16-17% slower than predicted while the other device was
busy against 1-4% while it idled (docs/BENCHMARKS.md, "Host load"); the simulator charged
neither, so it predicted every pooled policy too fast.

What: a device is busy while a call holds it (its gate, :mod:`.gates`: there are gates wherever
this is modelled, as both belong to CPU worker pools). With ``k`` of a node's devices busy, work
on that node runs ``max(1, (k + host_load_slots) / host_slots)`` times slower. Works and rollout
segments are timed at the factor when they start and re-timed when it changes
(:meth:`HostLoad.take_touched`, after every event and action, as bandwidth contention is).
Off (factor 1) when ``host_slots`` is 0: GPU hosts have cores to spare.
"""

from __future__ import annotations

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.sim.residency import worker_param


class HostLoad:
    """Busy devices per node and the slowdown they cause (see the module docstring).

    Args:
        num_devices: devices of the pool.
        cost: the truth cost model (``params.host_slots``, ``host_load_slots``,
            ``devices_per_node``).
    """

    def __init__(self, num_devices: int, cost: CostModelProtocol) -> None:
        self.slots = worker_param(cost, "host_slots")
        self.load = worker_param(cost, "host_load_slots")
        self.per_node = max(1, int(worker_param(cost, "devices_per_node") or num_devices))
        self._busy = [False] * num_devices
        self._count: dict[int, int] = {}
        self._touched: set[int] = set()

    @property
    def on(self) -> bool:
        return self.slots > 0.0

    def node(self, device: int) -> int:
        return device // self.per_node

    def set_busy(self, device: int, busy: bool) -> None:
        """``device`` starts (``busy``) or stops computing; its node is marked touched."""
        if not self.on or self._busy[device] == busy:
            return
        self._busy[device] = busy
        node = self.node(device)
        self._count[node] = self._count.get(node, 0) + (1 if busy else -1)
        self._touched.add(node)

    def factor(self, devices: tuple[int, ...]) -> float:
        """How many times slower work on ``devices`` runs now (the busiest of their nodes)."""
        if not self.on or not devices:
            return 1.0
        busy = max(self._count.get(self.node(d), 0) for d in devices)
        return max(1.0, (busy + self.load) / self.slots)

    def take_touched(self) -> set[int]:
        """Nodes whose busy count changed since the last call (and forget them)."""
        touched, self._touched = self._touched, set()
        return touched

    def on_nodes(self, devices: tuple[int, ...], nodes: set[int]) -> bool:
        return any(self.node(d) in nodes for d in devices)
