"""The cost model: how long each sub-stage takes on a device or a share of one, and what it holds.

One class serves two roles with the same code (DESIGN.md §3): a deterministic *belief* model that
schedulers forecast with (``noise_sigma=0``), and a *truth* model for the simulator, whose every
``*_time_s`` result is multiplied by an independent lognormal(0, noise_sigma) factor drawn from its
own seeded generator (median 1, so the belief is the truth's median).

:class:`CostModel` is assembled from its seams, one module each:

- :mod:`.core` — rates, the noise stream, link bandwidths (:class:`~.core.CostCore`);
- :mod:`.rollout_cost` — prefill and decode, with the closed-form decode spans;
- :mod:`.train_cost` — log-prob and update passes, weight sync, host moves, reward, dispatch;
- :mod:`.memory` — bytes per device (:class:`~.memory.MemoryCosts`);
- :mod:`.slowdown` — time at a compute share over time at the whole device;
- :mod:`.deploy` — the verl settings charged beyond the roofline (host offload, eager decode,
  PPO's critic), one :class:`~.deploy.Deployment` per cost model.

The GPU defaults of :class:`~.roofline.CostParams` that are not datasheet numbers are fitted to
published verl runs by :mod:`.anchor_fit` (``jigsawrl bench fidelity``, ``docs/FIDELITY.md``).

Callers outside the cost model type against :class:`~.protocol.CostModelProtocol`.
"""

from __future__ import annotations

from jigsawrl.costmodel import slowdown
from jigsawrl.costmodel.memory import MemoryCosts
from jigsawrl.costmodel.rollout_cost import RolloutCosts
from jigsawrl.costmodel.train_cost import TrainCosts
from jigsawrl.workload.models import ModelSpec


class CostModel(RolloutCosts, TrainCosts, MemoryCosts):
    """Times, FLOPs and memory of RL sub-stages on one accelerator type (see module docstring).

    Args:
        accel: the accelerator preset whose datasheet numbers the roofline scales.
        noise_sigma: 0 for the deterministic belief model; > 0 for a truth model whose
            ``*_time_s`` results carry independent lognormal(0, noise_sigma) factors.
        seed: seed of the truth model's own ``numpy.random.Generator``.
        params: efficiencies and overheads; :class:`~.roofline.CostParams` documents the defaults.
        deployment: the verl settings charged beyond the roofline (:mod:`.deploy`); default none.

    Raises:
        ValueError: on a negative ``noise_sigma``.
    """

    # ---------------------------------------------------------------- slowdown under a share

    def slowdown(self, stage: str, share: float, *, model: ModelSpec | None = None, tp: int = 1,
                 batch: int | None = None, ctx_tokens: int | None = None) -> float:
        """Time at ``share`` over time at full device, >= 1; see :mod:`.slowdown` for stages."""
        return slowdown.slowdown(self, stage, share, model=model, tp=tp, batch=batch,
                                 ctx_tokens=ctx_tokens)

    def slowdown_table(self, model: ModelSpec, tp: int = 1) -> dict[str, dict[float, float]]:
        """stage -> {share level: factor} at each stage's typical operating point."""
        return slowdown.slowdown_table(self, model, tp)
