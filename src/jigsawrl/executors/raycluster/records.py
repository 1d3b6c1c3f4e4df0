"""What the Ray executor's parts share: its settings, the records of devices, pipelines and
in-flight worker calls, the run clock, and what is waiting to be reported to the driver.

The executor (:mod:`.executor`) is split by concern — the fleet of workers (:mod:`.fleet`),
train-state residency (:mod:`.residency`), rollouts (:mod:`.slices`), post-rollout stages
(:mod:`.training`) and recovery from a dead worker (:mod:`.recovery`) — and every part reads and
writes one :class:`RunState`. Plain bookkeeping: no Ray call is made here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from jigsawrl.driver.protocol import Notification
from jigsawrl.events import Event, Span
from jigsawrl.executors.raycluster.messages import Timed
from jigsawrl.executors.raycluster.rollouts import RankRT, RolloutRT
from jigsawrl.stages import Stage

CHUNK_S = 0.2  # a rollout rank's time slice: short enough to react, long vs Ray's ~2 ms a call
# A rank's requests are snapshot for fault recovery about once a second of its rollout: a snapshot
# of 16 requests × 200 tokens costs ~2 ms (+ ~130 KB through Ray; docs/RAY.md), ~1% of a 0.2 s
# slice if taken every slice, ~0.2% this way; a dead worker costs at most ~1 s of decoding.
CHECKPOINT_S = 1.0
FLOPS_PER_TOKEN = {Stage.ROLLOUT: 2.0, Stage.OLD_LOGPROB: 2.0, Stage.REF_LOGPROB: 2.0,
                   Stage.ACTOR_UPDATE: 6.0}
BYTES_PER_PARAM_TRAIN = 16  # fp32 weights + grads + two AdamW moments (estimate until measured)


@dataclass
class Settings:
    """The executor's knobs (tests and drills may change them before :meth:`start`)."""

    threads_per_device: int = 1
    chunk_s: float = CHUNK_S
    checkpoint_s: float = CHECKPOINT_S
    data_parallel: bool = True
    mem_budget: float = 0.0  # per-device memory for train states, bytes
    ckpt_dir: Path | None = None
    offsets: dict[str, int] = field(default_factory=dict)

    def threads_for(self, share: float, num_devices: int) -> int:
        """Torch threads of a call holding ``share`` of ``num_devices`` devices."""
        return max(1, round(share * self.threads_per_device * num_devices))


@dataclass(eq=False)
class Dev:
    """A device and its worker actor."""

    index: int
    actor: Any
    node_id: str = ""
    resident: dict[str, int] = field(default_factory=dict)  # pipeline -> train-state bytes (LRU)
    versions: dict[str, int] = field(default_factory=dict)  # pipeline -> engine weights version


@dataclass(eq=False)
class Pipe:
    """Where a pipeline's state is and what its steps produced (executor side)."""

    name: str
    spec: Any
    num_params: int
    offset: int = 0  # steps done before this run (resume)
    reward: Any = None
    loc: int | None = None  # device holding the train state; None: host (``host_ref``)
    host_ref: Any = None
    weights_ref: Any = None  # newest weights (or a host train state holding them)
    version: int = 0
    state_bytes: int = 0
    lost: str | None = None  # why it cannot go on (its next task fails with this)
    reported: bool = False  # its failure was sent to the driver
    trajs: dict[int, Any] = field(default_factory=dict)  # step -> ObjectRef of trajectories
    rewards: dict[int, Any] = field(default_factory=dict)  # step -> ObjectRef of reward result
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)  # absolute step -> metrics
    # Restore point of the train state (recovery.py): a host copy in the object store (from the
    # start or the last offload that returned) and the model passes run on it since, in order.
    restore_ref: Any = None
    replay: list[Replay] = field(default_factory=list)
    epoch: int = 0  # restores so far: a call submitted before the last one is stale


@dataclass(eq=False)
class Replay:
    """A model pass of a pipeline since its restore point, and its inputs (driver-owned refs):
    what a train state lost with its worker is rebuilt from."""

    step: int
    stage: str
    trajs: Any
    rewards: Any
    done: bool = False


