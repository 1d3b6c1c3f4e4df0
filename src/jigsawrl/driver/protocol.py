"""What the driver needs from an executor, and the notifications an executor sends back.

Two executors implement :class:`Executor`: the simulated one (``executors/simulated.py``) and the
Ray one (real workers). Notifications are the executor's *control* messages to the driver (a task
finished, a rollout rank drained); metric records (spans, samples) are :mod:`jigsawrl.events`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from jigsawrl.events import Event
from jigsawrl.scheduler.base import (
    Interrupt,
    Migrate,
    Regroup,
    SetShare,
    Spread,
    StartRollout,
    StartStage,
)


@dataclass(frozen=True, slots=True)
class TaskDone:
    task_id: str
    pipeline: str
    step: int
    stage: str
    time_s: float
    prompt_tokens: tuple[int, ...] = ()  # rollout only: observed per finished sample
    response_tokens: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RankProgress:
    """A rollout rank changed: its unfinished request count (and band) — observable in a real
    engine, so schedulers may use it (JigsawRL switches to tail handling below 128)."""

    task_id: str
    rank: int
    unfinished: int
    band: str
    time_s: float
    ctx_tokens: int = 0  # tokens of context held by its unfinished requests (KV usage)


@dataclass(frozen=True, slots=True)
class TaskFailed:
    task_id: str
    pipeline: str
    step: int
    stage: str
    time_s: float
    error: str


Notification = TaskDone | RankProgress | TaskFailed


class Executor(Protocol):
    """Runs tasks; time advances only inside :meth:`advance`."""

    @property
    def now_s(self) -> float: ...

    def start(self) -> None: ...

    def close(self) -> None: ...

    def finish(self) -> None:
        """The run ended (every pipeline finished), before :meth:`close`, outside the clock:
        what the executor measures after a run (the Ray workers' end-of-run speed probes)."""
        ...

    def launch(self, action: StartRollout | StartStage) -> None: ...

    def set_share(self, action: SetShare) -> None: ...

    def migrate(self, action: Migrate) -> None: ...

    def interrupt(self, action: Interrupt) -> None: ...

    def regroup(self, action: Regroup) -> None:
        """Run a :class:`~jigsawrl.scheduler.base.Regroup` (asked only of an executor whose
        ``can_regroup`` attribute is true; the driver reads it with a False default)."""
        ...

    def spread(self, action: Spread) -> None:
        """Run a :class:`~jigsawrl.scheduler.base.Spread` (asked only of an executor whose
        ``can_spread`` attribute is true; the driver reads it with a False default)."""
        ...

    def busy(self) -> bool:
        """True while any task runs (so that :meth:`advance` can make progress)."""
        ...

    def advance(self) -> list[Notification]:
        """Run until at least one notification is due (or nothing runs) and return them."""
        ...

    def drain_events(self) -> list[Event]:
        """Metric records produced since the last call."""
        ...
