"""Multi-node placement with Ray's local test cluster: two "nodes" of one device each.

Each node of ``ray.cluster_utils.Cluster`` is a separate raylet on this machine advertising one
``jigsaw_device``; the run must place device 0 and device 1 on different nodes (the placement
group cannot fit both bundles on one) and still finish a real pipeline on both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from ray.cluster_utils import Cluster  # noqa: E402

from jigsawrl.config import load_config  # noqa: E402
from jigsawrl.events import SampleFinished, StepFinished  # noqa: E402
from jigsawrl.executors.raycluster.placement import enable_token_auth  # noqa: E402
from jigsawrl.experiments.real import run_real  # noqa: E402


@pytest.fixture
def two_nodes() -> Any:
    if ray.is_initialized():
        ray.shutdown()
    enable_token_auth()
    cluster = Cluster(initialize_head=True, connect=True,
                      head_node_args={"num_cpus": 1, "resources": {"jigsaw_device": 1}})
    cluster.add_node(num_cpus=1, resources={"jigsaw_device": 1})
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_devices_on_two_nodes(two_nodes: Any, tmp_path: Path) -> None:
    cfg = load_config("configs/real/multi.yaml", [
        "pipelines.0.steps=1", "pipelines.0.batch_size=2", "pipelines.0.group_size=2",
        "pipelines.0.train.warmup_steps=2", "cluster.num_nodes=2",
        "cluster.accelerators_per_node=1"])
    cfg = cfg.model_copy(update={"pipelines": cfg.pipelines[:1]})
    nodes: list[Any] = []
    summary, events = run_real(cfg, address=two_nodes.address, cache_dir=tmp_path,
                               executor_hook=nodes.append)
    assert len(set(nodes[0].device_nodes())) == 2, "both devices landed on one node"
    assert summary["failed_pipelines"] == []
    assert sum(isinstance(e, StepFinished) for e in events) == 1
    assert sum(isinstance(e, SampleFinished) for e in events) == 4
