"""``jigsaw`` and ``greedy`` (jigsaw at look-ahead depth 0): the policy that runs the planner's
pieces at every decision (the package docstring says how it decides)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from jigsawrl.config import PipelineSpec
from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import (
    Action,
    Decision,
    PipelineView,
    Policy,
    PolicyBase,
    RunningTask,
    StartStage,
    View,
    register_policy,
)
from jigsawrl.scheduler.jigsaw.background import Background
from jigsawrl.scheduler.jigsaw.board import Board, BoardCache
from jigsawrl.scheduler.jigsaw.fallback import MARGIN, best_verl
from jigsawrl.scheduler.jigsaw.latency import LatencyBounds
from jigsawrl.scheduler.jigsaw.lookahead import LookAhead
from jigsawrl.scheduler.jigsaw.params import JigsawParams
from jigsawrl.scheduler.jigsaw.placement import Placement
from jigsawrl.scheduler.jigsaw.planner import WidthPlanner
from jigsawrl.scheduler.jigsaw.prediction import StepPredictions
from jigsawrl.scheduler.jigsaw.regroup import placed_replay
from jigsawrl.scheduler.jigsaw.residency import Residency
from jigsawrl.scheduler.jigsaw.shares import ShareAssigner
from jigsawrl.scheduler.jigsaw.spread import TailSpread
from jigsawrl.scheduler.jigsaw.tail import TailMigration
from jigsawrl.scheduler.jigsaw.tp_search import TPChoice, search_tp
from jigsawrl.scheduler.rollout_tp import label, retp_view
from jigsawrl.stages import HOST_STAGES, MODEL_PASSES, Stage

# Two rollout engines per device must be forecast this much sooner than one to be run. It was
# 5%: async-aime-search, forecast 2.5-3.1% sooner with two, measured 0.99x — but async groups
# are no longer co-located at all, and among the groups that may be, every forecast gain of 1%
# or more was a measured gain (sync-search-search, forecast 1.1% sooner: +2.0 to +5.1% at seeds
# 0-3; bench decide's 128 x 16: +14 to +22%; nothing else changed; docs/BENCHMARKS.md, "The
# co-location margin"). The forecast's co-run rates are a twin's or the heaviest partner's,
# not the actual partner's (:mod:`.corun`), hence a margin at all.
COLOCATE_MARGIN = 0.01
# ... or forecast no more than TIE later (within the forecast's error) with the pipelines'
# finish times summed LATENCY_GAIN smaller: on the paper's GSM8K + MATH and hetero pairs and
# two-gsm8k, forecast 0.0-0.5% later and 19-28% sooner summed, two engines measured -0.7% to
# +0.7% tokens/s at a mean step latency 1.11-1.88x -> 0.84-1.02x solo (docs/BENCHMARKS.md).
TIE = 0.01
LATENCY_GAIN = 0.10


@dataclass(frozen=True, slots=True)
class PlanChoice:
    """What jigsaw runs (``jigsaw``, or the verl placement it fell back to) and the predicted
    makespans it chose between (seconds; inf: jigsaw's memory plan does not fit)."""

    runs: str
    jigsaw_s: float
    verl: str | None
    verl_s: float | None
    # how far each plan's predicted step latencies exceed the pipelines' bounds (0: within
    # them, or none set; :mod:`.latency`): ranked before the makespans
    jigsaw_excess: float = 0.0
    verl_excess: float | None = None


@register_policy("jigsaw")
class JigsawPolicy(PolicyBase):
    """JigsawRL: multiplexing, dynamic shares, tail migration, look-ahead (see the package
    docstring; the parameters are :class:`JigsawParams`'s).

    Raises:
        ConfigError: parameters out of range (at construction), or a pool too small for the
            memory plan (at the first decision).
    """

    wants_rank_progress = True

    def __init__(self, name: str = "jigsaw", **params: Any) -> None:
        self.params = JigsawParams(**params)  # every parameter, its default and its check
        self.name = name
        self.tp: TPChoice | None = None  # the rollout TPs searched at the first decision
        # the co-location search's predictions: engines per device -> (latency bounds' excess,
        # makespan, the pipelines' finishes summed; None where that plan was a verl fallback)
        self.colocation: dict[int, tuple[float, float, float | None]] = {}
        # the finishes summed of each own plan the searches forecast, by (TPs' label, engines)
        self._finish_sums: dict[tuple[str, int], float] = {}
        self._specs: dict[str, PipelineSpec] = {}  # pipeline -> its spec at those TPs
        self.choice: PlanChoice | None = None  # what the first decision chose, and why
        self._delegate: Policy | None = None  # the verl placement run instead, if any
        self._assemble()

    def _assemble(self) -> None:
        """The planner's pieces for ``self.params`` (again when the first decision changes
        them: nothing has run yet)."""
        history_window = self.params.history_window
        self.residency = Residency(self.params)
        self.predictions = StepPredictions(history_window, lambda: self.residency.kv_mem)
        self.jobs = Background()  # replans and replays left off the decision path
        self.planner = WidthPlanner(self.params, self.residency, self.jobs)
        self.placement = Placement(self.params, self.residency, self.predictions, self.planner)
        self.lookahead = LookAhead(self.params.depth, self.predictions, self.params.short_first)
        self.tail = TailMigration(self.params, self.residency, self.predictions)
        self.spread = TailSpread(self.params, self.residency, self.planner, self.predictions)
        self.shares = ShareAssigner(self.params.dynamic_shares, self.predictions.urgency)
        self._boards = BoardCache()
        self._deferred = False  # the last decision's look-ahead held back a ready pass
        self._acted = False  # the last decision changed the pool

    def report(self) -> dict[str, Any]:
        """What ran (jigsaw's plan or the verl placement it fell back to) and the predicted
        makespans it chose between; what the look-ahead did (issue 11 item 3)."""
        out: dict[str, Any] = {"lookahead": asdict(self.lookahead.stats),
                               "regroups": self.tail.regroup.count,
                               "spreads": self.spread.count, "replans": self.planner.replans,
                               "background_work": self.jobs.handed}
        if self.planner.errors:  # predicted ÷ measured rollout seconds − 1, per pipeline
            out["prediction_error"] = {name: {
                "rollouts": len(errs), "mean": sum(errs) / len(errs),
                "mean_abs": sum(abs(e) for e in errs) / len(errs)}
                for name, errs in self.planner.errors.items()}
        if self.choice is not None:
            out["plan"] = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                           for k, v in asdict(self.choice).items()}
        if self.colocation:  # engines per device -> its predicted makespan (inf: none fits)
            out["colocation"] = {
                "runs": self.params.max_colocated, "predicted_s": {
                    str(k): (None if not math.isfinite(s) else s)
                    for k, (_, s, _) in self.colocation.items()},
                # the pipelines' forecast finishes summed (None: that plan was verl's)
                "finish_sum_s": {str(k): f for k, (_, _, f) in self.colocation.items()}}
        if self.tp is not None:
            out["rollout_tp"] = {"runs": self.tp.tps or "configured", "predicted_s": {
                k: (None if not math.isfinite(v) else v) for k, v in self.tp.predicted_s.items()}}
            if self.tp.excess:
                out["rollout_tp"]["latency_excess"] = {
                    k: (None if not math.isfinite(v) else v) for k, v in self.tp.excess.items()}
        return out

    def decide(self, view: View) -> Decision:
        if self.choice is None:  # the bounds are read at the configured rollout TPs
            self.planner.bounds = LatencyBounds.of(view)
        if self.choice is None:
            self._search(view)
        view = self._retp(view)
        if self.choice is None:
            self.choice = self._choose_plan(view)
        if self._delegate is not None:
            return self._delegate_decide(view)
        self.planner.observe(view)
        board = self._boards.board(view)
        self.predictions.ensure_current(view)  # every urgency below reads the same predictions
        urgent = self.predictions.by_urgency(view)  # the train-state slot by urgency
        first = {pv.name for pv in urgent}
        order = urgent + [pv for pv in view.pipelines if pv.name not in first]
        actions = self.residency.memory_moves(view, board, order)
        if self.params.migration:
            actions += self.tail.migrate(view, board)
        starts = self._choose_starts(view, board)
        # a rollout waiting for its replan (background work) goes first, as it would have had
        # the replan run in this decision: no pass or spread takes devices before it
        spreads = [] if self.planner.due else self.spread.plan(view, board, urgent)
        actions += self.shares.share_actions(view, board, starts, spreads)
        self._acted = bool(actions)
        return Decision(tuple(actions))

    def background(self) -> Callable[[], None] | None:
        """The replans and replays the last decision left off its path (:mod:`.background`)."""
        return None if self._delegate is not None else self.jobs.take()

    def _delegate_decide(self, view: View) -> Decision:
        """The verl placement's decision, with jigsaw's tail regroups of its rollouts."""
        d = self._delegate.decide(view)
        kv = getattr(self._delegate, "kv_mem_bytes", None)
        if kv is None:
            return d
        regroups = self.tail.regroup_placed(view, lambda pv, t: kv(view, pv, t.devices))
        return Decision(d.actions + tuple(regroups)) if regroups else d

    def wakes_on_progress(self, task: RunningTask, unfinished: Sequence[int]) -> bool:
        """Only the tail migration reads per-rank counts: a report wakes jigsaw when the
        migration could act on the rollout now (a verl placement it fell back to never reads
        them). Three parts of a decision move with the clock instead, and while one is in play
        every report wakes it, as before: a look-ahead that deferred a ready pass (its forecast
        may call the pass due at any report), dynamic shares that weighed urgencies (lateness
        grows), and a decision that changed the pool (the next one settles what it started:
        a new rollout's ranks get their shares)."""
        if self._delegate is not None:
            return (self._delegate.wants_rank_progress and self._delegate.wakes_on_progress(
                task, unfinished)) or self.tail.placed_wakes(task, unfinished)
        return self.choice is None or self._acted or self._deferred or self.shares.weighed or (
            self.params.migration and self.tail.wakes(task, unfinished))

    def _retp(self, view: View) -> View:
        """The view with the rollout TPs the search chose (the view itself: the config's)."""
        if self.tp is None or not self.tp.tps:
            return view
        return retp_view(view, self.tp.tps, self._specs)

    def _search(self, view: View) -> None:
        """The first decision's searches, by prediction only: the rollout TPs (where the
        executor forms TP groups of any width) and, for each, one or two rollout engines per
        device — two where a fresh jigsaw predicts that sooner than the best with one by
        :data:`COLOCATE_MARGIN` (within the latency bounds first); the rest of the run then
        plans with two (:class:`JigsawParams`' ``colocate``). Not for groups with an async
        pipeline: forced there, two engines measured 0.92-0.99x on all three async groups, and
        the plan forecast, late by up to 8% on async groups, predicted async-aime-search 10%
        sooner with two (docs/BENCHMARKS.md). Nor where a pipeline sets a latency bound: on
        the paper's bounded hetero pair the co-located plan, forecast within 1.34x, ran the
        small job at 1.35-1.41x its solo step (the co-run rate is a twin's or the heaviest
        partner's at equal shares; the policy's urgency-weighted shares and the passes beside
        two engines slow a small job more)."""
        live = [p for p in view.pipelines if not p.finished]
        colocate = self.params.colocate and self.params.max_colocated == 1 and \
            view.can_regroup and len(live) > 1 and self.planner.bounds is None and \
            all(p.spec.mode == "sync" for p in live)
        two_tp: TPChoice | None = None
        if self.params.tp_search and view.can_regroup:
            self.tp = search_tp(view, self._predict_plan)
            if colocate:
                # its own plan only: the verl placements it could fall back to are the same
                # with one engine per device or two, and were weighed in ``one`` already
                two_tp = search_tp(view, lambda v: self._predict_plan(v, max_colocated=2,
                                                                      fallback=False))
                self.colocation = {1: self._with_sum(view, self.tp.tps, 1, self.tp.chosen),
                                   2: self._with_sum(view, two_tp.tps, 2, two_tp.chosen)}
        elif colocate:
            self.colocation = {
                1: self._with_sum(view, {}, 1, self._predict_plan(view)),
                2: self._with_sum(view, {}, 2, self._predict_plan(view, max_colocated=2,
                                                                  fallback=False))}
        if self.colocation and self._co_wins():
            if two_tp is not None:
                self.tp = two_tp
            bounds = self.planner.bounds
            self.params = replace(self.params, max_colocated=2)
            self._assemble()
            self.planner.bounds = bounds

    def _with_sum(self, view: View, tps: dict[str, int], engines: int,
                  predicted: tuple[float, float]) -> tuple[float, float, float | None]:
        """``predicted`` (excess, makespan) with the finishes summed of the own plan forecast
        at ``tps`` (the config's where empty) and ``engines`` (None: it fell back to verl)."""
        return (*predicted, self._finish_sums.get((_tp_label(view, tps), engines)))

    def _co_wins(self) -> bool:
        """Whether two engines per device beat one (``colocation``'s predictions): sooner by
        :data:`COLOCATE_MARGIN` (within the latency bounds first), or — both jigsaw's own plans
        — no more than :data:`TIE` later with the pipelines' finish times summed
        :data:`LATENCY_GAIN` smaller (their steps shorter on average: the paper's pairs of a
        short and a long job take turns on the node with one engine, and the short job's
        steps wait for the long one's rollouts)."""
        (x1, s1, sum1), (x2, s2, sum2) = self.colocation[1], self.colocation[2]
        if _sooner((x2, s2), (x1, s1)):
            return True
        return (sum1 is not None and sum2 is not None and x2 == x1
                and s2 <= s1 * (1.0 + TIE) and sum2 <= sum1 * (1.0 - LATENCY_GAIN))

    def _predict_plan(self, view: View, max_colocated: int | None = None,
                      fallback: bool | None = None) -> tuple[float, float]:
        """What a fresh jigsaw of these parameters (``max_colocated`` engines per device and
        ``fallback`` if given) and this policy's latency bounds predicts for what it would run
        on ``view`` (its plan or the verl placement it falls back to): the latency bounds'
        excess and the makespan (inf, inf: nothing fits)."""
        params = asdict(self.params) | {"tp_search": False}
        if max_colocated is not None:
            params["max_colocated"] = max_colocated
        if fallback is not None:
            params["fallback"] = fallback
        fresh = JigsawPolicy(**params)
        fresh.planner.bounds = self.planner.bounds
        try:
            ch = fresh._choose_plan(view)
        except ConfigError:
            return math.inf, math.inf
        if ch.runs == "jigsaw":
            plan = fresh.planner.plan
            if plan is not None:  # its pipelines' finishes, for the latency tie-break
                self._finish_sums[(_tp_label(view, {}), fresh.params.max_colocated)] = sum(
                    plan.result.finish_s.values())
            return ch.jigsaw_excess, ch.jigsaw_s
        return (ch.verl_excess or 0.0), (ch.verl_s or math.inf)

    def _choose_plan(self, view: View) -> PlanChoice:
        """jigsaw's width plan, or the verl placement predicted to finish sooner (module
        :mod:`.fallback`); both predicted from the view and the belief cost model only.

        Raises:
            ConfigError: neither jigsaw's memory plan nor any verl placement fits the pool.
        """
        error: ConfigError | None = None
        try:
            self.residency.place(view)
            plan = self.planner.current(view)
            assert plan is not None  # the first plan is made in the decision
            res = plan.result
            ours, excess = res.makespan_s, res.excess
        except ConfigError as exc:  # not even the tight memory plan fits
            error, ours, excess = exc, math.inf, math.inf
        replay = placed_replay(view, self.params.tail_requests) if self.tail.regroups(
            view) else None
        verl = best_verl(view, replay, self.planner.bounds) if self.params.fallback else None
        if verl is not None and (verl.excess < excess or (
                verl.excess == excess and verl.makespan_s <= ours * (1.0 + MARGIN))):
            self._delegate = verl.build()
            return PlanChoice(verl.name, ours, verl.name, verl.makespan_s, excess, verl.excess)
        if error is not None:
            raise error
        return PlanChoice("jigsaw", ours, verl.name if verl else None,
                          verl.makespan_s if verl else None, excess,
                          verl.excess if verl else None)

    def _choose_starts(self, view: View, b: Board) -> list[Action]:
        """Host stages and rollouts that can start, most urgent pipeline first, then at most one
        model pass (one per device at a time), chosen by the look-ahead."""
        ready = [(pv, step, stage) for pv in self.predictions.by_urgency(view)
                 for step, stage in pv.ready()]
        # an async rollout a step ahead of its pipeline's weights goes after every current one
        # (stable sort: urgency order within each); urgency alone gave the urgent pipeline's
        # steps 0 and 1 the whole pool while the other waited (docs/BENCHMARKS.md, "Async:
        # current rollouts before stale ones")
        ready.sort(key=lambda r: r[1] > r[0].steps_completed)
        starts: list[Action] = []
        for pv, step, stage in ready:
            if stage in HOST_STAGES:
                devs = () if stage == Stage.REWARD else tuple(range(len(view.devices)))
                starts.append(StartStage(pv.name, step, stage, devs, share=0.0))
            elif stage == Stage.ROLLOUT:
                start = self.placement.rollout_start(view, b, pv, step)
                if start is not None:
                    starts.append(start)
        passes = [(pv, step, stage) for pv, step, stage in ready
                  if stage in MODEL_PASSES and self.residency.on_device(pv.name)
                  and not self.planner.due]
        choice = self._pick_compute(view, b, passes)
        if choice is not None:
            starts.append(choice)
        return starts

    def _pick_compute(self, view: View, b: Board,
                      ready: list[tuple[PipelineView, int, str]]) -> StartStage | None:
        """The ready pass to start now, on the devices placement gives it, if any."""
        cands = [(pv, step, stage, self.placement.compute_devices(view, b, pv))
                 for pv, step, stage in ready]
        cands = [c for c in cands if c[3]]
        self._deferred = False
        if not cands:
            return None
        best = self.lookahead.choose(view, b, cands)
        self._deferred = best is None
        if best is None:
            return None
        return self.placement.start_compute(view, b, *best)


def _tp_label(view: View, tps: dict[str, int]) -> str:
    """The label of ``view``'s rollout TPs with ``tps`` in place (a TP search's choice; empty:
    the view's own)."""
    return label({p.name: tps.get(p.name, p.spec.rollout_tp) for p in view.pipelines})


def _sooner(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether prediction ``a`` (latency bounds' excess, makespan) beats ``b`` by
    :data:`COLOCATE_MARGIN`: a smaller excess, or the same and a makespan that much sooner."""
    return a[0] < b[0] or a[0] == b[0] and a[1] < b[1] * (1.0 - COLOCATE_MARGIN)


@register_policy("greedy")
def _greedy(**params) -> JigsawPolicy:  # noqa: ANN003
    """jigsaw without look-ahead (depth 0): the ablation of the look-ahead."""
    params.setdefault("name", "greedy")
    return JigsawPolicy(depth=0, **{k: v for k, v in params.items() if k != "depth"})
