"""Sub-stage graphs (DESIGN.md §2.1): per-worker rollout sub-stages and training stages with
dependency edges, built from (predicted or true) requests, with critical-path analysis."""

from jigsawrl.graph.substage import SubStageGraph, SubStageNode  # noqa: F401
