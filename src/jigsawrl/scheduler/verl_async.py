"""verl's asynchronous recipes: ``verl-one-step-off`` and ``verl-fully-async``.

verl ships two recipes for off-policy training (``reference/peers.md``: "verl for async
pipelines"), which a careful verl user runs for an async pipeline so that "async vs verl"
compares scheduling, not an algorithm change (DESIGN.md §6). Both put the rollout engine on its
own devices beside the trainer, and both are the disaggregated machinery of
:mod:`jigsawrl.scheduler.streamrl` with verl's choices:

- **one-step-off** (``recipe/one_step_off_policy``): the rollout of step k+1 runs on the rollout
  devices while step k trains; one batch (one weight version) in flight; staleness 1 (or the
  pipeline's bound if lower: 0 for a sync pipeline, which then runs disaggregated and
  synchronously).
- **fully-async** (``recipe/fully_async_policy``): the rollouter streams on its own devices up to
  the pipeline's ``max_staleness`` versions ahead (η + 1 batches in flight, the rollout devices'
  compute split between them, as under ``areal``); the trainer takes samples from the
  rollouter's queue as they finish, so an async pipeline's batch is its first B finished
  groups, as under ``areal`` (``StartRollout.first_b``).
  Partial rollout (abort and resume on new weights) is off: here it only adds re-prefill time
  (its benefit is fresher samples, an algorithmic effect), so off is the stronger reading.

Both dispatch ``contiguous`` (verl has no length ranker). verl runs one job per pipeline, so the
placement is ``split`` (each pipeline its own deployment): the split of each pipeline's devices
into rollout and train devices is searched over the same candidates as StreamRL's
(:func:`~jigsawrl.scheduler.streamrl.split_plans`: the leanest trainer that holds the train
state, or half; rollout devices near an equal split, moved between pipelines by up to two TP
groups) and the best is kept, as a user tunes the split.

``verl`` (auto) includes these variants; built so (``only_async``), a recipe on a group with no
async pipeline fails fast and the runner skips it (the sync placements cover that group).
*Known gap:* jobs one after another, each disaggregated on the whole pool, are not searched.
"""

from __future__ import annotations

from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import Decision, PipelineView, View, register_policy
from jigsawrl.scheduler.rollout_tp import RolloutTP
from jigsawrl.scheduler.streamrl import (
    ROLLOUT_MEM_FRACTION,
    DisaggregatedPolicy,
    Placement,
    staleness_slots,
)


class VerlAsyncRecipe(DisaggregatedPolicy):
    """A verl async recipe (see the module docstring); subclasses pick the staleness and slots."""

    family = "verl-async"
    dispatch = "contiguous"
    placements = ("split",)

    def __init__(self, placement: Placement = "auto", allocation: int | None = None,
                 gpu_memory_utilization: float = ROLLOUT_MEM_FRACTION,
                 only_async: bool = False) -> None:
        if placement == "shared":
            raise ConfigError("verl's async recipes run one job per pipeline: placement split",
                              where="scheduler.params.placement")
        super().__init__(placement, allocation, gpu_memory_utilization)
        self.only_async = only_async

    def variants(self) -> list[DisaggregatedPolicy]:
        out = super().variants()
        for v in out:
            inner = v.inner if isinstance(v, RolloutTP) else v
            if isinstance(inner, VerlAsyncRecipe):
                inner.only_async = self.only_async
        return out

    def decide(self, view: View) -> Decision:
        if self.only_async and not any(p.spec.mode == "async" for p in view.pipelines):
            raise ConfigError(f"{self.family} is for async pipelines; this group has none",
                              where="pipelines.mode")
        return super().decide(view)


@register_policy("verl-one-step-off")
class VerlOneStepOffPolicy(VerlAsyncRecipe):
    """verl's one-step-off-policy recipe: see the module docstring."""

    family = "verl-one-step-off"

    def staleness(self, pv: PipelineView) -> int:
        return min(1, super().staleness(pv))


@register_policy("verl-fully-async")
class VerlFullyAsyncPolicy(VerlAsyncRecipe):
    """verl's fully-async recipe: see the module docstring."""

    family = "verl-fully-async"

    def rollout_slots(self, pv: PipelineView) -> int:
        return staleness_slots(pv)

    def first_b(self, pv: PipelineView) -> bool:
        """The trainer consumes the rollouter's queue of finished samples (module docstring)."""
        return pv.spec.mode == "async"


def async_recipes(gpu_memory_utilization: float = ROLLOUT_MEM_FRACTION) -> list[DisaggregatedPolicy]:
    """Every variant of both recipes, each failing fast on a group without async pipelines."""
    out: list[DisaggregatedPolicy] = []
    for cls in (VerlOneStepOffPolicy, VerlFullyAsyncPolicy):
        out += cls(gpu_memory_utilization=gpu_memory_utilization, only_async=True).variants()
    return out
