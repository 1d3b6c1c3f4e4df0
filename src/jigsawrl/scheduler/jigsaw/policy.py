"""``jigsaw`` and ``greedy`` (jigsaw at look-ahead depth 0): the policy that runs the planner's
pieces at every decision (the package docstring says how it decides)."""

from __future__ import annotations

from jigsawrl.scheduler.base import (
    Action,
    Decision,
    PipelineView,
    PolicyBase,
    StartStage,
    View,
    register_policy,
)
from jigsawrl.scheduler.jigsaw.board import Board, build_board
from jigsawrl.scheduler.jigsaw.lookahead import LookAhead
from jigsawrl.scheduler.jigsaw.params import JigsawParams
from jigsawrl.scheduler.jigsaw.placement import Placement
from jigsawrl.scheduler.jigsaw.prediction import StepPredictions
from jigsawrl.scheduler.jigsaw.residency import Residency
from jigsawrl.scheduler.jigsaw.shares import ShareAssigner
from jigsawrl.scheduler.jigsaw.tail import TailMigration
from jigsawrl.stages import HOST_STAGES, MODEL_PASSES, Stage


@register_policy("jigsaw")
class JigsawPolicy(PolicyBase):
    """JigsawRL: multiplexing, dynamic shares, tail migration, look-ahead (see the package
    docstring; the parameters are :class:`JigsawParams`'s).

    Raises:
        ConfigError: parameters out of range (at construction), or a pool too small for the
            memory plan (at the first decision).
    """

    wants_rank_progress = True

    def __init__(self, depth: int = 2, migration: bool = True, dynamic_shares: bool = True,
                 max_colocated: int = 1, tail_requests: int = 128, tail_batch: int = 64,
                 history_window: int = 3, min_rollout_fraction: float = 0.5,
                 max_train_states: int = 1, name: str = "jigsaw") -> None:
        self.params = JigsawParams(
            depth=depth, migration=migration, dynamic_shares=dynamic_shares,
            max_colocated=max_colocated, tail_requests=tail_requests, tail_batch=tail_batch,
            history_window=history_window, min_rollout_fraction=min_rollout_fraction,
            max_train_states=max_train_states)
        self.name = name
        self.residency = Residency(self.params)
        self.predictions = StepPredictions(history_window, lambda: self.residency.kv_mem)
        self.placement = Placement(self.params, self.residency, self.predictions)
        self.lookahead = LookAhead(depth, self.predictions)
        self.tail = TailMigration(self.params, self.residency, self.predictions)
        self.shares = ShareAssigner(dynamic_shares, self.predictions.urgency)

    def decide(self, view: View) -> Decision:
        if not self.residency.placed:
            self.residency.place(view)
        board = build_board(view)
        actions = self.residency.memory_moves(view, board)
        if self.params.migration:
            actions += self.tail.migrate(view, board)
        starts = self._choose_starts(view, board)
        actions += self.shares.share_actions(view, board, starts)
        return Decision(tuple(actions))

    def _choose_starts(self, view: View, b: Board) -> list[Action]:
        """Host stages and rollouts that can start, most urgent pipeline first, then at most one
        model pass (one per device at a time), chosen by the look-ahead."""
        ready = [(pv, step, stage) for pv in self.predictions.by_urgency(view)
                 for step, stage in pv.ready()]
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
                  if stage in MODEL_PASSES and self.residency.on_device(pv.name)]
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
        if not cands:
            return None
        best = self.lookahead.choose(view, b, cands)
        if best is None:
            return None
        return self.placement.start_compute(view, b, *best)


@register_policy("greedy")
def _greedy(**params) -> JigsawPolicy:  # noqa: ANN003
    """jigsaw without look-ahead (depth 0): the ablation of the look-ahead."""
    params.setdefault("name", "greedy")
    return JigsawPolicy(depth=0, **{k: v for k, v in params.items() if k != "depth"})
