"""The planner's forecast: the rest of every pipeline's run under one width plan, as a fluid
event model (DESIGN.md §2.7).

Why a second forecast beside :mod:`.forecast`: that one scores the next few events of one
decision; a width plan shapes whole steps — how long each rollout runs, whether training finds
free devices, who waits for the one train-state slot — so it is scored over the remaining steps.
It must stay cheap (the planner tries a few dozen plans), so each pipeline is a loop of works:

- **rollout** on its planned ``width`` devices, lasting the predicted generation time on
  that width (:class:`~.widths.WidthTimer`); it may start when its devices are free and, for
  async pipelines, while its weights are at most ``staleness`` versions old — so an async
  pipeline's next rollout may start beside its running one (at most two in flight; before,
  one at a time, which forecast the paper's async groups 3-12% late); once other pipelines
  have finished, it takes the widest width their devices leave (as the policy's replan does
  when the pipelines running change);
- **reward** (host) then **training**: the train state is onloaded, the model passes run on the
  pool, it is offloaded; one pipeline trains at a time (``max_train_states`` = 1, the memory
  plan), the one with the most predicted work left first (the policy's urgency);
- **weight sync** (host) completes the step.

With two engine slots per device (``slots``: plans with two rollout engines per device) a
rollout may start where one engine already is; while some devices hold two, each rollout
progresses at ``1 - d (1 - co_rate)``, ``d`` the share of the running engines that have a
second one beside them (fluid: the doubly held devices spread over every rollout), and a pass
beside them at the two-engine shared rate.

The passes run as the placement runs them: on the devices no rollout holds, at full share, when
that is at least as fast as sharing every device beside the decodes (rate ``1 / slowdown``), else
on every device, slowing the decodes to their share's rate. Simplification: a rollout holds its
devices until its last rank finishes (migration's early release of drained ranks is not
modelled), which makes the forecast pessimistic for plans that leave training free devices;
nor does a rollout grow onto devices others left idle (:mod:`.spread`), which makes it
pessimistic for plans whose last steps start narrow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from jigsawrl.stages import Stage


@dataclass(frozen=True, slots=True)
class PlanPipe:
    """One pipeline as the plan forecast sees it (seconds; training on the whole pool)."""

    name: str
    steps: int  # steps left, the current one included
    gen_s: float  # one rollout at the planned width
    width: int  # devices the rollout holds
    wider: tuple[int, ...] = ()  # larger widths a rollout may take once others finish, ascending
    # gen_s at one of ``wider``: asked only for a width that fits (each is a rollout replay, and
    # most forecasts never free the room for one)
    gen_at: Callable[[int], float] | None = None
    reward_s: float = 0.0
    train_s: float = 0.0  # model passes on the whole pool, full share
    move_s: float = 0.0  # onload + offload of the train state
    sync_s: float = 0.0
    staleness: int = 0
    rolling_s: float | None = None  # the current step's rollout: seconds left (running)
    trained_first: bool = False  # the current step's rollout is done; it waits to train
    ahead_s: float | None = None  # the next step's rollout (async): seconds left (running)
    # its rollout's rate beside another pipeline's engine on its devices ÷ alone (plans with
    # two engines per device: :mod:`.corun`)
    co_rate: float = 1.0


@dataclass(frozen=True, slots=True)
class Rates:
    """The belief cost model's co-location rates (progress per second, 1 = alone)."""

    compute_shared: float  # a model pass on every device beside decodes
    decode_shared: float  # a decode beside that pass
    # the same where devices hold two rollout engines (plans with ``slots`` = 2; None: as one)
    compute_shared2: float | None = None
    decode_shared2: float | None = None


@dataclass(slots=True)
class _Pipe:
    spec: PlanPipe
    rolled: int = 0  # rollouts finished
    trained: int = 0  # steps whose weight sync finished
    roll_left: float | None = None  # seconds of rollout left at full rate (None: not rolling)
    roll_width: int = 0  # devices the running rollout holds
    # an async pipeline's next rollout, started while the one above still runs (its weights
    # within the staleness bound), and how many such rollouts finished before it
    ahead_left: float | None = None
    ahead_width: int = 0
    early: int = 0
    rewards_queued: int = 0  # finished rollouts whose reward waits for the one running
    reward_left: float | None = None
    sync_left: float | None = None
    waiting: int = 0  # rolled-out, rewarded steps waiting to train
    finish: float = 0.0


