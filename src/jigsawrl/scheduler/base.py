"""The scheduler contract: a policy reads a read-only :class:`View` and returns a :class:`Decision`.

Policies are pure (DESIGN.md §3): no I/O, no clock, no knowledge of which executor runs. They see
what a real system could observe — finished samples' lengths, running-request counts per rank,
stage durations so far — and a *belief* cost model, never the simulator's sampled truth.

Actions:
  - :class:`StartRollout` — run a pipeline's rollout of one step on a set of devices
    (``len(devices) // tp`` data-parallel engine instances), at a compute share, with a KV-cache
    memory reservation per device;
  - :class:`StartStage` — run one post-rollout stage (reward, log-probs, update, weight sync,
    offload/onload) on a set of devices, at a compute share, with working memory per device;
  - :class:`SetShare` — change the compute share of a running task.

A new policy is one module with a class decorated by :func:`register_policy`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from jigsawrl.config import PipelineSpec
from jigsawrl.costmodel import CostModelProtocol
from jigsawrl.errors import ConfigError
from jigsawrl.graph.predict import StepObservation
from jigsawrl.scheduler.ranker import LengthRanker
from jigsawrl.stages import POST_ROLLOUT, Stage
from jigsawrl.workload.accelerators import AcceleratorSpec
from jigsawrl.workload.models import ModelSpec


def stage_sequence(spec: PipelineSpec) -> tuple[Stage, ...]:
    """The stages of one step in order (verl's order: gen, reward, old, ref, update, sync; the
    reference log-prob only with a reference model)."""
    return (Stage.ROLLOUT, *(s for s in POST_ROLLOUT if spec.use_ref or s != Stage.REF_LOGPROB))


def task_id(pipeline: str, step: int, stage: str) -> str:
    """IDs derive from structure (DESIGN.md §5)."""
    return f"{pipeline}/{step}/{stage}"


JIGSAW_FAMILY = frozenset({"jigsaw", "greedy"})


def params_for(configured: str, params: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The parameters policy ``name`` runs with when the config's scheduler is ``configured``
    with ``params``: its own, or none for another policy — except that ``jigsaw`` and ``greedy``
    (jigsaw at depth 0) share them, so an ablation differs only in the look-ahead."""
    if name == configured or {name, configured} <= JIGSAW_FAMILY:
        return dict(params)
    return {}


# ---------------------------------------------------------------------------- actions

@dataclass(frozen=True, slots=True)
class StartRollout:
    """Start a step's rollout: ``len(devices) // tp`` engine instances (ranks).

    ``dispatch`` is how the batch is split over ranks: ``contiguous`` (verl: equal contiguous
    chunks, a GRPO group stays together) or ``skew_aware`` (StreamRL: a length *ranker* orders
    prompts by predicted length and deals them longest-first). ``ranker`` is the policy's
    predictor for ``skew_aware`` (:class:`~jigsawrl.scheduler.ranker.LengthRanker`, fitted on
    history; the executor evaluates it on prompt lengths only; None: every request alike).

    ``stream_devices`` (StreamRL): finished GRPO groups go through the trainer on these devices
    while the rollout runs (old/ref log-probs, actor forward-backward), yielding to any stage
    started there; the post-rollout stages then cost only the rest. ``first_b`` (AReaL): the
    rollout is done when its pipeline's first ``batch_size`` groups have finished, from any of
    its rollouts; its unfinished requests carry over into the next rollout. Both are modelled by
    the simulator only (``jigsawrl.sim.stream``, ``jigsawrl.sim.batching``); the Ray executor
    runs such a rollout as a plain one and says so in its log. ``tail_logprobs`` (jigsaw's
    in-tail log-probs): the old/ref log-probs of finished groups run on the rollout's devices
    that drained and nothing else uses, while its tail still runs (the simulator's
    ``sim/stream.py`` tail mode; on Ray, ``executors/raycluster/tail.py``).
    """

    pipeline: str
    step: int
    devices: tuple[int, ...]
    tp: int = 1
    share: float = 1.0
    kv_mem_bytes: float = 0.0  # per device, reserved for the KV cache while the rollout runs
    dispatch: str = "contiguous"
    ranker: LengthRanker | None = None
    stream_devices: tuple[int, ...] = ()
    first_b: bool = False
    tail_logprobs: bool = False


