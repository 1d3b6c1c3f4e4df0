"""Predicted step times of a pipeline on each rollout width: what the planner (:mod:`.planner`)
chooses widths from (DESIGN.md §2.7, issue 11 item 2).

A rollout on ``w`` devices runs ``w / rollout_tp`` engines; its generation time is that of its
slowest engine, each engine with its contiguous chunk of a predicted batch (the executor's
dispatch), averaged over a few predicted batches (:mod:`~jigsawrl.scheduler.batch_replay`:
one engine with a fair mix of the requests, as before, ran 7-13% short of the slowest of 2-8),
under the continuous-batching model the simulator runs (``sim/rollout.py``) with the KV budget of
jigsaw's memory plan. So a tail-bound rollout is predicted to gain little from more devices, and
a multi-turn one (many requests, tool waits between turns) to gain a lot — the shape the
planner needs.

What the prediction reads (DESIGN.md §6): before a pipeline's first finished step, batches drawn
from the task preset's generative model (:func:`~jigsawrl.scheduler.batch_replay.prior_batches`
— the same draws the verl placements are sized with, so that the two are compared on equal
terms). After it, one engine with a fair mix of the lengths of the last ``window`` steps
(:class:`~jigsawrl.graph.predict.HistoryPredictor`'s quantiles, each total split into the
preset's expected turns for a multi-turn task: history holds totals only), scaled by the ratio
of the prior's slowest engine to the prior's fair mix at that width — the dispatch's bias (and
the regroup's gain), measured on the prior and carried over: a simplification, cheap enough for
a replan. Never a sampled length of a step not yet finished.

Training is pooled (every device, the train state onloaded for the pass), so its time does not
depend on the rollout width: :meth:`WidthTimer.train_s` is the model passes on the whole pool.
"""

from __future__ import annotations

import math

from jigsawrl.graph.build import post_rollout_stages
from jigsawrl.graph.predict import HistoryPredictor
from jigsawrl.scheduler.base import PipelineView, View
from jigsawrl.scheduler.batch_replay import (
    MAX_RANKS,
    instances,
    memo,
    plain_s,
    prior_batches,
    prior_key,
    rollout_s,
)
from jigsawrl.scheduler.jigsaw.regroup import regroup_replay, widest_tp
from jigsawrl.scheduler.verl_placements import (
    pipeline_resident_bytes,
    prior_prompt_tokens,
    prior_requests,
    prior_tool_calls,
    real_task_turns,
)
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.workload.requests import RequestTruth, TurnTruth
from jigsawrl.workload.task_presets import TASKS