@dataclass(slots=True)
class _Train:
    """The one train-state slot: who holds it, in which phase, seconds left at full rate."""

    holder: _Pipe | None = None
    phase: str = ""  # move_in | pass | move_out
    left: float = 0.0


@dataclass(frozen=True, slots=True)
class PlanResult:
    makespan_s: float
    finish_s: dict[str, float]
    # how far each pipeline's predicted step latency exceeds its bound (:mod:`.latency`;
    # empty where no pipeline sets one)
    over: dict[str, float] = field(default_factory=dict)

    @property
    def excess(self) -> float:
        """The latency bounds' total excess (0: every bound met, or none set)."""
        return total_excess(self.over)

    def key(self) -> tuple[float, float, float]:
        """Lower is better: the latency bounds' excess, the makespan, the sum of finish times."""
        return (self.excess, round(self.makespan_s, 6), sum(self.finish_s.values()))


def total_excess(over: dict[str, float]) -> float:
    """The sum of the pipelines' excesses over their latency bounds, rounded so that float
    noise does not order plans."""
    return round(sum(over.values()), 4)


# A work in progress: (kind, pipeline, seconds left at full rate, rate).
Work = tuple[str, _Pipe, float, float]


def forecast_plan(pipes: list[PlanPipe], n: int, rates: Rates,
                  max_events: int = 20_000, slots: int = 1) -> PlanResult:
    """Forecast when every pipeline finishes its remaining steps under its planned width;
    ``slots``: rollout engines a device may host (2: co-located rollouts, each slowed to its
    ``co_rate`` on the share of the devices held twice)."""
    ps = [_Pipe(p) for p in pipes if p.steps > 0]
    for p in ps:
        ahead = p.spec.ahead_s
        if p.spec.rolling_s is not None:
            p.roll_left, p.roll_width = max(0.0, p.spec.rolling_s), p.spec.width
            if ahead is not None:
                p.ahead_left, p.ahead_width = max(0.0, ahead), p.spec.width
        elif p.spec.trained_first:
            p.rolled, p.waiting = 1, 1
            if ahead is not None:  # the next step's rollout is the oldest running
                p.roll_left, p.roll_width = max(0.0, ahead), p.spec.width
    t = 0.0
    train = _Train()
    for _ in range(max_events):
        _start_rollouts(ps, n, slots)
        _start_training(ps, train)
        works = _works(ps, train, n, rates)
        if not works:
            break
        dt = min(left / rate for _, _, left, rate in works)
        t += dt
        for kind, p, left, rate in works:
            _advance(kind, p, train, left - rate * dt, t)
    return PlanResult(t, {p.spec.name: p.finish for p in ps})


def _work_left(p: _Pipe) -> float:
    """Predicted seconds of ``p``'s remaining steps (the urgency order of the policy)."""
    return (p.spec.steps - p.trained) * (p.spec.gen_s + p.spec.train_s)


def _start_rollouts(ps: list[_Pipe], n: int, slots: int = 1) -> None:
    """Start every rollout that may start, most work left first; once pipelines have finished,
    a rollout takes the widest width their devices leave it (the policy replans then; devices
    the plan left free stay free)."""
    cap = n * slots  # engine slots of the pool
    _start_ahead(ps, cap)
    # who may start does not depend on who starts first: find them before sorting
    may = [p for p in ps if p.roll_left is None and p.rolled < p.spec.steps
           and p.trained >= p.rolled - p.spec.staleness]
    if not may:
        return
    held = _held(ps)
    planned = sum(p.spec.width for p in ps if p.trained < p.spec.steps)
    room = min(cap, sum(p.spec.width for p in ps))
    for p in sorted(may, key=lambda x: -_work_left(x)) if len(may) > 1 else may:
        s = p.spec
        width, gen = s.width, s.gen_s
        fits = room - planned + s.width  # the widest it may take (wider is ascending)
        for w in s.wider:
            if w > fits or s.gen_at is None:
                break
            g = s.gen_at(w)
            if g < gen:
                width, gen = w, g
        if held + width > cap and held > 0:
            continue
        p.roll_left, p.roll_width = gen, width
        held += width


def _held(ps: list[_Pipe]) -> int:
    """Devices the running rollouts hold (each pipeline's running one and its next one)."""
    return sum(p.roll_width for p in ps if p.roll_left is not None) + sum(
        p.ahead_width for p in ps if p.ahead_left is not None)


