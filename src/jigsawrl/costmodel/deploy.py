"""How a pipeline's verl job runs its stages: what the cost model charges beyond the roofline.

Why: the published verl runs the cost model is held to (``reference/gpu-anchors.md``,
``docs/FIDELITY.md``) differ in settings that move stage times by 1.5-3x: the actor's parameters
and optimizer state offloaded to host memory between calls, the reference model kept in host
memory, the rollout run without CUDA graphs, and PPO's critic. A :class:`Deployment` carries
those settings from a pipeline's config (:func:`deployment_of`) to the cost model:

- ``param_offload`` (verl ``actor.fsdp_config.param_offload``): the actor's fp32 parameter
  shard is loaded to the device and offloaded again around each actor call — the old log-prob,
  the update and the weight sync (verl's sharding manager loads the actor to gather its weights);
- ``optimizer_offload`` (``actor.fsdp_config.optimizer_offload``): Adam's fp32 m and v are
  loaded and offloaded around each update;
- ``ref_param_offload`` (``ref.fsdp_config.param_offload``): FSDP's CPU offload of the
  reference model copies its bf16 shard to the device for every micro-batch of the ref pass;
- ``enforce_eager`` (``rollout.enforce_eager``): decode iterations launch every kernel from
  Python instead of replaying a CUDA graph, a cost per layer per iteration;
- ``critic`` (``algorithm: ppo``): a value model of the actor's shape; its forward (verl's
  ``values``) and update (``update_critic``) are charged *inside the actor-update stage*
  (simplification: the scheduler has no critic stages; the step time is the same, the split
  between stages is not — :meth:`~.train_cost.TrainCosts.critic_time_s` gives the split).

The transfers are priced at ``CostParams.offload_bytes_per_s`` (fitted to the anchors) and
charged per call in :meth:`~.train_cost.TrainCosts.dispatch_time_s`; the eager cost in the
decode lines; the critic in :meth:`~.train_cost.TrainCosts.train_time_s`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from jigsawrl.config import PipelineSpec
from jigsawrl.errors import ConfigError

# Bytes per parameter of what verl's offload moves: the actor's FSDP flat parameters are fp32
# (verl loads the actor in fp32 and computes in bf16 through FSDP mixed precision); Adam keeps
# two fp32 moments; the reference model is loaded in bf16.
ACTOR_PARAM_BYTES = 4.0
ADAM_STATE_BYTES = 8.0
REF_PARAM_BYTES = 2.0


@dataclass(frozen=True, slots=True)
class Deployment:
    """One pipeline's verl settings that the cost model charges for (module docstring).

    ``samples_per_step`` and ``micro_batch_seqs`` size the ref pass's micro-batches (FSDP's CPU
    offload copies the shard once per micro-batch): ``ceil(samples / devices / micro_batch)``.
    """

    param_offload: bool = False
    optimizer_offload: bool = False
    ref_param_offload: bool = False
    enforce_eager: bool = False
    critic: bool = False
    samples_per_step: int = 0
    micro_batch_seqs: int = 64

    def __post_init__(self) -> None:
        if self.samples_per_step < 0 or self.micro_batch_seqs < 1:
            raise ValueError("Deployment.samples_per_step must be >= 0 and micro_batch_seqs >= 1")

    def ref_micro_batches(self, n_devices: int) -> int:
        """Micro-batches of one ref pass per device (at least 1)."""
        per_device = self.samples_per_step / max(1, n_devices)
        return max(1, math.ceil(per_device / self.micro_batch_seqs))


DEFAULT_DEPLOYMENT = Deployment()


def deployment_of(spec: PipelineSpec) -> Deployment:
    """The deployment a pipeline's config asks for (``train.*_offload``,
    ``rollout.enforce_eager``, ``algorithm``, its batch and ``train.micro_batch_size``)."""
    return Deployment(param_offload=spec.train.param_offload,
                      optimizer_offload=spec.train.optimizer_offload,
                      ref_param_offload=spec.train.ref_param_offload,
                      enforce_eager=spec.rollout.enforce_eager,
                      critic=spec.algorithm == "ppo",
                      samples_per_step=spec.batch_size * spec.group_size,
                      micro_batch_seqs=spec.train.micro_batch_size)


FLAGS = ("param_offload", "optimizer_offload", "ref_param_offload", "enforce_eager", "critic")


def pool_deployment(specs: Sequence[PipelineSpec]) -> Deployment:
    """The one deployment a simulated pool charges for every pipeline.

    A :class:`~jigsawrl.costmodel.model.CostModel` charges one deployment for all the pipelines
    it costs, so the simulator needs them to agree on the flags (offloads, eager decode, critic).
    The ref pass's micro-batching is sized by the largest step (more micro-batches: the
    costlier reading, and only charged with ``ref_param_offload``).

    Raises:
        ConfigError: pipelines that differ in a flag (names the key and the pipelines).
    """
    if not specs:
        return DEFAULT_DEPLOYMENT
    deps = [deployment_of(s) for s in specs]
    for flag in FLAGS:
        values = {getattr(d, flag) for d in deps}
        if len(values) > 1:
            on = [s.name for s, d in zip(specs, deps, strict=True) if getattr(d, flag)]
            key = "algorithm (ppo)" if flag == "critic" else (
                f"rollout.{flag}" if flag == "enforce_eager" else f"train.{flag}")
            raise ConfigError(
                f"pipelines differ in {key} (on for {', '.join(on)} only); the simulator charges "
                "one deployment for the whole pool", where="pipelines",
                fix=f"set {key} alike on every pipeline, or simulate them in separate configs")
    widest = max(deps, key=lambda d: (d.samples_per_step, -d.micro_batch_seqs))
    return widest
