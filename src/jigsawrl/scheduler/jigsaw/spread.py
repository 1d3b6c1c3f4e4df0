"""A running rollout grows onto devices nobody else wants (issue 11 item 4; DESIGN.md §2.8).

Why: a rollout's width is fixed when it starts, so one that started narrow beside other work —
the last step of the pipeline on the critical path, started while the others trained — keeps
running narrow after the others finished and left their devices idle (on
``configs/eight-per-node.yaml`` the last 40 s were one 4B rollout on two of eight devices).
:class:`TailSpread` gives such a rollout new ranks on those devices
(:class:`~jigsawrl.scheduler.base.Spread`; the executor re-deals its requests, charging their
re-prefill and each new engine's wake-up) when the belief cost model says it then ends sooner.

When it spreads (each decision, after the starts; at most one rollout per decision):

- the executor can (``View.can_spread``), ``spread`` is on, and nothing else wants devices: no
  ready rollout or model pass left unstarted by this decision;
- whole TP groups of the rollout's TP (within a node) are idle on the board (no task, memory for
  an engine);
- the tail regroup (:mod:`.regroup`) is not holding the rollout's drained ranks for a wider TP
  group: on a tail it is the better lever (spreading a multi-turn tail onto TP-1 ranks instead
  of letting it regroup on TP 4 measured 7% slower), and the two would fight over the tail;
- no other pipeline is predicted to need devices before the rollout, spread, ends: a
  pipeline's next device stage (a rollout, or a model pass, which runs on every device) comes
  after the predicted rest of its stages before it (its reward, a weight sync), and a finished
  pipeline needs none. Borrowed devices are so given back before anyone asks for them; without
  this rule a rollout spread onto the devices its twin left for its reward, and the twin's
  passes then ran beside its decodes (``paper/sync-gsm8k-gsm8k``: 14 spreads, 12% slower);
- the predicted gain beats a margin. Predicted remaining seconds: the width planner's time of
  the rollout at the width it started with, less its elapsed time (an overrun rollout is not
  spread: its remaining time is unknown). After the spread they are scaled by the slower of two
  speed-ups — the planner's time at the wider width over that at the old one (off its
  ladder, interpolated between two of its widths: :meth:`~.widths.WidthTimer.gen_s_near`,
  no replay of its own), and one decode iteration of the busiest rank before over one of an
  even share after on the slowest rank (the new ranks have the rollout's TP; a regrouped old
  one is wider) — and the re-prefill of the moved contexts and a new engine's wake-up are
  added; the second, cheap, is checked first. Never a sampled length. A time the planner has not
  worked out yet is asked for in the background (:mod:`.background`) and the rollout is not
  spread in this decision (another pipeline's unknown rollout time counts as needing devices
  now); the decision after the work has run weighs it.
"""

from __future__ import annotations

import math

from jigsawrl.scheduler.base import (
    PipelineView,
    RunningTask,
    Spread,
    View,
    progress_known,
    stage_sequence,
    task_id,
)
from jigsawrl.scheduler.jigsaw.board import Board
from jigsawrl.scheduler.jigsaw.params import JigsawParams
from jigsawrl.scheduler.jigsaw.planner import WidthPlanner
from jigsawrl.scheduler.jigsaw.prediction import StepPredictions
from jigsawrl.scheduler.jigsaw.residency import Residency
from jigsawrl.stages import MODEL_PASSES, Stage

GAIN_MARGIN = 0.1  # a spread must save at least this fraction of the rollout's remaining time
MIN_GAIN_S = 0.5  # ... and at least this many seconds (a smaller gain is within the forecast's error)
MIN_PER_RANK = 2  # unfinished requests each rank keeps at least, after the spread


