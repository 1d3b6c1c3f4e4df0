"""Where the Ray executor keeps each pipeline's train state, mirrored in the simulator.

Why: on a pool of worker processes a train state lives on *one* device's worker or in host
memory, and the executor moves it where a stage needs it (``executors/raycluster/residency.py``):
a model pass on devices that do not hold it first moves it there (an offload from its old device,
then an onload), and the scheduler's own ``onload`` / ``offload`` are moves too. Each move builds
or copies out the actor and its optimizer, ~40 ms for a 1M-parameter state on this CPU where its
bytes alone cost ~3 ms (6 ms since the onload skips the random init, 2026-12-05) — so a simulator that charged bytes only, and no move at a pipeline's
first pass, predicted every real run's first step ~45 ms short (and a ``jigsaw`` step, which
onloads and offloads every step, more). :class:`WorkerResidency` keeps the same places by the
same rules and prices each move with the profile's ``state_onload_s`` / ``state_offload_s``
plus the bytes' host transfer; it is on only when the truth cost model has those (a CPU profile),
so GPU simulations are unchanged.

Simplified (said here, as DESIGN.md asks): the executor's per-device memory budget, under which
a device offloads its least recently used other states first, is not mirrored (on the CPU pool
the budget holds every state of the bench and the demo).
"""

from __future__ import annotations

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.workload.models import ModelSpec


def worker_param(cost: CostModelProtocol, name: str) -> float:
    """A worker-pool cost parameter of ``cost`` (``serial_slice_s``, ``stage_gap_s``, ...):
    0 where the cost model has none or leaves it unset (the GPU presets)."""
    return float(getattr(getattr(cost, "params", None), name, 0.0) or 0.0)


def serial_devices(cost: CostModelProtocol) -> bool:
    """Whether ``cost`` describes devices that run one call at a time (the Ray executor's CPU
    workers: ``serial_slice_s`` > 0), where co-located work takes turns instead of sharing."""
    return worker_param(cost, "serial_slice_s") > 0.0


def moves_modelled(cost: CostModelProtocol) -> bool:
    """Whether ``cost`` prices a worker's train-state moves (a profiled worker pool)."""
    return worker_param(cost, "state_onload_s") > 0.0 or worker_param(cost, "state_offload_s") > 0.0


class WorkerResidency:
    """The device (or host: None) holding each pipeline's train state, as the executor's.

    Args:
        cost: the truth cost model (its ``params.state_onload_s`` / ``state_offload_s`` and
            host link price the moves).
    """

    def __init__(self, cost: CostModelProtocol) -> None:
        self.cost = cost
        self.loc: dict[str, int | None] = {}

    def _move_s(self, model: ModelSpec, onload: bool) -> float:
        p = self.cost.params
        fixed = p.state_onload_s if onload else p.state_offload_s
        return fixed + self.cost.host_transfer_time_s(self.cost.train_state_bytes(model, 1), 1)

    def _to(self, pipeline: str, model: ModelSpec, target: int) -> float:
        """Seconds to make ``target`` the state's device (0 when it is there already)."""
        loc = self.loc.get(pipeline)
        if loc == target:
            return 0.0
        seconds = self._move_s(model, onload=True)
        if loc is not None:  # on another device: offloaded first, through host memory
            seconds += self._move_s(model, onload=False)
        self.loc[pipeline] = target
        return seconds

    def move_s(self, pipeline: str, model: ModelSpec, stage: str,
               devices: tuple[int, ...]) -> float | None:
        """What ``stage`` on ``devices`` costs in moves before (or, for the scheduler's own
        ``onload`` / ``offload``, as) its work; None for a stage that moves nothing.

        The executor's rules: a model pass runs where the state is when that is one of its
        devices, else on its first device; an onload goes to the listed device holding the
        fewest states (and does nothing when the state is on a device already); an offload of
        a state in host memory does nothing.
        """
        if stage == Stage.OFFLOAD:
            if self.loc.get(pipeline) is None:
                return 0.0
            self.loc[pipeline] = None
            return self._move_s(model, onload=False)
        if stage == Stage.ONLOAD:
            if self.loc.get(pipeline) is not None:
                return 0.0
            held = [d for d in self.loc.values() if d is not None]
            target = min(devices or (0,), key=lambda d: (held.count(d), d))
            return self._to(pipeline, model, target)
        if stage in MODEL_PASSES:
            loc = self.loc.get(pipeline)
            target = loc if loc is not None and loc in devices else (devices[0] if devices
                                                                     else 0)
            return self._to(pipeline, model, target)
        return None
