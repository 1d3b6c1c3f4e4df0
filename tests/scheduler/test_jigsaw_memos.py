"""jigsaw's memos (the board per placement, splits per board, tail migrations, urgency per view)
change no decision: at every decision of a run the remembered answers equal those worked out
afresh from the view. Nor does sleeping through rank progress reports that cannot change a
decision (``wakes_on_progress``): the run is the one woken by every report."""

from __future__ import annotations

from jigsawrl.config import validate_config
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import run_once
from jigsawrl.scheduler import Migrate
from jigsawrl.scheduler.jigsaw import JigsawPolicy
from jigsawrl.scheduler.jigsaw.board import Board, build_board
from jigsawrl.scheduler.jigsaw.prediction import StepPredictions
from jigsawrl.scheduler.jigsaw.shares import ShareAssigner


def _board_state(b: Board) -> tuple:
    return ([dict(d) for d in b.dev], b.kind, b.ranks, b.rank_idx, b.mem_free, b.mem_on,
            b.comp_on, b.n_comp, b.mem_held, b.any_memory(), b.any_compute(), b.mem_frac())


class EveryReport(JigsawPolicy):
    """jigsaw woken by every rank progress report (as before it said which ones matter)."""

    def wakes_on_progress(self, task, unfinished) -> bool:  # noqa: ANN001
        return True


class Checked(EveryReport):
    """jigsaw that checks its memos against fresh work at every decision (woken by every
    report, for the more decisions to check)."""

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


def _three(mode: str = "sync", steps: int = 2):  # noqa: ANN202
    pipes = [{"name": f"p{i}", "model": "qwen3-0.6b", "task": task, "batch_size": 16,
              "group_size": 4, "max_response_tokens": 2048, "steps": steps, "mode": mode}
             for i, task in enumerate(("gsm8k", "aime-tool", "math"))]
    cfg = validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                       "accelerators_per_node": 8},
                           "pipelines": pipes, "seed": 1})
    return resolve(cfg)


def test_memos_change_no_decision() -> None:
    exp = _three()
    plain = run_once(exp, JigsawPolicy(fallback=False), 1)
    Checked.checks = 0
    checked = run_once(exp, Checked(fallback=False), 1)
    assert Checked.checks > 100
    assert checked.events == plain.events


class CountingMoves(JigsawPolicy):
    """jigsaw counting the migrations it decides (the reports it sleeps through must not be the
    ones a migration acts on)."""

    moves = 0

    def decide(self, view):  # noqa: ANN001, ANN201
        d = super().decide(view)
        CountingMoves.moves += sum(isinstance(a, Migrate) for a in d.actions)
        return d


def test_sleeping_through_progress_changes_no_decision() -> None:
    CountingMoves.moves = 0
    for exp, params in ((_three(steps=3), {}), (_three("async", 3), {"depth": 0}),
                        (_three(steps=3), {"dynamic_shares": False})):
        every = run_once(exp, EveryReport(fallback=False, **params), 1)
        filtered = run_once(exp, CountingMoves(fallback=False, **params), 1)
        assert filtered.events == every.events
        assert len(filtered.decision_times_s) < len(every.decision_times_s) / 2
    assert CountingMoves.moves > 5  # several migrations were decided (9 with the dispatch-aware widths)