class TailSpread:
    """Plans one :class:`Spread` a decision (module docstring)."""

    def __init__(self, params: JigsawParams, residency: Residency, planner: WidthPlanner,
                 predictions: StepPredictions) -> None:
        self.params = params
        self.residency = residency
        self.planner = planner
        self.predictions = predictions
        self.count = 0  # spreads planned in the run

    def plan(self, view: View, b: Board, order: list[PipelineView]) -> list[Spread]:
        """A spread of the first rollout in ``order`` (most urgent first) that gains from it,
        claimed on the board; [] when none does."""
        if not (self.params.spread and view.can_spread) or self.residency.tight or \
                all(b.count(d) for d in range(len(view.devices))) or self._wanted(view, b):
            return []  # (most decisions: no device is idle)
        for pv in order:
            for t in pv.running:
                if t.stage != Stage.ROLLOUT or t.task_id not in b.ranks:
                    continue
                act = self._spread(view, b, pv, t)
                if act is not None:
                    self.count += 1
                    return [act]
        return []

    @staticmethod
    def _wanted(view: View, b: Board) -> bool:
        """Does a ready rollout or model pass still wait for devices after this decision's
        starts (they are on the board by now)?"""
        started = set(b.kind)
        for pv in view.pipelines:
            for step, stage in pv.ready():
                if (stage == Stage.ROLLOUT or stage in MODEL_PASSES) and \
                        task_id(pv.name, step, stage) not in started:
                    return True
        return False

    def _needs_devices_in(self, view: View, pv: PipelineView) -> float:
        """Predicted seconds until ``pv`` starts its next stage that takes devices (a rollout
        or a model pass): the rest of its running stages and the host stages before it; 0 when
        one is ready now or nothing is predicted."""
        step = pv.steps_completed
        pred = self.predictions.get(pv.name, step)
        if pred is None:
            return 0.0
        done = pv.done.get(step, frozenset())
        running = {t.stage: t for t in pv.running if t.step == step}
        wait = 0.0
        for stage in stage_sequence(pv.spec):
            if stage in done:
                continue
            dur = pred.stages_s.get(stage, 0.0) if stage != Stage.ROLLOUT else (
                self._rollout_s(view, pv, running.get(stage)))
            if dur is None:
                return 0.0  # its rollout's time is being worked out: it may need devices now
            t = running.get(stage)
            if t is not None:
                wait += max(0.0, dur - (view.now_s - t.start_s))
            elif stage == Stage.ROLLOUT or stage in MODEL_PASSES:
                return wait
            else:
                wait += dur
        return wait  # its next step's rollout then

    def _rollout_s(self, view: View, pv: PipelineView, t: RunningTask | None) -> float | None:
        """A running rollout's predicted seconds at its width (0: not running, or no plan;
        None: not worked out yet)."""
        return 0.0 if t is None or self.planner.timer is None else self._gen_s(
            view, pv, len(t.devices))

    def _gen_s(self, view: View, pv: PipelineView, width: int) -> float | None:
        """The planner's time of ``pv``'s rollout on ``width`` devices if it is worked out,
        else None, asked for in the background (at once where there is none)."""
        timer = self.planner.timer
        assert timer is not None
        background = self.planner.background
        if background is None or not self.planner.defers:
            return timer.gen_s_near(view, pv, width)
        got = timer.cached_near(view, pv, width)
        if got is None:
            def work() -> None:
                timer.gen_s_near(view, pv, width)
            background.want(("gen", pv.name, width), work)
        return got

    def _idle_groups(self, view: View, b: Board, tp: int, need: float) -> list[tuple[int, ...]]:
        per = view.accelerators_per_node
        out = []
        for g in range(0, len(view.devices) - tp + 1, tp):
            group = tuple(range(g, g + tp))
            if g // per == (g + tp - 1) // per and all(
                    b.count(d) == 0 and b.mem_free[d] >= need for d in group):
                out.append(group)
        return out

    def _spread(self, view: View, b: Board, pv: PipelineView, t: RunningTask) -> Spread | None:
        live = b.rank_idx[t.task_id]
        counts, ctx = t.unfinished_per_rank, t.ctx_tokens_per_rank
        if not live or not ctx or not progress_known(t, counts, live):
            return None  # a live rank has not reported yet
        tp = len(t.devices) // len(t.rank_devices)
        total = sum(counts[r] for r in live)
        cost, m = view.cost, pv.model
        need = self.residency.kv_mem + cost.rollout_weight_bytes(m, tp)
        groups = self._idle_groups(view, b, tp, need)
        add = min(len(groups), total // MIN_PER_RANK - len(live))
        if add < 1 or self.planner.timer is None:
            return None
        width = len(t.devices)
        gen = self._gen_s(view, pv, width)
        if gen is None:
            return None
        remaining = gen - (view.now_s - t.start_s)
        if remaining <= 0:
            return None
        ranks = len(live) + add
        rank_tp = {r: len(devs) for r, devs in zip(live, b.ranks[t.task_id], strict=True)}
        busiest = max(live, key=lambda r: counts[r])
        total_ctx = sum(ctx[r] for r in live)
        before = cost.decode_iter_time_s(m, rank_tp[busiest], max(1, counts[busiest]),
                                         max(1, ctx[busiest]))
        each, each_ctx = max(1, math.ceil(total / ranks)), max(1, math.ceil(total_ctx / ranks))
        # the slowest rank after: an old one (a regrouped rank is wider) or a new one
        after = max(cost.decode_iter_time_s(m, g, each, each_ctx) for g in {*rank_tp.values(), tp})
        moved = max(1, math.ceil(total_ctx / ranks))  # per new rank
        extra = cost.weight_sync_time_s(m, tp, tp) + cost.prefill_time_s(
            m, tp, moved, 0, 1.0, num_seqs=max(1, math.ceil(total / ranks)))
        margin = max(MIN_GAIN_S, GAIN_MARGIN * remaining)
        if remaining * (1.0 - after / before) - extra < margin:
            return None  # not even the decode speed-up alone pays (no replay asked)
        wider = self._gen_s(view, pv, width + add * tp)
        if wider is None:
            return None
        speedup = max(after / before, wider / max(1e-9, gen))
        after_s = remaining * speedup + extra
        gain = remaining - after_s
        if gain < margin or after_s > min(
                (self._needs_devices_in(view, q) for q in view.pipelines
                 if q.name != pv.name and not q.finished), default=math.inf):
            return None
        devs = tuple(d for g in groups[:add] for d in g)
        b.spread_ranks(t.task_id, groups[:add], len(t.rank_devices), need)
        return Spread(t.task_id, devs)
