"""jigsaw's spreads: a running rollout grows onto devices that other work left idle."""

from __future__ import annotations

from test_jigsaw import Recorder

from jigsawrl.config import validate_config
from jigsawrl.driver.state import DriverState
from jigsawrl.events import SampleFinished, StepFinished
from jigsawrl.executors.simulated import SimulatedExecutor
from jigsawrl.experiments.core import drive
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import TRUTH_NOISE_SIGMA, make_cost, run_once
from jigsawrl.scheduler import get_policy
from jigsawrl.scheduler.base import Spread
from jigsawrl.scheduler.jigsaw.board import build_board
from jigsawrl.scheduler.jigsaw.spread import TailSpread

# jigsaw's own plan at the config's TP with fair widths: each pipeline's rollout takes half of
# the 8 devices, and the short 0.6B job's half idles once it finished (one rollout engine per
# device: with two, both rollouts would share all eight)
OWN = {"fallback": False, "tp_search": False, "plan_widths": False, "colocate": False}


def pair(aime_batch: int):  # noqa: ANN201
    """A multi-turn 4B job (AIME with a tool) beside a short 0.6B GSM8K job, on 8 H100s."""
    pipes = [{"name": "a", "model": "qwen3-4b", "task": "aime-tool", "batch_size": aime_batch,
              "group_size": 4, "max_response_tokens": 4096, "steps": 1},
             {"name": "b", "model": "qwen3-0.6b", "task": "gsm8k", "batch_size": 16,
              "group_size": 4, "max_response_tokens": 2048, "steps": 1}]
    return resolve(validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                                "accelerators_per_node": 8},
                                    "pipelines": pipes, "seed": 3}))


def test_a_rollout_spreads_onto_the_devices_a_finished_job_left_and_ends_sooner() -> None:
    exp = pair(64)
    rec = Recorder(get_policy("jigsaw", OWN))
    res = run_once(exp, rec, 3)
    spreads = [a for d in rec.decisions for a in d.actions if isinstance(a, Spread)]
    assert [s.task_id for s in spreads] == ["a/0/rollout"]
    assert spreads[0].devices == (4, 5, 6, 7)  # the 0.6B job's half, once it finished
    ids = [e.sample_id for e in res.events if isinstance(e, SampleFinished)]
    assert len(ids) == len(set(ids)) == 64 * 4 + 16 * 4  # none lost, none twice
    assert len([e for e in res.events if isinstance(e, StepFinished)]) == 2
    off = run_once(exp, Recorder(get_policy("jigsaw", {**OWN, "spread": False})), 3)
    assert res.makespan_s < 0.9 * off.makespan_s


def test_a_regrouped_tail_is_not_spread_onto_narrower_ranks() -> None:
    # With 32 prompts the AIME rollout is a tail from the start and re-forms on one TP-4 group;
    # moving its requests onto TP-1 ranks was predicted faster on an estimate that took every
    # rank at the rollout's TP and measured 7% slower.
    exp = pair(32)
    rec = Recorder(get_policy("jigsaw", OWN))
    run_once(exp, rec, 3)
    assert not any(isinstance(a, Spread) for d in rec.decisions for a in d.actions)


def test_no_spread_onto_devices_a_twin_will_want_before_the_rollout_ends() -> None:
    # Two like 4B GSM8K jobs: when one's rollout ends, its devices idle only for its reward
    # before its passes want every device. Spreading the other's rollout onto them was
    # predicted faster on the rollout alone and made the run 6% slower (twice here; 14 times
    # on paper/sync-gsm8k-gsm8k, 12% slower): a spread must end before anyone needs devices.
    pipes = [{"name": n, "model": "qwen3-4b", "task": "gsm8k", "batch_size": 64,
              "group_size": 4, "max_response_tokens": 4096, "steps": 2} for n in ("a", "b")]
    exp = resolve(validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                               "accelerators_per_node": 8},
                                   "pipelines": pipes, "seed": 3}))
    pol = get_policy("jigsaw", {"fallback": False})
    res = run_once(exp, pol, 3)
    assert pol.spread.count == 0
    off = run_once(exp, get_policy("jigsaw", {"fallback": False, "spread": False}), 3)
    assert res.makespan_s == off.makespan_s


def test_no_spread_where_the_executor_cannot() -> None:
    exp = pair(64)
    ex = SimulatedExecutor(exp, truth_cost=make_cost(exp, noise_sigma=TRUTH_NOISE_SIGMA, seed=3),
                           seed=3)
    ex.can_spread = False
    rec = Recorder(get_policy("jigsaw", OWN))
    drive(exp, rec, ex, make_cost(exp))
    assert not any(isinstance(a, Spread) for d in rec.decisions for a in d.actions)


def test_devices_are_wanted_while_a_ready_stage_has_not_started() -> None:
    exp = pair(64)
    view = DriverState(exp).view(0.0, make_cost(exp))
    board = build_board(view)
    assert TailSpread._wanted(view, board)  # both rollouts are ready, neither started
    board.claim_rollout("a/0/rollout", "a", [0, 1, 2, 3], 1, 0.0)
    assert TailSpread._wanted(view, board)  # b's still waits
    board.claim_rollout("b/0/rollout", "b", [4, 5, 6, 7], 1, 0.0)
    assert not TailSpread._wanted(view, board)
