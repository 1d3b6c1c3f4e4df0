"""Sub-stage graphs: structure, bands, barrier, critical path, staleness edges, prediction."""

from __future__ import annotations

import pytest

from jigsawrl.graph.build import (
    StepShape,
    build_step_graph,
    chain_steps,
    post_rollout_s,
    rollout_end_s,
)
from jigsawrl.graph.predict import HistoryPredictor, StepObservation
from jigsawrl.graph.substage import SubStageGraph, SubStageNode
from jigsawrl.stages import POST_ROLLOUT, Stage
from jigsawrl.workload.models import MODELS
from jigsawrl.workload.requests import RequestTruth, TurnTruth

M = MODELS["qwen3-0.6b"]


def shape(step: int = 0, devices: int = 2) -> StepShape:
    return StepShape("p", step, M, devices, 1, devices, kv_budget_tokens=100_000)


def reqs(*lengths: int) -> list[RequestTruth]:
    return [RequestTruth(f"r{i}", 10, (TurnTruth(n),)) for i, n in enumerate(lengths)]


def test_step_graph_has_per_rank_chains_and_barrier(fake_cost) -> None:  # noqa: ANN001
    g = build_step_graph(shape(), reqs(3, 6), fake_cost)
    stages = [n.stage for n in g.nodes.values()]
    assert stages.count(Stage.PREFILL) == 2
    assert set(POST_ROLLOUT) <= set(stages)
    reward = next(n for n, v in g.nodes.items() if v.stage == Stage.REWARD)
    assert len(g.pred[reward]) == 2  # barrier: both ranks
    length, path = g.critical_path()
    # rank 1 (prefill 0.1 + 6 decode) is the tail; then the training chain
    tokens = 10 + 3 + 10 + 6
    expected = 0.1 + 6 + 0.5 + 2 * 0.001 * tokens / 2 + 0.003 * tokens / 2 + 1.0
    assert length == pytest.approx(expected)
    assert g.nodes[path[0]].rank == 1 and g.nodes[path[-1]].stage == Stage.WEIGHT_SYNC


def test_a_graph_of_some_ranks_and_the_times_read_off_it(fake_cost) -> None:  # noqa: ANN001
    """``ranks`` keeps only those workers' rollout chains (the barrier then waits for them);
    ``rollout_end_s`` is the slowest kept chain, ``post_rollout_s`` each later stage."""
    full = build_step_graph(shape(), reqs(3, 6), fake_cost)
    first = build_step_graph(shape(), reqs(3, 6), fake_cost, ranks=(0,))
    assert {n.rank for n in first.nodes.values() if n.stage not in POST_ROLLOUT} == {0}
    reward = next(n for n, v in first.nodes.items() if v.stage == Stage.REWARD)
    assert len(first.pred[reward]) == 1
    assert rollout_end_s(full) == pytest.approx(0.1 + 6) and rollout_end_s(first) == pytest.approx(
        0.1 + 3)
    stages = post_rollout_s(full)
    assert list(stages) == list(POST_ROLLOUT) and stages == post_rollout_s(first)
    assert full.critical_path()[0] == pytest.approx(rollout_end_s(full) + sum(stages.values()))


def test_an_engines_batch_limit_shapes_the_graph(fake_cost) -> None:  # noqa: ANN001
    """``max_num_seqs`` 1: the second request waits for the first (two prefills in turn)."""
    one = StepShape("p", 0, M, 1, 1, 1, kv_budget_tokens=100_000, max_num_seqs=1)
    g = build_step_graph(one, reqs(3, 6), fake_cost)
    assert [n.stage for n in g.nodes.values()][:4] == [Stage.PREFILL, Stage.DECODE_SMALL,
                                                        Stage.PREFILL, Stage.DECODE_SMALL]
    assert rollout_end_s(g) == pytest.approx(2 * 0.1 + 3 + 6)


def test_boundness() -> None:
    n = SubStageNode("x", "p", 0, Stage.DECODE_SMALL, 0, 1.0)
    assert n.boundness == "memory"
    assert SubStageNode("y", "p", 0, Stage.ACTOR_UPDATE, 0, 1.0).boundness == "compute"
    assert SubStageNode("z", "p", 0, Stage.TOOL_WAIT, 0, 1.0).boundness == "idle"


def test_tool_wait_nodes(fake_cost) -> None:  # noqa: ANN001
    r = [RequestTruth("a", 10, (TurnTruth(2, 5.0, 4), TurnTruth(1)))]
    g = build_step_graph(shape(devices=1), r, fake_cost)
    kinds = [n.stage for n in g.nodes.values() if n.rank == 0 and n.stage != Stage.REWARD][:4]
    assert kinds == [Stage.PREFILL, Stage.DECODE_SMALL, Stage.TOOL_WAIT, Stage.PREFILL]
    wait = next(n for n in g.nodes.values() if n.stage == Stage.TOOL_WAIT)
    assert wait.duration_s == pytest.approx(5.0)


def test_chain_steps_sync_and_async(fake_cost) -> None:  # noqa: ANN001
    steps = [build_step_graph(shape(k), reqs(3, 6), fake_cost) for k in range(3)]
    sync_len, _ = chain_steps(steps).critical_path()
    one = steps[0].critical_path()[0]
    assert sync_len == pytest.approx(3 * one)
    steps = [build_step_graph(shape(k), reqs(3, 6), fake_cost) for k in range(3)]
    async_len, _ = chain_steps(steps, staleness=1).critical_path()
    assert async_len < sync_len  # rollout overlaps the previous step's training


def test_cycle_detected() -> None:
    g = SubStageGraph()
    g.add_node(SubStageNode("a", "p", 0, Stage.REWARD, 0, 1.0))
    g.add_node(SubStageNode("b", "p", 0, Stage.REWARD, 0, 1.0))
    g.add_edge("a", "b")
    g.add_edge("b", "a")
    with pytest.raises(ValueError, match="cycle"):
        g.topo_order()


def test_predictor_uses_history_quantiles() -> None:
    pred = HistoryPredictor(window=2)
    prior = pred.predict("p", 0, 4, [], 100, 500, 8192)
    assert [r.generated_tokens for r in prior] == [500] * 4
    hist = [StepObservation(0, (50,) * 4, (100, 200, 300, 4000), {}),
            StepObservation(1, (50,) * 4, (100, 200, 300, 4000), {})]
    got = pred.predict("p", 2, 4, hist, 100, 500, 8192, n_ranks=2)
    lengths = [r.generated_tokens for r in got]
    assert max(lengths) > 1000 and min(lengths) < 200
    assert lengths[0] == max(lengths) and lengths[2] == sorted(lengths)[-2]  # rank mix
    assert all(r.prompt_tokens == 50 for r in got)
