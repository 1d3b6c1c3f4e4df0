"""Memory-bandwidth contention between co-located work on a device.

Co-located sub-stages share a device's HBM bandwidth. A decode at compute share ``s`` can use
``bw_fraction(s) = min(1, s / s_sat)`` of it alone; a running compute-bound stage (log-prob,
update) demands :data:`COMPUTE_BW_DEMAND` × its share. When the demands on a device sum above 1
(``κ``, the summed demand), every decode there gets its demand scaled by ``1/κ``, which the
rollout runtime turns into a lower effective share for its decode segments
(:meth:`BandwidthContention.decode_share`). Compute-bound stages are assumed not to slow from it.

:class:`BandwidthContention` keeps the demand per device and which devices changed since the
rollout runtime last re-timed their decodes. Demand keys derive from structure ``(task id, rank)``
(``rank = -1`` for a compute work), never from object ids, so runs are reproducible.
"""

from __future__ import annotations

from collections.abc import Hashable

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.stages import MODEL_PASSES

# Memory-bandwidth demand of a running compute-bound stage (log-prob / update) per unit of compute
# share: training kernels are compute-bound but still stream weights and activations. An
# assumption (≈ 25% of HBM bandwidth at full share) until `jigsawrl profile` measures it.
COMPUTE_BW_DEMAND = 0.25

DemandKey = tuple[str, int]  # (task id, rank index; -1 for a compute work)


def work_demand(stage: str, share: float) -> float:
    """Bandwidth demand of a compute work of ``stage`` at ``share`` (model passes only)."""
    return COMPUTE_BW_DEMAND * share if stage in MODEL_PASSES else 0.0


class BandwidthContention:
    """Demand per device, the decoding ranks on each, and the devices whose mix changed.

    Args:
        num_devices: devices of the pool.
        cost: the cost model whose ``params.s_sat`` is the share that saturates bandwidth.
    """

    def __init__(self, num_devices: int, cost: CostModelProtocol) -> None:
        self.cost = cost
        self._demand: list[dict[DemandKey, float]] = [{} for _ in range(num_devices)]
        self._ranks_on: list[set[DemandKey]] = [set() for _ in range(num_devices)]
        self._owner: dict[DemandKey, Hashable] = {}
        self._touched: set[int] = set()

    def bw(self, share: float) -> float:
        """Fraction of HBM bandwidth a decode at ``share`` uses alone."""
        s_sat = self.cost.params.s_sat
        return min(1.0, share / s_sat)

    def kappa(self, key: DemandKey, devices: tuple[int, ...], share: float) -> float:
        """Summed demand on the busiest of ``devices``, counting ``key`` at ``share`` if absent."""
        return max((sum(self._demand[d].values()) + (0.0 if key in self._demand[d]
                                                       else self.bw(share))
                    for d in devices), default=1.0)

    def decode_share(self, share: float, kappa: float) -> float:
        """The effective share a decode at ``share`` runs at under contention ``kappa``."""
        if kappa <= 1.0 + 1e-9:
            return share
        return min(share, self.cost.params.s_sat * self.bw(share) / kappa)

    def set_demand(self, key: DemandKey, devices: tuple[int, ...], demand: float,
                   owner: Hashable | None = None) -> None:
        """Set ``key``'s demand on ``devices`` (0 removes it); an ``owner`` (a decoding rank) is
        recorded on those devices while its demand is positive, for :meth:`take_touched`."""
        for d in devices:
            cur = self._demand[d].get(key, 0.0)
            if abs(cur - demand) < 1e-12:
                continue
            if demand > 0:
                self._demand[d][key] = demand
            else:
                self._demand[d].pop(key, None)
            self._touched.add(d)
        if owner is not None:
            self._owner[key] = owner
            for d in devices:
                (self._ranks_on[d].add if demand > 0 else self._ranks_on[d].discard)(key)

    def take_touched(self) -> list[DemandKey] | None:
        """Keys of the ranks on devices whose demand changed since the last call (sorted), and
        forget the change; ``None`` when nothing changed."""
        if not self._touched:
            return None
        touched, self._touched = self._touched, set()
        keys: set[DemandKey] = set().union(*(self._ranks_on[d] for d in touched))
        return sorted(keys)

    def owner(self, key: DemandKey) -> Hashable:
        """What :meth:`set_demand` recorded for ``key``."""
        return self._owner[key]