@dataclass(frozen=True, slots=True)
class StartStage:
    pipeline: str
    step: int
    stage: str
    devices: tuple[int, ...]
    share: float = 1.0
    mem_bytes: float = 0.0  # per device working memory (activations) while it runs


@dataclass(frozen=True, slots=True)
class SetShare:
    """Change a running task's compute share (on one rollout rank, or on all its devices)."""

    task_id: str
    share: float
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class Migrate:
    """Long-tail migration (sub-stage merging): abort the unfinished requests of ``src_ranks`` of a
    running rollout and resume them on ``dst_rank`` (which re-prefills prompt + generated tokens).
    The source ranks' devices are released."""

    task_id: str
    src_ranks: tuple[int, ...]
    dst_rank: int


@dataclass(frozen=True, slots=True)
class Regroup:
    """Tail speed-up (issue 11, item 4): abort the unfinished requests of ``dst_rank`` and
    ``src_ranks`` of a running rollout and resume them all on one tensor-parallel group formed of
    those ranks' devices, which ``dst_rank`` then spans. A decode step of a short tail is bound by
    reading the weights, so a wider group runs it faster; the price is the re-prefill of every
    moved context on the new group and its engine's wake-up (the executor charges both). The
    devices stay the rollout's; only an executor whose ``can_regroup`` is true accepts it."""

    task_id: str
    src_ranks: tuple[int, ...]
    dst_rank: int


@dataclass(frozen=True, slots=True)
class Spread:
    """Grow a running rollout (issue 11, item 4: a rollout that started narrow can grow once
    started): new ranks of the rollout's TP on ``devices`` (whole groups, each within a node),
    and the rollout's queued and running requests re-dealt so that every live rank holds about
    as many unfinished requests as the others. A moved request that had started is aborted and
    re-prefilled (prompt and generated tokens) on its new rank, which also pays a rank's
    set-up; requests waiting for a tool stay where their result will arrive. Which requests
    move is chosen without their lengths (queued ones first, then the most recently admitted).
    Only an executor whose ``can_spread`` is true accepts it."""

    task_id: str
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Interrupt:
    """AReaL's interruptible generation: abort every in-flight request of a rollout and resume it
    in place (re-prefill) — what happens when new weights arrive mid-rollout."""

    task_id: str


@dataclass(frozen=True, slots=True)
class SetResident:
    """Declare a pipeline's persistent state (train state, reference weights) on devices.

    Bookkeeping for the memory invariant: ``bytes_per_device`` replaces the pipeline's previous
    residency on those devices (0 frees it). Moving state costs time only through explicit
    ``offload`` / ``onload`` stages.
    """

    pipeline: str
    devices: tuple[int, ...]
    bytes_per_device: float


Action = (StartRollout | StartStage | SetShare | SetResident | Migrate | Regroup | Spread |
          Interrupt)


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...] = ()


# ---------------------------------------------------------------------------- view

# ``RunningTask.unfinished_per_rank`` of a rank that has not reported progress yet. Counting it
# as 0 made jigsaw release (migrate away) a rank whose first slice had not returned while the
# other rank's had: on Ray, every two-rank rollout of the demo's `search` moved all 64 requests
# of one rank onto the other after its first slice (docs/BENCHMARKS.md, "The engine's limits").
NOT_REPORTED = -1


