"""A resolved experiment: a validated config with its presets looked up.

:class:`Experiment` is what the driver, the executors and the policies read (presets, not names);
it is built by :func:`jigsawrl.experiments.resolve.resolve` (simulated runs) or
:func:`jigsawrl.experiments.resolve.resolve_real` (real runs on Ray), which check feasibility.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsawrl.config import ExperimentConfig, PipelineSpec
from jigsawrl.workload.accelerators import AcceleratorSpec
from jigsawrl.workload.models import ModelSpec
from jigsawrl.workload.task_presets import RequestSampler, TaskSpec

# vLLM reserves this fraction of device memory for weights + KV cache by default in verl's
# example configs (actor_rollout_ref.rollout.gpu_memory_utilization: 0.5–0.6); we use 0.6.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.6


@dataclass(frozen=True, slots=True)
class ResolvedPipeline:
    index: int
    spec: PipelineSpec
    model: ModelSpec
    task: TaskSpec
    sampler: RequestSampler


@dataclass(frozen=True, slots=True)
class Experiment:
    config: ExperimentConfig
    accelerator: AcceleratorSpec
    pipelines: tuple[ResolvedPipeline, ...]

    @property
    def num_devices(self) -> int:
        return self.config.cluster.num_devices

    @property
    def price_per_hour(self) -> float:
        p = self.config.cluster.price_per_hour
        return self.accelerator.price_per_hour_usd if p is None else p

    def pipeline(self, name: str) -> ResolvedPipeline:
        for p in self.pipelines:
            if p.spec.name == name:
                return p
        raise KeyError(name)

    def node_of(self, device: int) -> int:
        return device // self.config.cluster.accelerators_per_node
