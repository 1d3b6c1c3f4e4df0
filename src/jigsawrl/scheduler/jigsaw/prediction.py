"""The ``jigsaw`` policy's predictions: each pipeline's next step as its predicted Sub-Stage Graph,
and the urgency that ranks pipelines.

A step is predicted once, when it is first asked for (:meth:`StepPredictions.ensure`): the
history predictor (:class:`~jigsawrl.graph.predict.HistoryPredictor`) gives the step's requests
(the task prior before the first step), dealt so that every DP worker holds the same mix, and
the graph builder (:func:`~jigsawrl.graph.build.build_step_graph`) makes the step's
:class:`~jigsawrl.graph.substage.SubStageGraph`: one representative worker's rollout
sub-stages (prefill, decode bands, tool waits: its continuous-batching run under the belief
cost model) behind the barrier into the post-rollout stages. The graph is what is kept; every
time the policy reads — a rollout's generation time, a stage's, the step's — is read off it
(:class:`Prediction`), so a changed node changes every decision that reads it (tested). The
scheduler never sees sampled lengths (DESIGN.md §2.6). Predictions of steps more than one behind
the newest are dropped.

Where the graph is not the state (said here, as DESIGN.md asks): the width planner times a
rollout on each width with replays of its own (:mod:`.widths`: a batch split over that many
ranks, the slowest rank), and the plan forecast runs on those times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from jigsawrl.graph.build import StepShape, build_step_graph, post_rollout_s, rollout_end_s
from jigsawrl.graph.predict import HistoryPredictor
from jigsawrl.graph.substage import SubStageGraph
from jigsawrl.scheduler.base import PipelineView, View
from jigsawrl.scheduler.verl_placements import prior_prompt_tokens
from jigsawrl.sim.rollout import engine_limits
from jigsawrl.stages import Stage
from jigsawrl.workload.task_presets import TASKS


@dataclass(frozen=True, slots=True)
class Prediction:
    """One step's predicted Sub-Stage Graph and the times read off it once: generation (the
    rollout's sub-stages), each post-rollout stage, and the step (their sum)."""

    graph: SubStageGraph
    gen_s: float = field(init=False)
    stages_s: dict[str, float] = field(init=False)
    step_s: float = field(init=False)

    def __post_init__(self) -> None:
        gen, stages = rollout_end_s(self.graph), post_rollout_s(self.graph)
        object.__setattr__(self, "gen_s", gen)
        object.__setattr__(self, "stages_s", stages)
        object.__setattr__(self, "step_s", gen + sum(stages.values()))