def as_turns(pv: PipelineView, total: int) -> tuple[TurnTruth, ...]:
    """An observed total response split into the task preset's expected turns (single-turn for a
    preset with one turn; a task without a preset in :func:`~jigsawrl.scheduler.verl_placements.
    real_task_turns`, its tool results taken off the total): history records totals only, the tool waits
    between turns are what makes a multi-turn rollout latency-bound."""
    task = TASKS.get(pv.spec.task)
    if task is None:  # a real task: its tool calls as its config or resolve estimates them
        spec = pv.spec
        results = prior_tool_calls(spec) * (spec.prior_tool_result_tokens or 0)
        return real_task_turns(spec, max(1, total - results))
    if not task.multi_turn:
        return (TurnTruth(max(1, total)),)
    expected = sum(task.continue_prob ** i for i in range(task.max_turns))
    count = max(1, min(task.max_turns, round(expected)))
    generated = max(count, total - int((count - 1) * task.tool_result_mean))
    per = max(1, generated // count)
    return tuple(TurnTruth(per) if i + 1 == count else
                 TurnTruth(per, task.tool_latency_median_s, int(task.tool_result_mean))
                 for i in range(count))


class WidthTimer:
    """Predicted generation seconds per (pipeline, width), cached per prediction source.

    Args:
        window: steps of history pooled.
        kv_mem_bytes: KV memory of one engine per device (jigsaw's memory plan).
    """

    def __init__(self, window: int, kv_mem_bytes: float, tail_requests: int = 0) -> None:
        self._predictor = HistoryPredictor(window)
        self.kv_mem_bytes = kv_mem_bytes
        # > 0: a tail of at most this many requests regroups where the executor can
        # (regroup.replay_s; jigsaw's tail_tp)
        self.tail_requests = tail_requests
        self._reqs: dict[str, tuple[int, list[RequestTruth]]] = {}  # pipeline -> (source, reqs)
        self._turns: dict[tuple[str, int], tuple[TurnTruth, ...]] = {}  # (task, total) -> turns
        self._priors: dict[str, tuple[list[RequestTruth], list[RequestTruth]]] = {}
        self._gen: dict[tuple[str, int, int], float] = {}
        # (pipeline, source, devices) -> (cost model, post-rollout stage seconds)
        self._stages: dict[tuple[str, int, int], tuple[object, dict[str, float]]] = {}

    def source(self, pv: PipelineView) -> int:
        """Which prediction a pipeline's times come from: the newest observed step + 1 (0: the
        prior). A new source makes new predictions (and may call for a replan)."""
        return pv.history[-1].step + 1 if pv.history else 0

    def requests(self, pv: PipelineView) -> list[RequestTruth]:
        """One step's predicted requests, longest first."""
        src = self.source(pv)
        cached = self._reqs.get(pv.name)
        if cached is not None and cached[0] == src:
            return cached[1]
        spec = pv.spec
        if not pv.history:
            reqs = self._prior(pv)[1]
        else:
            n = spec.batch_size * spec.group_size
            prompt, lengths = self._predictor.predict_lengths(
                n, pv.history, prior_prompt_tokens(spec), spec.max_response_tokens // 4,
                spec.max_response_tokens, 1)
            # The lengths come longest first and as_turns keeps their order (its generated
            # tokens grow with the total), so these requests are already longest first.
            reqs = [RequestTruth(f"{pv.name}/{src}/pred/{i}", prompt, self._turns_of(pv, total))
                    for i, total in enumerate(lengths)]
        self._reqs[pv.name] = (src, reqs)
        self._gen = {k: v for k, v in self._gen.items() if k[0] != pv.name or k[1] == src}
        return reqs

    def _turns_of(self, pv: PipelineView, total: int) -> tuple[TurnTruth, ...]:
        got = self._turns.get((pv.spec.task, total))
        if got is None:
            got = self._turns[(pv.spec.task, total)] = as_turns(pv, total)
        return got

    def gen_s(self, view: View, pv: PipelineView, width: int) -> float:
        """Predicted seconds of ``pv``'s rollout on ``width`` devices (whole TP groups).

        On the prior: the slowest of its ranks, each with a contiguous chunk of a batch drawn
        from the task preset, averaged over the draws (:func:`~jigsawrl.scheduler.batch_replay.
        rollout_s`; the tail regroup replayed). After the first step: one rank with a fair mix
        of the predicted lengths (cheap: a replan runs many), scaled by what the slowest rank
        and the regroup make of the prior's fair mix at this width — the dispatch's bias,
        measured on the prior, carried to the history."""
        key = self._key(view, pv, width)
        ranks, group = key[2], key[3]
        if key not in self._gen:
            reqs = self.requests(pv)  # drops the times of an older source
            prior = self._slowest_s(view, pv, ranks, group)
            if pv.history:
                base = self._mix_s(view, pv, self._prior(pv)[1], ranks)
                prior *= self._mix_s(view, pv, reqs, ranks) / base if base > 0 else 1.0
            self._gen[key] = prior
        return self._gen[key]

    def _key(self, view: View, pv: PipelineView, width: int) -> tuple[str, int, int, int]:
        """(pipeline, source, ranks, the TP its tail regroups on) of :meth:`gen_s`'s cache."""
        tp = pv.spec.rollout_tp
        group = widest_tp(min(width, view.accelerators_per_node), pv.model.num_heads) if (
            self.tail_requests and view.can_regroup) else tp
        return (pv.name, self.source(pv), max(1, width // tp), group)

    def cached_near(self, view: View, pv: PipelineView, width: int) -> float | None:
        """:meth:`gen_s_near` if every time it reads is worked out already, else None (a
        decision asks for it in the background instead of replaying now: :mod:`.background`)."""
        if any(self._key(view, pv, w) not in self._gen for w in _timed(view, pv, width)):
            return None
        return self.gen_s_near(view, pv, width)

    def gen_s_near(self, view: View, pv: PipelineView, width: int) -> float:
        """:meth:`gen_s` on a width of the planner's ladder (:func:`width_ladder`); between two
        of its widths, interpolated linearly in 1 / width between them.

        Why: a rollout that grew (a spread) or shrank (a consolidation) runs on a width off the
        ladder, and asking :meth:`gen_s` for it is a replay of its own (5-95 ms at 128 GPUs ×
        16 pipelines; the spread planner asked for one on most of its decisions). A rollout's
        time falls about as 1 / width between two ladder widths (its work divided, its tail
        not), so the interpolation is close where the ladder is dense (every group count up
        to 4) and a simplification beyond, where the ladder steps by × 1.5."""
        timed = _timed(view, pv, width)
        if len(timed) == 1:
            return self.gen_s(view, pv, width)
        lo, hi = timed
        frac = (1.0 / lo - 1.0 / width) / (1.0 / lo - 1.0 / hi)
        at_lo, at_hi = self.gen_s(view, pv, lo), self.gen_s(view, pv, hi)
        return at_lo + frac * (at_hi - at_lo)

    def _prior(self, pv: PipelineView) -> tuple[list[RequestTruth], list[RequestTruth]]:
        """The task preset's quantile requests of one step, as made and longest first."""
        got = self._priors.get(pv.name)
        if got is None:
            reqs = prior_requests(pv)
            got = self._priors[pv.name] = (reqs, sorted(reqs, key=lambda r: -r.generated_tokens))
        return got

    def _slowest_s(self, view: View, pv: PipelineView, ranks: int, group: int) -> float:
        """The prior's slowest rank on ``ranks`` ranks, tails regrouped on TP ``group``; shared
        by pipelines alike and other plans of the pool (:func:`~jigsawrl.scheduler.
        batch_replay.memo`)."""
        tp, cost = pv.spec.rollout_tp, view.cost
        instance, kv = instances(cost, pv, self.kv_mem_bytes, f"{pv.name}/plan/{ranks}")
        batches = prior_batches(pv, self._prior(pv)[0])
        replay = regroup_replay(cost, self.tail_requests, lambda p, r: group) if (
            group > tp) else None

        def end() -> float:
            return rollout_s(pv, batches, ranks, instance, self.kv_mem_bytes, replay)
        prior = prior_key(pv)
        return memo(None if prior is None else (
            "width", pv.model, tp, kv, self.kv_mem_bytes, group if ranks <= MAX_RANKS else tp,
            ranks, self.tail_requests, prior), cost, end)

    def _mix_s(self, view: View, pv: PipelineView, reqs: list[RequestTruth],
               ranks: int) -> float:
        """One rank with every ``ranks``-th of ``reqs`` (longest first), replayed alone."""
        instance, kv = instances(view.cost, pv, self.kv_mem_bytes, f"{pv.name}/plan/{ranks}")
        mix = reqs[::ranks]
        return memo(("mix", pv.model, pv.spec.rollout_tp, kv,
                     tuple((r.prompt_tokens, r.turns) for r in mix)), view.cost,
                    lambda: plain_s([mix], instance))

    def stages_s(self, view: View, pv: PipelineView) -> dict[str, float]:
        """Predicted seconds of each post-rollout stage on the whole pool (full share), cached
        per prediction source (a copy: the caller may change it)."""
        key = (pv.name, self.source(pv), len(view.devices))
        got = self._stages.get(key)
        if got is None or got[0] is not view.cost:
            reqs = self.requests(pv)
            spec = pv.spec
            tokens = sum(r.total_tokens for r in reqs)
            got = self._stages[key] = (view.cost, post_rollout_stages(
                view.cost, pv.model, len(view.devices), tokens, len(reqs), use_ref=spec.use_ref,
                ppo_epochs=spec.train.ppo_epochs, rollout_tp=spec.rollout_tp))
        return dict(got[1])

    def train_s(self, view: View, pv: PipelineView) -> float:
        """The model passes of one step on the whole pool (pooled training)."""
        return sum(s for k, s in self.stages_s(view, pv).items() if k in MODEL_PASSES)

    def host_s(self, view: View, pv: PipelineView) -> tuple[float, float, float]:
        """(reward, onload + offload of the train state, weight sync) seconds of one step."""
        stages = self.stages_s(view, pv)
        n = len(view.devices)
        move = view.cost.host_transfer_time_s(pipeline_resident_bytes(view.cost, pv, n) * n, n)
        return stages.get(Stage.REWARD, 0.0), 2 * move, stages.get(Stage.WEIGHT_SYNC, 0.0)


def _timed(view: View, pv: PipelineView, width: int) -> tuple[int, ...]:
    """The widths :meth:`WidthTimer.gen_s_near` times for ``width``: itself when it is on the
    ladder or beyond either end, else its two ladder neighbours (below, above)."""
    ladder = width_ladder(len(view.devices), pv.spec.rollout_tp)
    if width in ladder or width < ladder[0] or width > ladder[-1]:
        return (width,)
    return (max(w for w in ladder if w < width), next(w for w in ladder if w > width))


def width_ladder(n: int, tp: int) -> list[int]:
    """The widths (devices, whole TP groups) the planner tries: every group count up to 4, then
    a ×1.5 ladder, and the whole pool — a few dozen at most, whatever the pool's size."""
    groups = n // tp
    out: set[int] = set(range(1, min(4, groups) + 1))
    k = 4.0
    while k < groups:
        k = math.ceil(k * 1.5)
        out.add(min(groups, int(k)))
    out.add(groups)
    return sorted(g * tp for g in out if g >= 1)
