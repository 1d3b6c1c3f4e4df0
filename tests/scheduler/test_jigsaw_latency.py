"""Latency bounds (``max_latency_ratio``): jigsaw's plans are ranked by how far their predicted
step latencies exceed the bounds before their makespans (scheduler/jigsaw/latency.py)."""

from __future__ import annotations

import pytest

from jigsawrl.config import validate_config
from jigsawrl.driver.state import DriverState
from jigsawrl.experiments.resolve import resolve
from jigsawrl.experiments.simulated import make_cost, simulate, solo_latencies
from jigsawrl.scheduler.jigsaw.fallback import best_verl, verl_plans
from jigsawrl.scheduler.jigsaw.latency import MARGIN, LatencyBounds


def hetero(bound: float | None = None, steps: int = 2, batch: int = 16):  # noqa: ANN201
    """The paper's heterogeneous pair, small: a 0.6B GSM8K job beside an 8B MATH job on one
    8-GPU node (unbounded, jigsaw runs both at TP 8 in turns: the small one's steps wait for the
    large one's). One rollout engine per device (``colocate`` off): with two the small job's
    steps ran at 1.14x solo unbounded, and the bound had nothing to hold."""
    pipes = [{"name": "small", "model": "qwen3-0.6b", "task": "gsm8k", "batch_size": batch,
              "group_size": 4, "max_response_tokens": 8192, "steps": steps},
             {"name": "large", "model": "llama-3.1-8b", "task": "math", "batch_size": batch,
              "group_size": 4, "max_response_tokens": 8192, "steps": steps}]
    if bound is not None:
        pipes[0]["max_latency_ratio"] = bound
    return validate_config({"cluster": {"accelerator": "h100-80gb", "num_nodes": 1,
                                        "accelerators_per_node": 8},
                            "pipelines": pipes, "seed": 0,
                            "scheduler": {"name": "jigsaw", "params": {"colocate": False}}},
                           source="test")


def first_view(c):  # noqa: ANN001, ANN201
    exp = resolve(c)
    return DriverState(exp).view(0.0, make_cost(exp))


def test_no_bound_no_bounds() -> None:
    assert LatencyBounds.of(first_view(hetero())) is None


def test_excess_is_the_predicted_ratio_above_the_bound() -> None:
    b = LatencyBounds.of(first_view(hetero(1.5, steps=2)))
    assert b is not None and set(b.bound) == {"small"} and b.solo_s["small"] > 0
    solo = b.solo_s["small"]
    assert b.excess({"small": 2 * 1.4 * solo}) == 0.0  # 1.4x its solo step: within 1.5
    # plans are held to MARGIN below the bound: 1.45x is over it
    assert b.over({"small": 2 * 1.45 * solo})["small"] == pytest.approx(1.45 - 1.5 * (1 - MARGIN))
    assert b.over({"small": 2 * 2.0 * solo})["small"] == pytest.approx(2.0 - 1.5 * (1 - MARGIN))
    assert b.excess({"large": 1e9}) == 0.0  # an unbounded pipeline is not counted


def test_a_bounded_pipeline_stays_within_its_bound() -> None:
    """Unbounded, the small job runs at > 1.5x its solo step (it waits for the node the large
    job's TP-8 rollouts hold); with ``max_latency_ratio: 1.5`` jigsaw picks rollout TPs whose
    predicted latencies meet it, and the simulated run does."""
    solo = solo_latencies(hetero(), 0)

    def ratio(c) -> tuple[float, dict]:  # noqa: ANN001
        s = simulate(c, policy="jigsaw", solo=False).summary
        small = next(p for p in s["pipelines"] if p["name"] == "small")
        return small["mean_step_latency_s"] / solo["small"], s["policy_report"]

    free, _ = ratio(hetero())
    bounded, report = ratio(hetero(1.5))
    assert free > 1.5
    assert bounded <= 1.5
    assert report["plan"]["jigsaw_excess"] == 0.0 or report["plan"]["runs"] != "jigsaw"


def test_the_fallback_ranks_verl_placements_by_excess_first() -> None:
    """With bounds no verl placement can meet, the one chosen misses them least (not the
    fastest); without bounds, the fastest."""
    view = first_view(hetero(1.01, steps=2))
    bounds = LatencyBounds.of(view)
    plans = verl_plans(view, bounds=bounds)
    assert len(plans) > 1
    chosen = best_verl(view, bounds=bounds)
    assert chosen is not None
    assert chosen.excess == min(p.excess for p in plans)
    fastest = best_verl(view)
    assert fastest is not None and fastest.makespan_s == min(p.makespan_s for p in plans)
    assert fastest.excess == 0.0  # no bounds given: nothing counted


def test_the_width_planner_widens_the_pipeline_over_its_bound() -> None:
    """At the configured TPs (no TP search, no fallback), the width search grows the pipeline
    most over its bound first: unbounded the small job runs above 1.2x its solo step, bounded
    at 1.2 within it."""
    def run(bound: float | None) -> float:
        c = hetero(bound, steps=3, batch=32)
        c = c.model_copy(update={"scheduler": c.scheduler.model_copy(
            update={"params": {"tp_search": False, "fallback": False}})})
        s = simulate(c, policy="jigsaw", solo=False).summary
        small = next(p for p in s["pipelines"] if p["name"] == "small")
        return small["mean_step_latency_s"] / solo["small"]

    solo = solo_latencies(hetero(steps=3, batch=32), 0)
    assert run(None) > 1.2
    assert run(1.2) <= 1.2
