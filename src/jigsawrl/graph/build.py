"""Building a pipeline step's Sub-Stage Graph from requests (predicted or true).

Rollout sub-stages come from running the same continuous-batching model the simulator uses
(:class:`~jigsawrl.sim.rollout.RolloutInstance`) on each DP worker in isolation with the given cost
model; consecutive segments of one kind merge into one node, tool waits with no runnable request
become ``tool_wait`` nodes. The post-rollout stages follow verl's order behind a barrier (sync) —
the all-ranks edge into ``reward`` is the long-tail barrier the paper attacks.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection
from dataclasses import dataclass

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.graph.substage import SubStageGraph, SubStageNode
from jigsawrl.sim.rollout import ReqRun, RolloutInstance
from jigsawrl.stages import POST_ROLLOUT, Stage
from jigsawrl.workload.models import ModelSpec
from jigsawrl.workload.requests import RequestTruth


@dataclass(frozen=True, slots=True)
class StepShape:
    """What the graph of one step needs to know about the pipeline and its placement."""

    pipeline: str
    step: int
    model: ModelSpec
    rollout_devices: int
    rollout_tp: int
    train_devices: int
    kv_budget_tokens: int
    use_ref: bool = True
    ppo_epochs: int = 1
    max_num_seqs: int = 256  # an engine's batch limit (``sim.rollout.engine_limits``)


def split_ranks(requests: list[RequestTruth], n_ranks: int) -> list[list[RequestTruth]]:
    """verl's dispatch: contiguous equal chunks (a GRPO group's samples stay together)."""
    return [requests[len(requests) * r // n_ranks: len(requests) * (r + 1) // n_ranks]
            for r in range(n_ranks)]


def rank_segments(inst: RolloutInstance, *, t0: float = 0.0,
                  stop: Callable[[float, RolloutInstance], bool] | None = None,
                  until: float | None = None) -> list[tuple[str, float, float, int]]:
    """Run one instance alone to completion at full share: ``(kind, start, end, tokens)``.

    From time ``t0``; ``stop``: asked after each segment that leaves no tool call out, with the
    time and the instance; true stops there (the instance keeps its state, to be run on).
    ``until``: stop at that time, a decode segment in flight then cut there (as an executor
    interrupts it) — or, with a tool call out, at the first moment after it with none.

    Mirrors the simulated executor exactly: a tool result arriving during a decode segment
    interrupts it (the request joins at the next iteration); one arriving during a prefill waits
    for the prefill to end; while nothing is runnable the worker is in ``tool_wait``.
    """
    t = t0
    out: list[tuple[str, float, float, int]] = []
    tools: list[tuple[float, int, ReqRun]] = []
    seq = 0
    while not inst.done:
        while tools and tools[0][0] <= t:
            inst.tool_returned(heapq.heappop(tools)[2])
        if until is not None and t >= until and not tools:
            break
        seg = inst.next_segment(t, 1.0)
        if seg is None:
            nxt = tools[0][0]
            out.append((Stage.TOOL_WAIT, t, nxt, 0))
            t = nxt
            continue
        end = t + seg.duration_s
        if seg.iters and tools and tools[0][0] < end:
            res, seg = inst.interrupt(seg, tools[0][0])
            end = tools[0][0]
        elif seg.iters and until is not None and not tools and t < until < end:
            res, seg = inst.interrupt(seg, until)
            end = until
        else:
            res = inst.finish_segment(seg)
        out.append((seg.kind, t, end, seg.tokens))
        t = end
        for r in res.tool_calls:
            heapq.heappush(tools, (t + r.truth.turns[r.turn - 1].tool_latency_s, seq, r))
            seq += 1
        if stop is not None and not tools and not inst.done and stop(t, inst):
            break
    return out


def build_step_graph(shape: StepShape, requests: list[RequestTruth],
                     cost: CostModelProtocol, *,
                     ranks: Collection[int] | None = None) -> SubStageGraph:
    """The Sub-Stage Graph of one step (see the module docstring).

    ``ranks``: only these DP workers' rollout chains (default: every one) — a scheduler whose
    predicted requests are dealt so that every rank holds the same mix replays one (each
    replay costs a rank's continuous-batching run)."""
    g = SubStageGraph()
    p, s = shape.pipeline, shape.step
    n_ranks = max(1, shape.rollout_devices // shape.rollout_tp)
    last: list[str] = []
    for rank, reqs in enumerate(split_ranks(requests, n_ranks)):
        if ranks is not None and rank not in ranks:
            continue
        inst = RolloutInstance(f"{p}/{s}/{rank}", shape.model, shape.rollout_tp, cost,
                               kv_budget_tokens=shape.kv_budget_tokens,
                               max_num_seqs=shape.max_num_seqs)
        inst.add(reqs)
        prev = None
        for k, (kind, t0, t1, tokens) in enumerate(_merge(rank_segments(inst))):
            node = g.add_node(SubStageNode(f"{p}/{s}/{kind}/{rank}/{k}", p, s, kind, rank,
                                           t1 - t0, tokens=tokens, devices=shape.rollout_tp))
            if prev is not None:
                g.add_edge(prev, node.node_id)
            prev = node.node_id
        if prev is not None:
            last.append(prev)
    tokens = sum(r.total_tokens for r in requests)
    prev_ids = last
    for stage, dur in _train_stages(shape, tokens, len(requests), cost):
        node = g.add_node(SubStageNode(f"{p}/{s}/{stage}/0/0", p, s, stage, 0, dur,
                                       tokens=tokens, devices=shape.train_devices))
        for a in prev_ids:  # the first edge set is the sync barrier after rollout
            g.add_edge(a, node.node_id)
        prev_ids = [node.node_id]
    return g


def rollout_end_s(g: SubStageGraph) -> float:
    """When the step's rollout ends: the slowest rank's chain of rollout sub-stages (every node
    before the barrier into ``reward``), summed."""
    per_rank: dict[int, float] = {}
    for node in g.nodes.values():
        if node.stage not in POST_ROLLOUT:
            per_rank[node.rank] = per_rank.get(node.rank, 0.0) + node.duration_s
    return max(per_rank.values(), default=0.0)


def post_rollout_s(g: SubStageGraph) -> dict[str, float]:
    """Each post-rollout stage's duration in the graph, in verl's order."""
    return {n.stage: n.duration_s for n in g.nodes.values() if n.stage in POST_ROLLOUT}


def _merge(segs: list[tuple[str, float, float, int]]) -> list[tuple[str, float, float, int]]:
    out: list[tuple[str, float, float, int]] = []
    for kind, t0, t1, tok in segs:
        if out and out[-1][0] == kind:
            k, a, _, n = out[-1]
            out[-1] = (k, a, t1, n + tok)
        else:
            out.append((kind, t0, t1, tok))
    return out


def post_rollout_stages(cost: CostModelProtocol, model: ModelSpec, n: int, tokens: int,
                        samples: int, *,
                        use_ref: bool = True, ppo_epochs: int = 1,
                        rollout_tp: int = 1) -> dict[str, float]:
    """Full-share durations of a step's post-rollout stages on ``n`` training devices, in
    verl's order (reward on the CPU, old / ref log-probs, update, weight sync)."""
    out = {Stage.REWARD: cost.reward_time_s(samples),
           Stage.OLD_LOGPROB: cost.logprob_time_s(model, n, tokens)}
    if use_ref:
        out[Stage.REF_LOGPROB] = cost.logprob_time_s(model, n, tokens)
    out[Stage.ACTOR_UPDATE] = ppo_epochs * cost.train_time_s(model, n, tokens)
    out[Stage.WEIGHT_SYNC] = cost.weight_sync_time_s(model, n, rollout_tp)
    return out


def _train_stages(shape: StepShape, tokens: int, samples: int,
                  cost: CostModelProtocol) -> list[tuple[str, float]]:
    return list(post_rollout_stages(cost, shape.model, shape.train_devices, tokens, samples,
                                    use_ref=shape.use_ref, ppo_epochs=shape.ppo_epochs,
                                    rollout_tp=shape.rollout_tp).items())


def chain_steps(graphs: list[SubStageGraph], staleness: int = 0) -> SubStageGraph:
    """Join per-step graphs of one pipeline: rollout of step k waits for the weight sync of step
    k - 1 - staleness (0 = synchronous); training is sequential across steps."""
    g = SubStageGraph()
    for sg in graphs:
        g.merge(sg)
    for k, sg in enumerate(graphs):
        if k == 0:
            continue
        dep = k - 1 - staleness
        if dep >= 0:
            sync = _stage_node(graphs[dep], Stage.WEIGHT_SYNC)
            for src in sg.sources():
                g.add_edge(sync, src)
        g.add_edge(_stage_node(graphs[k - 1], Stage.ACTOR_UPDATE), _stage_node(sg, Stage.REWARD))
    return g


def _stage_node(g: SubStageGraph, stage: str) -> str:
    return next(n for n, node in g.nodes.items() if node.stage == stage)