class StepPredictions:
    """Predicted steps per (pipeline, step), and the urgency computed from them.

    Args:
        window: steps of history pooled by the predictor.
        kv_mem_bytes: the engines' KV memory per device (read when a step is predicted; the
            memory plan sets it at the first decision).
    """

    def __init__(self, window: int, kv_mem_bytes: Callable[[], float]) -> None:
        self._predictor = HistoryPredictor(window)
        self._kv_mem_bytes = kv_mem_bytes
        self._pred: dict[tuple[str, int], Prediction] = {}
        # Urgency memo of one view: (view, the predictions' version, pipeline -> urgency).
        # The view is immutable and the version moves whenever a prediction is made or
        # dropped, so a memoised value is the one :meth:`urgency` would compute now.
        self._version = 0
        self._memo: tuple[View | None, int, dict[str, tuple[PipelineView, float]]] = (None, -1, {})
        self._left: tuple[dict[str, float], float] | None = None
        self._order: list[PipelineView] | None = None  # by_urgency of the memo's view

    def ensure_current(self, view: View) -> None:
        """Predict every live pipeline's current step now (the policy calls it first in each
        decision), so that every urgency of the decision reads the same predictions.

        Without it an urgency read before its step was predicted fell back to the pipeline's
        bare ``latency_weight``: the pipelines were ranked on those, and a step first predicted
        mid-decision (the look-ahead's forecast asks for it) changed the urgencies between the
        options it scored — the first weighed with the fallbacks, the others with predictions.
        On the demo's replay that deferred a pass 1.8 s for nothing (docs/BENCHMARKS.md,
        "Shared prompts, consistent urgencies, serial placement")."""
        for pv in view.pipelines:
            if not pv.finished:
                self.ensure(view, pv, pv.steps_completed)

    def get(self, pipeline: str, step: int) -> Prediction | None:
        """The prediction of a step, if it was made (never makes one)."""
        return self._pred.get((pipeline, step))

    def ensure(self, view: View, pv: PipelineView, step: int) -> Prediction:
        """The prediction of ``pv``'s ``step``, made now if it was not."""
        key = (pv.name, step)
        if key not in self._pred:
            self._pred[key] = self._predict(view, pv, step)
            self._version += 1
        return self._pred[key]

    def _predict(self, view: View, pv: PipelineView, step: int) -> Prediction:
        n = len(view.devices)
        spec = pv.spec
        task = TASKS.get(spec.task)
        prior_p = int(task.prompt_mean) if task else prior_prompt_tokens(spec)
        prior_r = int(task.response_median * (1.3 if task and task.multi_turn else 1.0)) \
            if task else spec.max_response_tokens // 4
        n_ranks = max(1, n // spec.rollout_tp)
        reqs = self._predictor.predict(pv.name, step, spec.batch_size * spec.group_size,
                                       pv.history, prior_p, prior_r, spec.max_response_tokens,
                                       n_ranks)
        kv = view.cost.kv_budget_tokens(pv.model, spec.rollout_tp,
                                        max(self._kv_mem_bytes(), 1.0))
        limits = engine_limits(view.cost, spec, kv)
        shape = StepShape(pv.name, step, pv.model, n_ranks * spec.rollout_tp, spec.rollout_tp,
                          n, use_ref=spec.use_ref, ppo_epochs=spec.train.ppo_epochs, **limits)
        self._pred = {k: v for k, v in self._pred.items() if k[1] >= step - 1}
        # The predictor deals lengths round-robin, so rank 0 holds the longest request and a
        # representative mix: its predicted sub-stages are the rollout's (cheap: one rank, not n).
        return Prediction(build_step_graph(shape, reqs, view.cost, ranks=(0,)))

    def replace(self, pipeline: str, step: int, graph: SubStageGraph) -> Prediction:
        """Put ``graph`` in place of a step's predicted graph (what a caller that knows better —
        or a test — does); every time read from then on comes from it."""
        pred = self._pred[(pipeline, step)] = Prediction(graph)
        self._version += 1
        return pred

    # ------------------------------------------------------------------ urgency
    def by_urgency(self, view: View) -> list[PipelineView]:
        """The unfinished pipelines, most urgent first."""
        self._sync_memo(view)
        if self._order is None:
            live = [pv for pv in view.pipelines if not pv.finished]
            self._order = sorted(live, key=lambda pv: -self.urgency(view, pv))
        return list(self._order)

    def urgency(self, view: View, pv: PipelineView) -> float:
        """Weight × lateness of the current step against its predicted solo time × the share
        of all remaining work that is this pipeline's (the longest job gates the makespan);
        memoised per view (a decision asks for it many times)."""
        memo = self._sync_memo(view)
        got = memo.get(pv.name)
        if got is None or got[0] is not pv:
            got = memo[pv.name] = (pv, self._urgency(view, pv))
        return got[1]

    def _sync_memo(self, view: View) -> dict[str, tuple[PipelineView, float]]:
        """The urgency memo of ``view`` (emptied for a new view or new predictions)."""
        memo_view, version, memo = self._memo
        if memo_view is not view or version != self._version:
            memo = {}
            self._memo = (view, self._version, memo)
            self._left = None
            self._order = None
        return memo

    def _left_all(self, view: View) -> tuple[dict[str, float], float]:
        """Each live pipeline's predicted remaining work and their mean (memoised with the
        urgencies of the same view)."""
        if self._left is None:
            left = {p.name: self._left_s(p) for p in view.pipelines if not p.finished}
            self._left = (left, sum(left.values()) / max(1, len(left)))
        return self._left

    def _urgency(self, view: View, pv: PipelineView) -> float:
        step = pv.steps_completed
        pred = self._pred.get((pv.name, step))
        if pred is None or pred.step_s <= 0:
            return pv.spec.latency_weight
        starts = [t.start_s for t in pv.running if t.step == step and t.stage == Stage.ROLLOUT]
        left, mean_left = self._left_all(view)
        share = left.get(pv.name, 0.0) / mean_left if mean_left > 0 else 1.0
        ratio = (view.now_s - starts[0]) / pred.step_s if starts else 1.0
        bound = pv.spec.max_latency_ratio
        boost = 10.0 if bound is not None and ratio > 0.8 * bound else 1.0
        return pv.spec.latency_weight * max(1.0, ratio) * boost * max(0.5, share)

    def _left_s(self, pv: PipelineView) -> float:
        """Predicted remaining work of a pipeline: its remaining steps × predicted step time."""
        pred = self._pred.get((pv.name, pv.steps_completed))
        per = pred.step_s if pred is not None else 1.0
        return per * (pv.spec.steps - pv.steps_completed)