def _start_ahead(ps: list[_Pipe], cap: int) -> None:
    """An async pipeline's next rollout beside its running one, at its planned width, where
    its weights would be within the staleness bound and engine slots (``cap``) are free (the
    policy starts it so: an async pipeline's next rollout fills free devices)."""
    held: int | None = None  # counted only when some pipeline may start one (a hot loop)
    for p in ps:
        s = p.spec
        nxt = p.rolled + 1 + p.early  # the index of the rollout it would start
        if p.roll_left is None or p.ahead_left is not None or s.staleness < 1 or \
                nxt >= s.steps or p.trained < nxt - s.staleness:
            continue
        held = _held(ps) if held is None else held
        if held + s.width > cap:
            continue
        p.ahead_left, p.ahead_width = s.gen_s, s.width
        held += s.width


def _start_training(ps: list[_Pipe], train: _Train) -> None:
    if train.holder is not None:
        return
    ready = [p for p in ps if p.waiting and p.sync_left is None]
    if ready:
        p = max(ready, key=_work_left)
        p.waiting -= 1
        train.holder, train.phase, train.left = p, "move_in", p.spec.move_s / 2


def _works(ps: list[_Pipe], train: _Train, n: int, rates: Rates) -> list[Work]:
    """Everything in progress, with its rate."""
    rolling = [p for p in ps if p.roll_left is not None or p.ahead_left is not None]
    engines = _held(ps)
    held = min(n, engines)
    # the share of the engines that have a second one on their devices (fluid: the doubly
    # held devices spread over every rollout)
    doubled = min(1.0, 2.0 * (engines - n) / engines) if engines > n else 0.0
    passing = train.holder is not None and train.phase == "pass"
    free = (n - held) / n
    shared = bool(passing and rolling and free < rates.compute_shared)
    compute, decode = rates.compute_shared, rates.decode_shared if shared else 1.0
    if shared and doubled and rates.compute_shared2 is not None:
        # a data-parallel pass runs at its slowest device's rate: one beside two engines
        compute = rates.compute_shared2
        decode = rates.decode_shared2 if rates.decode_shared2 is not None else decode
    out: list[Work] = []
    for p in ps:
        rate = decode * (1.0 - doubled * (1.0 - p.spec.co_rate)) if doubled else decode
        # the next rollout before the running one: it is advanced first, so that the running
        # one, when it ends, hands over the next one's time left after this interval
        if p.ahead_left is not None:
            out.append(("ahead", p, p.ahead_left, rate))
        if p.roll_left is not None:
            out.append(("roll", p, p.roll_left, rate))
        if p.reward_left is not None:
            out.append((Stage.REWARD, p, p.reward_left, 1.0))
        if p.sync_left is not None:
            out.append(("sync", p, p.sync_left, 1.0))
    if train.holder is not None:
        rate = 1.0
        if passing and rolling:
            rate = compute if shared else free
        out.append(("train", train.holder, train.left, max(rate, 1e-6)))
    return out


def _advance(kind: str, p: _Pipe, train: _Train, left: float, t: float) -> None:
    done = left <= 1e-9
    if kind == "roll":
        p.roll_left = None if done else left
        if done:
            finished, p.early = 1 + p.early, 0
            p.rolled += finished
            p.rewards_queued += finished
            if p.ahead_left is not None:  # the next rollout is now the oldest running
                p.roll_left, p.roll_width, p.ahead_left = p.ahead_left, p.ahead_width, None
            if p.reward_left is None:
                p.rewards_queued -= 1
                p.reward_left = p.spec.reward_s
    elif kind == "ahead":
        p.ahead_left = None if done else left
        p.early += done  # finished before the older one: counted when that one finishes
    elif kind == Stage.REWARD:
        p.reward_left = None if done else left
        p.waiting += done
        if done and p.rewards_queued:
            p.rewards_queued -= 1
            p.reward_left = p.spec.reward_s
    elif kind == "sync":
        p.sync_left = None if done else left
        if done:
            p.trained += 1
            if p.trained >= p.spec.steps:
                p.finish = t
    elif not done:
        train.left = left
    elif train.phase == "move_in":
        train.phase, train.left = "pass", p.spec.train_s
    elif train.phase == "pass":
        train.phase, train.left = "move_out", p.spec.move_s / 2
        p.sync_left = p.spec.sync_s
    else:
        train.holder, train.phase, train.left = None, "", 0.0
