"""The ``jigsaw`` policy's look-ahead (DESIGN.md §2.5): which ready model pass to start now, if
any, chosen by forecasting a few events ahead.

The options are: start one of the candidate passes now (on the devices placement chose for it),
or — while a rollout holds devices — start none and let the decodes run alone. Each option is
scored by the fluid forecast of :mod:`.forecast` over the next ``depth`` events, from the
predicted rest of every pipeline's step; the lowest (urgency-weighted completion times) wins —
waiting only when it beats the best pass by :data:`LA_MARGIN`.
At ``depth`` 0 (``greedy``) the first candidate (the most urgent pipeline's) is always taken.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsawrl.scheduler.base import PipelineView, View, stage_sequence
from jigsawrl.scheduler.jigsaw.board import Board
from jigsawrl.scheduler.jigsaw.forecast import FState, FWork, Slow, forecast
from jigsawrl.scheduler.jigsaw.prediction import StepPredictions
from jigsawrl.sim.residency import serial_devices
from jigsawrl.stages import MODEL_PASSES, Stage

# The look-ahead waits (starts no pass) only when the forecast scores waiting this much better
# than the best pass: without the margin its deferrals cost 2.7% on paper/async-aime-search and
# 0.3% on paper/async-gsm8k-math against greedy (seeds 0-1) and 1.8% on configs/two-async.yaml
# seed 2; with it, it ties greedy there (docs/BENCHMARKS.md, "The look-ahead's deferrals").
LA_MARGIN = 0.05

# A ready model pass and the devices it would run on.
Candidate = tuple[PipelineView, int, str, tuple[int, ...]]


def slow_fn(view: View) -> Slow:
    """The belief slowdown as the forecast asks for it (a rollout decodes its tail)."""
    cost = view.cost

    def slow(stage: str, share: float) -> float:
        if stage == Stage.ROLLOUT:
            stage = Stage.DECODE_SMALL
        return cost.slowdown(stage, max(0.05, min(1.0, share)))

    return slow


@dataclass(slots=True)
class LookAheadStats:
    """What the look-ahead did (issue 11 item 3): decisions it was asked, those with two or more
    options (a look-ahead with one option does not choose), those where it chose otherwise than
    ``greedy`` would (the first candidate), and of these how many deferred every pass."""

    decisions: int = 0
    with_choice: int = 0
    differed: int = 0
    deferred: int = 0


class LookAhead:
    """Scores the options of a decision by forecast (module docstring)."""

    def __init__(self, depth: int, predictions: StepPredictions,
                 short_first: float = 0.0) -> None:
        self.depth = depth
        self.predictions = predictions
        self.short_first = short_first
        self.stats = LookAheadStats()

    def choose(self, view: View, b: Board, cands: list[Candidate]) -> Candidate | None:
        """The candidate to start now, or None to start none (``cands`` is not empty)."""
        options: list[Candidate | None] = list(cands)
        if b.any_memory() and not serial_devices(view.cost):
            # waiting only helps if it spares a running decode; not offered where a device runs
            # one call at a time (the Ray executor's CPU workers): the fluid forecast shares a
            # device, the real one takes turns, and its deferrals there cost 6% against greedy
            # (docs/BENCHMARKS.md, "Real tasks' tool waits")
            options.append(None)
        self.stats.decisions += 1
        self.stats.with_choice += len(options) >= 2
        if self.depth == 0:
            return self._shorter_first(view, cands, cands[0])
        names = [c[0].name for c in cands]
        scores = [self._score(view, b, opt, names) for opt in options]
        i = min(range(len(cands)), key=lambda k: scores[k])
        best = options[i]
        if len(options) > len(cands) and scores[-1] < scores[i] * (1.0 - LA_MARGIN):
            best = None  # waiting: only on a clear forecast gain
        if best is not cands[0]:  # greedy (depth 0) takes the first candidate
            self.stats.differed += 1
            self.stats.deferred += best is None
        return best if best is None else self._shorter_first(view, cands, best)

    def _shorter_first(self, view: View, cands: list[Candidate], best: Candidate) -> Candidate:
        """With ``short_first`` > 0, the shortest ready pass wanting one of ``best``'s devices
        whose predicted time is at most that fraction of ``best``'s: it runs first and delays
        ``best`` by that little (``JigsawParams.short_first``); else ``best``."""
        if self.short_first <= 0:
            return best
        limit = self.short_first * self._pass_s(view, best)
        short = [(s, i) for i, c in enumerate(cands) if c is not best and set(c[3]) & set(best[3])
                 and (s := self._pass_s(view, c)) <= limit]
        return cands[min(short)[1]] if short else best

    def _pass_s(self, view: View, c: Candidate) -> float:
        """The predicted seconds of candidate ``c``'s pass."""
        return self.predictions.ensure(view, c[0], c[1]).stages_s.get(c[2], 0.0)

    def _score(self, view: View, b: Board, opt: Candidate | None, names: list[str]) -> float:
        st = self._forecast_state(view, b)
        if opt is None:
            st.deferred = set(names)
        else:
            st.deferred = {n for n in names if n != opt[0].name}
        return forecast(st, self.depth, slow_fn(view))

    def _forecast_state(self, view: View, b: Board) -> FState:
        """The forecast's snapshot: each live pipeline's rest of step, as works."""
        running: list[FWork] = []
        chains: dict[str, list[FWork]] = {}
        weights: dict[str, float] = {}
        for pv in view.pipelines:
            if pv.finished:
                continue
            weights[pv.name] = self.predictions.urgency(view, pv)
            chains[pv.name] = self._rest_of_step(view, pv, running)
        return FState(view.now_s, running, chains, weights, b.mem_frac())

    def _rest_of_step(self, view: View, pv: PipelineView, running: list[FWork]) -> list[FWork]:
        """``pv``'s works not done in its current step: the running ones (and a ready model
        pass, which the option decides) go to ``running``; the rest, in order, is returned."""
        step = pv.steps_completed
        pred = self.predictions.ensure(view, pv, step)
        done = pv.done.get(step, frozenset())
        run = {t.stage: t for t in pv.running if t.step == step}
        chain: list[FWork] = []
        for stage in stage_sequence(pv.spec):
            if stage in done:
                continue
            dur = pred.gen_s if stage == Stage.ROLLOUT else pred.stages_s.get(stage, 0.0)
            kind = "memory" if stage == Stage.ROLLOUT else (
                "compute" if stage in MODEL_PASSES else "host")
            w = FWork(pv.name, stage, kind, dur, stage == Stage.WEIGHT_SYNC)
            if stage in run:
                w.remaining = max(0.05 * dur, dur - (view.now_s - run[stage].start_s))
                running.append(w)
            elif not any(x.pipeline == pv.name for x in running) and not chain and \
                    kind == "compute":
                running.append(w)  # a ready compute stage: the option decides
            else:
                chain.append(w)
        running.extend(self._ahead(view, pv))
        return chain

    def _ahead(self, view: View, pv: PipelineView) -> list[FWork]:
        """Rollouts of an async pipeline's later steps (running ahead within its staleness):
        they hold devices too, and a pass deferred to spare them is what the options weigh
        (left out, deferring looked free and async training starved)."""
        out = []
        for t in pv.running:
            if t.stage == Stage.ROLLOUT and t.step > pv.steps_completed:
                dur = self.predictions.ensure(view, pv, t.step).gen_s
                out.append(FWork(pv.name, Stage.ROLLOUT, "memory",
                                 max(0.05 * dur, dur - (view.now_s - t.start_s))))
        return out