@dataclass(frozen=True, slots=True)
class RunningTask:
    task_id: str
    pipeline: str
    step: int
    stage: str
    devices: tuple[int, ...]
    share: float
    start_s: float
    # rollout only: requests not yet finished per rank; NOT_REPORTED until the rank's first
    # progress report (a rank that has reported nothing is not a drained rank)
    unfinished_per_rank: tuple[int, ...] = ()
    rank_devices: tuple[tuple[int, ...], ...] = ()  # rollout only: devices of each live rank
    rank_shares: tuple[float, ...] = ()  # rollout only: share of each rank (0 = released)
    ctx_tokens_per_rank: tuple[int, ...] = ()  # rollout only: KV context held per rank

    @property
    def live_share(self) -> float:
        """The share of its first live rank (its own for a task without ranks): what a rank a
        :class:`Spread` adds starts at."""
        return next((s for s in self.rank_shares if s > 0), self.share)


def progress_known(t: RunningTask, counts: Sequence[int],
                   ranks: Iterable[int] | None = None) -> bool:
    """Whether ``counts`` (rollout ``t``'s unfinished requests per rank, maybe newer than its
    own) cover every rank of ``t`` and each of ``ranks`` (None: all) has reported: what the
    tail, spread and regroup planning need before they read a rank as drained or busy."""
    if len(counts) < len(t.rank_devices):
        return False
    idx = range(len(counts)) if ranks is None else ranks
    return all(counts[r] != NOT_REPORTED for r in idx)


