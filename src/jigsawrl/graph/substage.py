"""The Sub-Stage Graph: nodes are sub-stages of one pipeline step on one worker, edges are
dependencies.

Each node carries its estimated duration at full share, its FLOPs, memory and *boundness*
(``compute`` for prefill, large-batch decode and training; ``memory`` for small-batch decode;
``idle`` for tool waits; ``host`` for reward and transfers) — what the scheduler needs to pair
complementary sub-stages. Node IDs derive from structure: ``{pipeline}/{step}/{stage}/{rank}/{k}``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from jigsawrl.stages import Stage

BOUNDNESS: dict[Stage, str] = {
    Stage.PREFILL: "compute", Stage.DECODE_LARGE: "compute", Stage.DECODE_MEDIUM: "memory",
    Stage.DECODE_SMALL: "memory", Stage.TOOL_WAIT: "idle", Stage.REWARD: "host",
    Stage.OLD_LOGPROB: "compute", Stage.REF_LOGPROB: "compute", Stage.ACTOR_UPDATE: "compute",
    Stage.WEIGHT_SYNC: "host", Stage.OFFLOAD: "host", Stage.ONLOAD: "host",
    Stage.MIGRATE: "compute",
}


@dataclass(frozen=True, slots=True)
class SubStageNode:
    node_id: str
    pipeline: str
    step: int
    stage: str
    rank: int
    duration_s: float
    flops: float = 0.0
    tokens: int = 0
    mem_bytes: float = 0.0
    devices: int = 1  # devices the node occupies (TP group, or the training group)

    @property
    def boundness(self) -> str:
        return BOUNDNESS.get(self.stage, "compute")


@dataclass(slots=True)
class SubStageGraph:
    """A DAG of sub-stage nodes."""

    nodes: dict[str, SubStageNode] = field(default_factory=dict)
    succ: dict[str, list[str]] = field(default_factory=dict)
    pred: dict[str, list[str]] = field(default_factory=dict)

    def add_node(self, node: SubStageNode) -> SubStageNode:
        if node.node_id in self.nodes:
            raise ValueError(f"duplicate node {node.node_id}")
        self.nodes[node.node_id] = node
        self.succ[node.node_id] = []
        self.pred[node.node_id] = []
        return node

    def add_edge(self, a: str, b: str) -> None:
        if a not in self.nodes or b not in self.nodes:
            raise KeyError(f"edge {a} -> {b}: unknown node")
        self.succ[a].append(b)
        self.pred[b].append(a)

    def merge(self, other: SubStageGraph) -> None:
        for n in other.nodes.values():
            self.add_node(n)
        for a, bs in other.succ.items():
            for b in bs:
                self.add_edge(a, b)

    def sources(self) -> list[str]:
        return [n for n, p in self.pred.items() if not p]

    def sinks(self) -> list[str]:
        return [n for n, s in self.succ.items() if not s]

    def topo_order(self) -> list[str]:
        """Kahn's algorithm; raises ValueError on a cycle."""
        indeg = {n: len(p) for n, p in self.pred.items()}
        ready = deque(n for n, d in indeg.items() if d == 0)
        order: list[str] = []
        while ready:
            n = ready.popleft()
            order.append(n)
            for m in self.succ[n]:
                indeg[m] -= 1
                if indeg[m] == 0:
                    ready.append(m)
        if len(order) != len(self.nodes):
            raise ValueError("sub-stage graph has a cycle")
        return order

    def critical_path(self) -> tuple[float, list[str]]:
        """Longest path by duration: a lower bound on the graph's completion time on any
        resources at full share (no node can start before its predecessors end)."""
        finish: dict[str, float] = {}
        best_pred: dict[str, str | None] = {}
        for n in self.topo_order():
            preds = self.pred[n]
            p = max(preds, key=lambda x: finish[x]) if preds else None
            start = finish[p] if p is not None else 0.0
            finish[n] = start + self.nodes[n].duration_s
            best_pred[n] = p
        if not finish:
            return 0.0, []
        end = max(finish, key=lambda x: finish[x])
        path = [end]
        while (p := best_pred[path[-1]]) is not None:
            path.append(p)
        return finish[end], path[::-1]

    def total(self, stages: Iterable[str] | None = None) -> float:
        keep = set(stages) if stages is not None else None
        return sum(n.duration_s for n in self.nodes.values()
                   if keep is None or n.stage in keep)
