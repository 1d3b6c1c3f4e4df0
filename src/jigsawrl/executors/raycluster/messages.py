"""The typed messages between the Ray executor and its workers: each worker call's request and
result.

What: one frozen dataclass per request (what the executor asks a worker to do) and per result
(what the call returns). Times are the worker's wall clock (``time.time()``, comparable between
the driver and the workers of one machine); the executor turns them into run time for its spans.

Why the heavy inputs are not fields: Ray resolves an ``ObjectRef`` only when it is a top-level
argument of a call, so train states, weights, trajectories, reward results and migrated requests
travel as separate arguments beside the request (they stay in the object store, owned by the
driver). Data-parallel helper calls (``helpers`` of a stage) are the exception on purpose: they
are nested so that the worker waits on them only when it needs their results.

Plain Python: no ray or torch import (tensors inside are opaque ``Any``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Resumable(NamedTuple):
    """An unfinished request taken out of an engine (``ExportedRequest``: a migration's export
    or a checkpoint's snapshot) and the weights version that generated its tokens (kept when it
    resumes elsewhere, for the samples' version accounting)."""

    request: Any
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Timed:
    """What every call reports: when it ran on the worker, and the tokens it processed."""

    t_start: float
    t_end: float
    tokens: int = 0

    @property
    def seconds(self) -> float:
        return self.t_end - self.t_start


# ---------------------------------------------------------------------------- lifecycle

@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """Where a device worker runs (its ``ready`` call)."""

    device: int
    pid: int
    node_id: str


@dataclass(frozen=True, slots=True)
class TrainState:
    """A pipeline's train state as it moves through host memory: the trainer's state (actor,
    AdamW moments, reference) and the batches of its steps in flight (step -> ``StepData``)."""

    train: dict[str, Any]
    steps: dict[int, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TrainInit:
    """A pipeline built with its trainer (``init_train``; the state is returned beside it)."""

    start_s: float
    resumed_step: int  # -1: no checkpoint restored
    history: tuple[dict[str, float], ...] = ()  # metrics of the steps before the checkpoint


# ---------------------------------------------------------------------------- rollout

@dataclass(frozen=True, slots=True)
class SliceRequest:
    """One time slice of a rollout rank (``gen_run``).

    ``fresh``: request indices (into the step's request list) to start here; ``version``: the
    weights version of the weights sent with it (if any); ``force_reload``: reload the newest
    weights now (AReaL's interruption); ``checkpoint``: also return a snapshot of the rank's
    unfinished requests after the slice.
    """

    pipeline: str
    step: int
    rank: int
    budget_s: float
    threads: int
    fresh: tuple[int, ...]
    version: int
    force_reload: bool = False
    checkpoint: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SliceResult(Timed):
    """What a slice did: the trajectories that finished (with the weights version of each), the
    rank's unfinished, decoding and context-token counts, the seconds until its first tool
    result is ready (0: none waiting), the slice's mean decode width (names its band) and, when
    asked, the checkpoint of its unfinished requests."""

    trajectories: tuple[Any, ...]
    versions: tuple[int, ...]
    unfinished: int
    decoding: int
    ctx_tokens: int
    next_ready_s: float
    width: int
    threads: int
    setup_s: float
    checkpoint: tuple[Resumable, ...] = ()


# ---------------------------------------------------------------------------- train state

@dataclass(frozen=True, slots=True)
class StageRequest:
    """A model pass (``old_logprob`` / ``ref_logprob`` / ``actor_update``) of one step, on the
    device holding the train state; with ``bounds`` it is data-parallel: this device computes
    rows ``bounds[0]``, the helpers the others."""

    pipeline: str
    stage: str
    step: int
    threads: int = 1
    bounds: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StageResult(Timed):
    """A model pass: its threads, the update's metrics (empty for log-probs) and the timings of
    its data-parallel helpers (one per helper device, in order: a span, or for an update of
    several PPO epochs one span per round)."""

    threads: int
    metrics: dict[str, float] = field(default_factory=dict)
    helpers: tuple[Timed | tuple[Timed, ...], ...] = ()
    # where the call's wall time went (callclock.py): process CPU, garbage collection, the
    # model pass itself, an onload for it and the step's batch build, in seconds
    clock: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class ShardPayload:
    """What a data-parallel helper needs: the model's weights (the actor, or the reference for
    ``ref_logprob``), the step's batch and the trainer config."""

    weights: dict[str, Any]
    batch: Any
    config: Any


@dataclass(frozen=True, slots=True)
class ShardRequest:
    """A data-parallel helper's part of a model pass: rows ``start:stop`` of the batch."""

    pipeline: str
    stage: str
    start: int
    stop: int
    threads: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardResult(Timed):
    """A helper's shard: the update's gradients, or the shard's log-probs."""

    grads: Any = None
    logprobs: Any = None

    def timing(self) -> Timed:
        """The shard without its tensors (what the stage reports back)."""
        return Timed(t_start=self.t_start, t_end=self.t_end, tokens=self.tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveResult(Timed):
    """An offload or onload of a train state, and the bytes of tensors it moved."""

    state_bytes: int


@dataclass(frozen=True, slots=True)
class TailRequest:
    """In-tail log-probs (``tail_pass``): the old (``old``) and reference (``ref``) log-probs of
    finished GRPO groups of a sync rollout, on a drained rank's device while the tail still runs.

    ``rows``: the requests' batch rows; ``sequences``: each row's ``(prompt ids, response ids,
    response mask)``; ``version``: the weights version the rollout ran with (the worker's
    newest must be it)."""

    pipeline: str
    step: int
    version: int
    threads: int
    rows: tuple[int, ...]
    sequences: tuple[tuple[list[int], list[int], list[int]], ...]
    old: bool
    ref: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TailResult(Timed):
    """The rows' log-probs (host tensors, each cut at its row's end; None: not asked) and when
    the old pass ended (``t_mid``: the reference pass ran after it)."""

    rows: tuple[int, ...]
    old: tuple[Any, ...] | None = None
    ref: tuple[Any, ...] | None = None
    t_mid: float = 0.0


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """Weight sync of the completed ``step`` (a count of steps done, offsets included); writes a
    checkpoint to ``ckpt_root`` when ``checkpoint``."""

    pipeline: str
    step: int
    ckpt_root: str | None
    checkpoint: bool
    meta: dict[str, Any]


# ---------------------------------------------------------------------------- reward

@dataclass(frozen=True, slots=True, kw_only=True)
class RewardResult(Timed):
    """The scores of a step's trajectories (in order) and each one's info (``error`` when the
    reward function failed on it)."""

    rewards: tuple[float, ...]
    infos: tuple[dict[str, Any], ...]