@dataclass(frozen=True, slots=True)
class PipelineView:
    name: str
    index: int
    spec: PipelineSpec
    model: ModelSpec
    done: Mapping[int, frozenset[str]]  # step -> completed stages (steps in flight only)
    steps_completed: int  # steps whose weight sync is done
    running: tuple[RunningTask, ...]
    history: tuple[StepObservation, ...]
    failed: bool = False
    # ready() of this (immutable) view, per force_sync: asked for many times per decision
    _ready: dict[bool, tuple[tuple[int, str], ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.failed or self.steps_completed >= self.spec.steps

    def ready(self, force_sync: bool = False) -> list[tuple[int, str]]:
        """(step, stage) pairs whose dependencies are met and that are not running or done.

        Sync: rollout of step k needs weight sync of k-1. Async with staleness η: rollout of step
        k needs weight sync of step k-1-η (AReaL's bound in model versions). Post-rollout stages of
        step k run in order after that step's rollout, and training is sequential across steps.
        """
        got = self._ready.get(force_sync)
        if got is None:
            got = self._ready[force_sync] = tuple(self._find_ready(force_sync))
        return list(got)

    def _find_ready(self, force_sync: bool) -> list[tuple[int, str]]:
        if self.finished:
            return []
        seq = stage_sequence(self.spec)
        running = {(t.step, t.stage) for t in self.running}
        out: list[tuple[int, str]] = []
        is_async = self.spec.mode == "async" and not force_sync
        eta = self.spec.max_staleness if is_async else 0
        first = self.steps_completed
        for step in range(first, min(self.spec.steps, first + eta + 1)):
            done = self.done.get(step, frozenset())
            nxt = next((s for s in seq if s not in done), None)
            if nxt is None or (step, nxt) in running:
                continue
            # Rollout of ``step`` needs the weights of step - 1 - eta: guaranteed by the range.
            if nxt != Stage.ROLLOUT and step > first:
                continue  # training of earlier steps first
            out.append((step, nxt))
        return out


@dataclass(frozen=True, slots=True)
class DeviceView:
    index: int
    node: int
    mem_capacity_bytes: float
    mem_used_bytes: float  # resident state + working memory of running tasks
    share_used: float
    tasks: tuple[str, ...]
    resident: Mapping[str, float] = field(default_factory=dict)  # pipeline -> bytes


@dataclass(frozen=True, slots=True)
class View:
    now_s: float
    pipelines: tuple[PipelineView, ...]
    devices: tuple[DeviceView, ...]
    accelerator: AcceleratorSpec
    accelerators_per_node: int
    cost: CostModelProtocol  # the belief cost model (noise-free)
    can_regroup: bool = False  # the executor runs Regroup actions (re-formed TP groups)
    can_spread: bool = False  # the executor runs Spread actions (a rollout grows new ranks)


# ---------------------------------------------------------------------------- registry

class Policy(Protocol):
    """What the driver and the experiments call on a policy (pure: no I/O, no clock).

    ``wants_rank_progress``: the executor reports per-rank unfinished counts
    (:class:`~jigsawrl.driver.protocol.RankProgress`) and the driver asks for a decision on each
    report after which ``wakes_on_progress(task, unfinished)`` (the rollout, its new counts) is
    true.
    ``variants()``: the placements an experiment runs and keeps the best of (verl's split and
    serial, ...); a policy with one placement returns ``[self]``. ``report()``: what it says
    about its run once the run is over (the summary's ``policy_report``). ``background()``,
    asked after each decision: work the decision left to run off its path (a replan, a
    prediction), or None; the driver runs it and asks for a decision again at the same instant
    (``driver/loop.py``). The work is pure computation on what earlier views showed.
    """

    name: str
    wants_rank_progress: bool

    def decide(self, view: View) -> Decision: ...

    def wakes_on_progress(self, task: RunningTask, unfinished: Sequence[int]) -> bool: ...

    def variants(self) -> Sequence[Policy]: ...

    def report(self) -> dict[str, Any]: ...

    def background(self) -> Callable[[], None] | None: ...


class PolicyBase:
    """The defaults of :class:`Policy` for a policy class to inherit: one placement, no
    per-rank progress, nothing to report."""

    name: str = "policy"
    wants_rank_progress: bool = False

    def wakes_on_progress(self, task: RunningTask, unfinished: Sequence[int]) -> bool:
        """Whether a progress report that left rollout ``task`` with ``unfinished`` requests
        per rank calls for a decision. Default: every report does (asked only
        of a policy that wants them); a policy whose decision reads counts only in some regimes
        says which, so that the frequent reports in between cost nothing (issue 11)."""
        return True

    def variants(self) -> Sequence[Policy]:
        return [self]  # type: ignore[list-item]

    def report(self) -> dict[str, Any]:
        """What the policy says about its run, for the summary's ``policy_report`` (JSON
        values): the plan it chose and why, how often a mechanism acted. Default: nothing."""
        return {}

    def background(self) -> Callable[[], None] | None:
        """Work the last decision left to run off the decision path. Default: none."""
        return None


PolicyFactory = Callable[..., Policy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register_policy(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Class decorator registering a policy under ``scheduler.name`` (also a factory function
    returning one, for a preset of a class: ``verl-serial``, ``greedy``).

    Raises:
        TypeError: a class that does not inherit :class:`PolicyBase` (whose defaults every
            caller relies on instead of probing the policy's members).
    """

    def deco(cls: PolicyFactory) -> PolicyFactory:
        if isinstance(cls, type) and not issubclass(cls, PolicyBase):
            raise TypeError(f"policy {name!r}: {cls.__name__} must inherit PolicyBase")
        _REGISTRY[name] = cls
        return cls

    return deco


def get_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """Instantiate a registered policy with ``scheduler.params``.

    Raises:
        ConfigError: unknown name or bad params (names the known ones).
    """
    if name not in _REGISTRY:
        raise ConfigError(f"unknown scheduler {name!r}", where="scheduler.name",
                          fix=f"use one of: {', '.join(list_policies())}")
    try:
        return _REGISTRY[name](**dict(params or {}))
    except TypeError as exc:
        raise ConfigError(f"bad params for scheduler {name!r}: {exc}",
                          where="scheduler.params",
                          fix=f"give only parameters {name!r} accepts (params written for "
                              "another scheduler do not carry over when scheduler.name "
                              "changes: edit or remove scheduler.params)") from None


def list_policies() -> list[str]:
    return sorted(_REGISTRY)