class CallKind(StrEnum):
    CHUNK = "chunk"  # a rollout rank's time slice
    STAGE = "stage"  # a task's call: its task is done when it returns
    MOVE = "move"  # a train-state move the executor made on its own (no task of the driver)
    TAIL = "tail"  # in-tail log-probs on a drained rank's device (no task of the driver)


@dataclass(eq=False)
class Call:
    """One in-flight worker call the executor waits on."""

    kind: CallKind
    pipeline: str
    step: int
    stage: str
    devices: tuple[int, ...]  # where its span is drawn
    share: float
    tid: str | None = None
    rollout: RolloutRT | None = None
    rank: RankRT | None = None
    helpers: tuple[int, ...] = ()  # a data-parallel model pass: its helpers' devices
    weights: Any = None  # a weight sync: the ObjectRef of the published weights
    worker: int | None = None  # the device whose worker runs it (None: a reward worker)
    host: Any = None  # an offload: the ObjectRef of the host train state it returns
    mark: int = 0  # an offload: the pipeline's replay passes its host copy includes
    replay: Replay | None = None  # a model pass: its entry in the pipeline's replay
    action: Any = None  # a task's call: the driver's action (relaunched after a restore)
    epoch: int = 0  # the pipeline's epoch when it was submitted
    seq: int = 0  # submission order
    sent: Any = None  # a slice: the (fresh indices, incoming) it took in


class RunState:
    """The executor's shared state (see the module docstring).

    ``on_call`` is a test and drill hook: called with every worker call the executor starts
    waiting on, right after it was submitted.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.devs: list[Dev] = []
        self.pipes: dict[str, Pipe] = {}
        self.calls: dict[Any, Call] = {}  # info ObjectRef -> call
        self.notes: list[Notification] = []  # for the driver, at the end of this advance
        self.instant: list[Notification] = []  # due without waiting on any call
        self.events: list[Event] = []
        self.on_call: Callable[[Call], None] | None = None
        self.launching: Any = None  # the action being launched (its calls keep it)
        self.seq = 0
        self._t0: float | None = None
        self._t0_wall = 0.0

    # ------------------------------------------------------------------ clock
    @property
    def now_s(self) -> float:
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    def start_clock(self) -> None:
        self._t0 = time.monotonic()
        self._t0_wall = time.time()

    def run_time(self, wall: float) -> float:
        """A worker's wall-clock time on the run clock."""
        return max(0.0, wall - self._t0_wall)

    # ------------------------------------------------------------------ calls
    def track(self, ref: Any, call: Call) -> None:
        self.seq += 1
        call.seq, call.epoch = self.seq, self.pipes[call.pipeline].epoch
        if call.tid is not None and call.action is None:
            call.action = self.launching
        self.calls[ref] = call
        if self.on_call is not None:
            self.on_call(call)

    def untrack(self, ref: Any) -> Call | None:
        """Stop waiting on ``ref``; its call, or None when it was dropped already (a recovery
        earlier in the same batch of results stopped waiting on it). A slice's rank is no
        longer in flight, whatever became of the call: a rank left pointing at a dead call would
        never be resubmitted, and its rollout would neither finish nor fail."""
        call = self.calls.pop(ref, None)
        if call is not None and call.rank is not None and call.rank.inflight is ref:
            call.rank.inflight = None
        return call

    def drop(self, which: Callable[[Call], bool]) -> list[Call]:
        """Stop waiting on every call ``which`` selects (their results are ignored)."""
        refs = [ref for ref, c in self.calls.items() if which(c)]
        return [c for c in (self.untrack(ref) for ref in refs) if c is not None]

    def on_worker(self, device: int) -> list[Any]:
        """The refs of the calls in flight on ``device``'s worker."""
        return [ref for ref, c in self.calls.items() if c.worker == device]

    # ------------------------------------------------------------------ reports
    def span(self, call: Call, stage: str, res: Timed, rank: int = 0,
             share: float | None = None) -> None:
        flops = FLOPS_PER_TOKEN.get(call.stage, 0.0) * self.pipes[call.pipeline].num_params
        self.events.append(Span(call.pipeline, call.step, stage, rank, call.devices,
                                self.run_time(res.t_start), self.run_time(res.t_end),
                                call.share if share is None else share, flops * res.tokens,
                                res.tokens))

    def take_notes(self) -> list[Notification]:
        out, self.notes = self.notes, []
        return out
