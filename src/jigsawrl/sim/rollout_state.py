"""The state of running rollouts in the simulator: tasks, their ranks and the span each extends.

Plain records shared by the rollout runtime (:mod:`.rollout_task`) and its first-B batching
(:mod:`.rollout_first_b`); behaviour lives there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jigsawrl.sim.batching import GroupTracker
from jigsawrl.sim.kernel import Entry
from jigsawrl.sim.rollout import ReqRun, RolloutInstance, Segment
from jigsawrl.workload.experiment import ResolvedPipeline

# The band a rank reports once it has no unfinished request (not a sub-stage: no span has it).
DONE_BAND = "done"


@dataclass(slots=True)
class OpenSpan:
    """The span a rank is extending: one sub-stage at one share since ``start_s``."""

    stage: str
    start_s: float
    share: float
    flops: float = 0.0
    tokens: int = 0


@dataclass(slots=True, eq=False)
class RankRun:
    """One data-parallel rank of a running rollout: its instance, devices and planned segment."""

    inst: RolloutInstance
    devices: tuple[int, ...]
    share: float
    seg: Segment | None = None
    entry: Entry | None = None
    open: OpenSpan | None = None
    last_unfinished: int = -1
    wake: Entry | None = None  # pending re-plan after tool results (one per instant)
    redirect: RankRun | None = None  # after migration: where this rank's tool results go
    kappa: float = 1.0  # memory-bandwidth contention on its devices when its segment was planned
    index: int = 0  # rank number within its rollout
    owner: RolloutTask | None = None  # the rollout it belongs to
    slice_end: Entry | None = None  # serial devices: when its time slice ends (sim/gates.py)
    yield_due: bool = False  # serial devices: its slice ended in a prefill; yield after it
    setup_due: bool = False  # its first segment also pays the worker's rank set-up
    # serial devices: calls on its worker its next segment resumes in (after tool waits, after
    # yielding to another call); that segment waits a stage gap for each
    calls_due: int = 0
    wake_s: float = 0.0  # after a regroup: its new engine's wake-up, before its next segment
    host_factor: float = 1.0  # the host's slowdown its segment was timed at (sim/hostload.py)


@dataclass(slots=True, eq=False)
class RolloutTask:
    """A running rollout: one step of one pipeline over its ranks."""

    tid: str
    pipe: ResolvedPipeline
    step: int
    ranks: list[RankRun]
    samples: list[ReqRun] = field(default_factory=list)
    first_b: bool = False  # AReaL: done when the pipeline's first B groups finished
    closed: bool = False  # done (first-B: its leftovers wait here until the next rollout)
    groups: GroupTracker | None = None  # streaming: its finished groups go to the trainer
    kv_mem_bytes: float = 0.0  # per device, reserved for KV (a regrouped rank's budget)
    tp: int = 1  # devices of each rank as started (a spread's new ranks have as many)
