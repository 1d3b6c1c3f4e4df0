"""jigsaw's memos (the board per placement, splits per board, tail migrations, urgency per view)
change no decision: at every decision of a run the remembered answers equal those worked out
afresh from the view."""

from __future__ import annotations

from jigsawrl.config import validate_config
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import run_once
from jigsawrl.scheduler.jigsaw import JigsawPolicy
from jigsawrl.scheduler.jigsaw.board import Board, build_board
from jigsawrl.scheduler.jigsaw.prediction import StepPredictions
from jigsawrl.scheduler.jigsaw.shares import ShareAssigner


def _board_state(b: Board) -> tuple:
    return ([dict(d) for d in b.dev], b.kind, b.ranks, b.rank_idx, b.mem_free, b.mem_on,
            b.comp_on, b.n_comp, b.mem_held, b.any_memory(), b.any_compute(), b.mem_frac())


class Checked(JigsawPolicy):
    """jigsaw that checks its memos against fresh work at every decision."""

    checks = 0

    def decide(self, view):  # noqa: ANN001, ANN201
        if self.choice is not None and self._delegate is None:
            cached = self._boards.board(view)
            fresh = build_board(view)
            assert _board_state(cached) == _board_state(fresh)
            fresh_pred = StepPredictions(self.params.history_window, lambda: 0.0)
            fresh_pred._pred = dict(self.predictions._pred)
            assert [pv.name for pv in self.predictions.by_urgency(view)] == \
                [pv.name for pv in fresh_pred.by_urgency(view)]
            assert all(self.predictions.urgency(view, pv) == fresh_pred.urgency(view, pv)
                       for pv in view.pipelines)
            remembered = self.shares.share_actions(view, self._boards.board(view), [])
            anew = ShareAssigner(self.params.dynamic_shares, self.predictions.urgency)
            assert remembered == anew.share_actions(view, build_board(view), [])
            Checked.checks += 1
        return super().decide(view)


def test_memos_change_no_decision() -> None:
    pipes = [{"name": f"p{i}", "model": "qwen3-0.6b", "task": task, "batch_size": 16,
              "group_size": 4, "max_response_tokens": 2048, "steps": 2}
             for i, task in enumerate(("gsm8k", "aime-tool", "math"))]
    cfg = validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                       "accelerators_per_node": 8},
                           "pipelines": pipes, "seed": 1})
    exp = resolve(cfg)
    plain = run_once(exp, JigsawPolicy(fallback=False), 1)
    Checked.checks = 0
    checked = run_once(exp, Checked(fallback=False), 1)
    assert Checked.checks > 100
    assert checked.events == plain.events
