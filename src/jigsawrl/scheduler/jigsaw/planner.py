"""Rollout widths by critical path (DESIGN.md §2.7, issue 11 item 2).

Each rollout's width — devices, in whole TP groups — is chosen from its predicted latency on each
width (:class:`~.widths.WidthTimer`), decoupled from training (pooled over every device): the
pipeline on the critical path gets the width it needs and the others fill around it, instead of
each rollout taking a fair share of the pool. A plan is scored by :func:`~.plan_forecast.
forecast_plan` over every pipeline's remaining steps (how far the predicted step latencies
exceed the pipelines' bounds, :mod:`.latency`; the makespan; the sum of finish times), and
searched by a min-max greedy: from the narrowest plan and from the fair plan (and, in a replan,
from the plan in force: a third start the background work can afford), the pipeline that
finishes last (or is most over its latency bound) grows to its next width while the widths fit
in the pool and the forecast improves; then the last one grows by taking a width step from the
one with the most slack, while that improves. The fair plan is always a candidate, so the plan is never predicted
worse than the fair cap it replaces.

Replanning: when the pipelines still running change, and when a pipeline's prediction moves (its
history grew) by more than ``DRIFT`` at its planned width. Each measured rollout is also
compared with its prediction at the width it started on (``errors``: the prediction error per
pipeline, in the policy's report). A drift tolerance widened to a pipeline's recent error (a
move within its usual error taken for noise) was tried and not kept: −7% to +8% by workload,
a loss on the 128-GPU bench (docs/BENCHMARKS.md). A replan (and the drift check, a
rollout replay) runs off the decision path (:mod:`.background`): a rollout start that needs it
waits, and the decision after the work has run starts it; only the first plan is made in the
decision. The forecast covers at most
``HORIZON`` steps of the longest pipeline, the others in proportion, and scales the makespan back
(a 20-step run costs what a 6-step one does).

Not planned (said here, as DESIGN.md asks): with ``max_colocated`` > 1 (rollouts share devices)
and under the memory-tight plan (no device is shared; each rollout takes the whole pool) the
widths stay what they were; the plan is still forecast (a pass then waits for devices whose
engines finished; with two engines per device the forecast has two engine slots per device and
each rollout runs at its co-run rate while they are shared, :mod:`.corun`), so that
:mod:`.fallback` and the first decision's co-location search can compare it.
``plan_widths=False`` keeps the fair cap (the ablation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from jigsawrl.scheduler.base import PipelineView, RunningTask, View
from jigsawrl.scheduler.jigsaw.background import Background
from jigsawrl.scheduler.jigsaw.corun import corun_rate
from jigsawrl.scheduler.jigsaw.latency import LatencyBounds
from jigsawrl.scheduler.jigsaw.params import JigsawParams
from jigsawrl.scheduler.jigsaw.plan_forecast import PlanPipe, PlanResult, Rates, forecast_plan
from jigsawrl.scheduler.jigsaw.residency import Residency
from jigsawrl.scheduler.jigsaw.shares import compute_split
from jigsawrl.scheduler.jigsaw.widths import WidthTimer, width_ladder
from jigsawrl.stages import ROLLOUT_BANDS, VERL_TIMING, Stage

# the rollout's measured seconds in a step's timings (verl's name)
GEN_TIMING = next(k for k, v in VERL_TIMING.items() if v == ROLLOUT_BANDS)

DRIFT = 0.15  # relative change of a planned rollout's predicted time that triggers a replan
HORIZON = 6  # steps of the longest pipeline the plan forecast covers
# A searched plan replaces the fair one only when forecast this much sooner: the forecast errs
# by several percent (fallback.py), and a small predicted gain from uneven widths among like
# pipelines was measured a loss (configs/scale-64.yaml: 856 s planned vs 786 s fair).
PLAN_MARGIN = 0.03


@dataclass(frozen=True, slots=True)
class WidthPlan:
    """The chosen widths and what the forecast predicts of them."""

    widths: dict[str, int]  # pipeline -> devices of its rollout
    result: PlanResult  # makespan scaled back to all remaining steps
    live: frozenset[str]
    sources: dict[str, int]  # pipeline -> the prediction source it was planned with
    gen_s: dict[str, float]  # pipeline -> predicted rollout seconds at its width


class WidthPlanner:
    """Plans and replans the rollout widths (module docstring).

    Args:
        params: the policy's parameters.
        residency: the memory plan (KV per engine, tight or not).
        background: where replans go off the decision path (None, or not ``active``: they
            are made at once, in the call that finds them due).
    """

    def __init__(self, params: JigsawParams, residency: Residency,
                 background: Background | None = None) -> None:
        self.params = params
        self.residency = residency
        self.background = background
        self.timer: WidthTimer | None = None
        self.plan: WidthPlan | None = None
        self.replans = 0
        self.bounds: LatencyBounds | None = None  # the policy sets them at its first decision
        self._check: set[str] = set()  # pipelines whose prediction moved, to check for drift
        # prediction error per pipeline: each rollout's predicted seconds at the width it
        # started on ÷ its measured seconds − 1, in step order (:meth:`observe`)
        self.errors: dict[str, list[float]] = {}
        self._expected: dict[str, dict[int, float]] = {}  # pipeline -> step -> predicted s
        # a replan (or drift check) is left to the background and not run yet: the policy
        # holds back what would take devices before the waiting rollouts (they went first)
        self.due = False

    # ------------------------------------------------------------------ reading
    def width(self, view: View, pv: PipelineView) -> int | None:
        """Devices ``pv``'s next rollout takes (None: a replan or drift check is due and runs
        in the background first; the rollout waits for it)."""
        plan = self.current(view, pv)
        if plan is None:
            return None
        return plan.widths.get(pv.name, fair_width(view, pv.spec.rollout_tp, 1))

    def current(self, view: View, pv: PipelineView | None = None) -> WidthPlan | None:
        """The plan in force, or None while a replan (or ``pv``'s drift check) is due: it is
        left to the background (module docstring), or made now without one."""
        live = frozenset(p.name for p in view.pipelines if not p.finished)
        if self.plan is None:  # the first plan: nothing runs yet that could go on meanwhile
            self.plan = self.make_plan(view)
            self.replans += 1
            return self.plan
        moved = pv is not None and self.timer is not None and \
            self.plan.sources.get(pv.name) != self.timer.source(pv)
        if self.plan.live == live and not moved and not self.due:
            return self.plan
        if pv is not None and moved:
            self._check.add(pv.name)
        if self.background is None or not self.defers:
            self._refresh(view)
            return self.plan
        self.background.want("replan", lambda: self._refresh(view))
        self.due = True
        return None

    @property
    def defers(self) -> bool:
        """Whether work goes to the background (a driver takes it) rather than being done in
        the call that needs it."""
        return self.background is not None and self.background.active

    def started(self, view: View, pv: PipelineView, step: int, width: int) -> None:
        """Remember what ``pv``'s rollout of ``step``, starting on ``width`` devices, is
        predicted to take (its time at that width if worked out, else the plan's)."""
        if self.timer is None or self.plan is None:
            return
        got = self.timer.cached_near(view, pv, width)
        planned = self.plan.gen_s.get(pv.name)
        if got is None and planned is None:
            return
        self._expected.setdefault(pv.name, {})[step] = got if got is not None else planned

    def observe(self, view: View) -> None:
        """Track each pipeline's prediction error from the rollouts measured since the last
        call (cheap: every decision calls it, and only pipelines with a rollout predicted and
        not yet measured are looked at; a finished pipeline's are dropped)."""
        if not self._expected:
            return
        for pv in view.pipelines:
            pending = self._expected.get(pv.name)
            if not pending:
                continue
            for obs in pv.history:
                expected = pending.pop(obs.step, None)
                measured = obs.stage_durations_s.get(GEN_TIMING)
                if expected is not None and measured:
                    self.errors.setdefault(pv.name, []).append(expected / measured - 1.0)
            if pv.finished or not pending:
                del self._expected[pv.name]

    def _refresh(self, view: View) -> None:
        """Replan if the pipelines running changed or a moved prediction drifted (the drift
        check accepts a prediction that moved little)."""
        assert self.plan is not None
        self.due = False
        checks, self._check = self._check, set()
        now = {p.name: p for p in view.pipelines if not p.finished}
        if self.plan.live != frozenset(now) or any(
                self._drifted(view, now[name]) for name in checks if name in now):
            self.plan = self.make_plan(view)
            self.replans += 1

    def _drifted(self, view: View, pv: PipelineView) -> bool:
        assert self.plan is not None and self.timer is not None
        src = self.timer.source(pv)
        if self.plan.sources.get(pv.name) == src:
            return False
        planned = self.plan.gen_s.get(pv.name, 0.0)
        now = self.timer.gen_s(view, pv, self.plan.widths.get(pv.name, pv.spec.rollout_tp))
        if planned > 0 and abs(now / planned - 1.0) <= DRIFT:
            self.plan.sources[pv.name] = src  # close enough: keep the plan
            return False
        return True

    # ------------------------------------------------------------------ planning
    def make_plan(self, view: View) -> WidthPlan:
        """Search the widths (module docstring) for the pipelines still running."""
        if self.timer is None:
            self.timer = WidthTimer(self.params.history_window, self.residency.kv_mem,
                                    self.params.tail_requests if self.params.tail_tp else 0)
        live = [p for p in view.pipelines if not p.finished]
        n = len(view.devices)
        scale = self._scale(live)
        rates = self._rates(view, live)

        # Within one plan search the view is fixed: a pipeline at a width, and a plan, are
        # worked out once however often the search comes back to them.
        pipes: dict[tuple[str, int], PlanPipe] = {}
        scores: dict[tuple[int, ...], PlanResult] = {}

        def pipe(p: PipelineView, width: int) -> PlanPipe:
            got = pipes.get((p.name, width))
            if got is None:
                got = pipes[(p.name, width)] = self._pipe(view, p, width, scale)
            return got

        def score(widths: dict[str, int]) -> PlanResult:
            key = tuple(widths[p.name] for p in live)
            got = scores.get(key)
            if got is None:
                res = forecast_plan([pipe(p, widths[p.name]) for p in live], n, rates,
                                    slots=self.params.max_colocated)
                finish = {k: v / scale for k, v in res.finish_s.items()}
                got = scores[key] = self._bounded(view, PlanResult(res.makespan_s / scale, finish))
            return got

        ladders = {p.name: width_ladder(n, p.spec.rollout_tp) for p in live}
        fixed = self.fixed_widths(view, live)
        best_w, best = fixed, score(fixed)
        if self.params.plan_widths and not self.residency.tight and \
                self.params.max_colocated == 1:
            narrow = {p.name: ladders[p.name][0] for p in live}
            starts = [narrow, fixed]
            if self.plan is not None:  # a replan: from the plan in force too
                warm = {p.name: self.plan.widths.get(p.name, ladders[p.name][0]) for p in live}
                if sum(warm.values()) <= n and warm not in starts:
                    starts.append(warm)
            for start in starts:
                widths, res = _grow(start, score, ladders, n)
                widths, res = _trade(widths, res, score, ladders, n)
                if res.key() < best.key() and (
                        res.makespan_s < best.makespan_s * (1.0 - PLAN_MARGIN)
                        or best_w is not fixed or res.excess < best.excess):
                    best_w, best = widths, res
        return WidthPlan(best_w, best, frozenset(p.name for p in live),
                         {p.name: self.timer.source(p) for p in live},
                         {p.name: self.timer.gen_s(view, p, best_w[p.name]) for p in live})

    def _bounded(self, view: View, res: PlanResult) -> PlanResult:
        """``res`` with its latency bounds' excess (:mod:`.latency`; itself without bounds):
        finish times are counted from now, the bounds' from time 0."""
        if self.bounds is None:
            return res
        finish = {k: view.now_s + v for k, v in res.finish_s.items()}
        return replace(res, over=self.bounds.over(finish))

    def fixed_widths(self, view: View, live: list[PipelineView]) -> dict[str, int]:
        """The widths without planning: the whole pool under the tight plan, else the fair
        cap (also the search's guard: the plan is never predicted worse than these)."""
        n = len(view.devices)
        if self.residency.tight:
            return {p.name: n - n % p.spec.rollout_tp for p in live}
        return {p.name: fair_width(view, p.spec.rollout_tp, self.params.max_colocated)
                for p in live}

    def _scale(self, live: list[PipelineView]) -> float:
        """Steps forecast ÷ steps left of the longest pipeline (≤ 1)."""
        most = max((p.spec.steps - p.steps_completed for p in live), default=1)
        return min(1.0, HORIZON / max(1, most))

    def _rates(self, view: View, live: list[PipelineView]) -> Rates:
        pv = max(live, key=lambda p: p.model.num_params) if live else view.pipelines[0]
        if self.residency.tight:  # nothing shares a device: a pass waits for free devices
            return Rates(0.0, 1.0)
        cost = view.cost

        def beside(engines: int) -> tuple[float, float]:
            c, m = compute_split(view, pv, engines, self.params.dynamic_shares)
            return (1.0 / cost.slowdown(Stage.ACTOR_UPDATE, c, model=pv.model),
                    1.0 / cost.slowdown(Stage.DECODE_SMALL, m))
        one = beside(1)
        if self.params.max_colocated < 2:
            return Rates(*one)
        return Rates(*one, *beside(2))

    def _pipe(self, view: View, pv: PipelineView, width: int, scale: float) -> PlanPipe:
        """``pv`` as the forecast sees it at ``width``, its current step where it is now."""
        assert self.timer is not None
        timer = self.timer
        reward, move, sync = timer.host_s(view, pv)
        gen = timer.gen_s(view, pv, width)
        wider = tuple(w for w in width_ladder(len(view.devices), pv.spec.rollout_tp) if w > width)
        step = pv.steps_completed
        rolling = [t for t in pv.running if t.step == step and t.stage == Stage.ROLLOUT]
        done = pv.done.get(step, frozenset())
        ahead = [t for t in pv.running if t.step == step + 1 and t.stage == Stage.ROLLOUT]

        def left_s(t: RunningTask) -> float:
            return max(0.0, timer.gen_s_near(view, pv, len(t.devices)) - (view.now_s - t.start_s))
        left = pv.spec.steps - step
        co_rate = self._co_rate(view, pv, width) if self.params.max_colocated > 1 else 1.0
        return PlanPipe(pv.name, max(1, math.ceil(left * scale)), gen, width, wider,
                        lambda w: timer.gen_s(view, pv, w), reward,
                        timer.train_s(view, pv), move, sync,
                        pv.spec.max_staleness if pv.spec.mode == "async" else 0,
                        left_s(rolling[0]) if rolling else None,
                        not rolling and Stage.ROLLOUT in done,
                        left_s(ahead[0]) if ahead else None, co_rate)

    def _co_rate(self, view: View, pv: PipelineView, width: int) -> float:
        """``pv``'s rollout rate beside a twin of itself or beside the heaviest other pipeline
        still running (the one a twin slows most), whichever is slower (:mod:`.corun`): the
        forecast does not know which pipeline it will share with, and the twin's rate alone
        let a small model's steps run 1.41x solo against a bound of 1.34 on the paper's hetero
        pair (docs/BENCHMARKS.md). Against the heaviest only, not every partner: at 512 GPUs
        × 16 pipelines every pair cost ~13 s of replays."""
        ranks = max(1, width // pv.spec.rollout_tp)
        kv = self.residency.kv_mem
        twin = corun_rate(view, pv, ranks, kv)
        others = [p for p in view.pipelines if not p.finished and p.name != pv.name]
        if not others:
            return twin
        heavy = min(others, key=lambda q: (corun_rate(view, q, ranks, kv), q.name))
        return min(twin, corun_rate(view, pv, ranks, kv, heavy))


def fair_width(view: View, tp: int, colocated: int) -> int:
    """The fair cap the planner replaces: an equal share of the pool's engine slots."""
    live = sum(1 for p in view.pipelines if not p.finished)
    groups = len(view.devices) // tp
    return tp * min(groups, max(1, groups * colocated // max(1, live)))


Score = Callable[[dict[str, int]], PlanResult]


def _critical(res: PlanResult, p: str) -> tuple[float, float]:
    """How much ``p`` needs devices: the most over its latency bound first, then the last to
    finish (the min-max search's critical pipeline)."""
    return (res.over.get(p, 0.0), res.finish_s.get(p, 0.0))


def _next(ladder: list[int], w: int, up: bool) -> int | None:
    if up:
        return next((x for x in ladder if x > w), None)
    return next((x for x in reversed(ladder) if x < w), None)


def _grow(start: dict[str, int], score: Score, ladders: dict[str, list[int]],
          n: int) -> tuple[dict[str, int], PlanResult]:
    """Min-max greedy: the pipeline finishing last takes its next width while it fits and the
    forecast improves."""
    widths = dict(start)
    res = score(widths)
    stuck: set[str] = set()
    while len(stuck) < len(widths):
        crit = max((p for p in widths if p not in stuck), key=lambda p: _critical(res, p))
        up = _next(ladders[crit], widths[crit], True)
        if up is None or sum(widths.values()) - widths[crit] + up > n:
            stuck.add(crit)
            continue
        trial = {**widths, crit: up}
        got = score(trial)
        if got.key() < res.key():
            widths, res = trial, got
            stuck.clear()
        else:
            stuck.add(crit)
    return widths, res


def _trade(widths: dict[str, int], res: PlanResult, score: Score,
           ladders: dict[str, list[int]], n: int) -> tuple[dict[str, int], PlanResult]:
    """The pipeline finishing last grows one width step, the one with the most slack shrinking
    one, while the forecast improves (at most one round per pipeline)."""
    for _ in range(len(widths)):
        order = sorted(widths, key=lambda p: _critical(res, p))
        crit, improved = order[-1], False
        up = _next(ladders[crit], widths[crit], True)
        if up is None:
            break
        for donor in order[:-1]:
            down = _next(ladders[donor], widths[donor], False)
            if down is None:
                continue
            trial = {**widths, crit: up, donor: down}
            if sum(trial.values()) > n:
                continue
            got = score(trial)
            if got.key() < res.key():
                widths, res, improved = trial, got, True
                break
        if not improved:
            break
    return widths, res
