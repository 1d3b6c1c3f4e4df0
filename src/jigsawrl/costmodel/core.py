"""The common core of the cost model: hardware rates, the truth model's noise stream, links.

:class:`CostCore` holds what every side of :class:`~jigsawrl.costmodel.model.CostModel` reads —
the accelerator, the :class:`~jigsawrl.costmodel.roofline.CostParams`, the effective compute and
HBM rates, and the seeded lognormal noise — so that the rollout side
(:mod:`.rollout_cost`), the training side (:mod:`.train_cost`) and the memory side
(:class:`~jigsawrl.costmodel.memory.MemoryCosts`) can each live in their own module.

Noise: with ``noise_sigma > 0`` every ``*_time_s`` result is multiplied by an independent
lognormal(0, noise_sigma) factor drawn from the model's own seeded generator (median 1, so the
belief is the truth's median); a caller can pass the factor instead (``noise=``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jigsawrl.costmodel.deploy import DEFAULT_DEPLOYMENT, Deployment
from jigsawrl.costmodel.roofline import CostParams, tp_allreduce_s
from jigsawrl.workload.accelerators import AcceleratorSpec
from jigsawrl.workload.models import ModelSpec

# Noise factors are drawn in blocks (one numpy call per block keeps the hot paths plain floats).
NOISE_BLOCK = 4096


def check_share(share: float) -> None:
    """Raise ValueError unless ``share`` is a compute share in (0, 1]."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"compute share must be in (0, 1], got {share}")


class CostCore:
    """Rates, noise and link helpers shared by the cost model's sides.

    Args:
        accel: the accelerator preset whose datasheet numbers the roofline scales.
        noise_sigma: 0 for the deterministic belief model; > 0 for a truth model whose
            ``*_time_s`` results carry independent lognormal(0, noise_sigma) factors.
        seed: seed of the truth model's own ``numpy.random.Generator``.
        params: efficiencies and overheads; :class:`CostParams` documents the defaults.
        deployment: the verl settings charged beyond the roofline (offload, eager decode, PPO's
            critic; :mod:`.deploy`), for every pipeline this model costs. Default: none of them.

    Raises:
        ValueError: on a negative ``noise_sigma``.
    """

    def __init__(self, accel: AcceleratorSpec, *, noise_sigma: float = 0.0, seed: int = 0,
                 params: CostParams | None = None,
                 deployment: Deployment | None = None) -> None:
        if noise_sigma < 0.0 or not math.isfinite(noise_sigma):
            raise ValueError(f"noise_sigma must be a finite number >= 0, got {noise_sigma}")
        self.accel = accel
        self.params = params or CostParams()
        self.deployment = deployment or DEFAULT_DEPLOYMENT
        self.noise_sigma = float(noise_sigma)
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._noise: list[float] = []
        self._noise_pos = 0
        p = self.params
        self._prefill_rate = accel.peak_flops * p.prefill_eff
        self._decode_rate = accel.peak_flops * p.decode_compute_eff
        self._hbm_rate = accel.hbm_bytes_per_s * p.hbm_bw_eff
        # KV bytes cost this many weight-streaming bytes (decode attention reaches kv_bw_eff).
        self._kv_scale = 1.0 if p.kv_bw_eff is None else p.hbm_bw_eff / p.kv_bw_eff
        # Per layer per decode iteration without CUDA graphs (0 with graphs).
        self._eager_per_layer = (p.eager_iter_overhead_s_per_layer
                                 if self.deployment.enforce_eager else 0.0)
        # (id(model), tp, share) -> the decode lines' constants (RolloutCosts._line_consts)
        self._line_cache: dict[tuple[int, int, float], tuple[Any, ...]] = {}
        # (id(model), tp, share, batch) -> what of them depends on the batch only
        self._batch_cache: dict[tuple[int, int, float, int], tuple[Any, ...]] = {}

    # ---------------------------------------------------------------- noise

    def draw_noise(self) -> float:
        """Next lognormal(0, noise_sigma) factor of this model's stream (1.0 when sigma is 0)."""
        if self.noise_sigma == 0.0:
            return 1.0
        if self._noise_pos >= len(self._noise):
            z = self._rng.standard_normal(NOISE_BLOCK)
            self._noise = np.exp(self.noise_sigma * z).tolist()
            self._noise_pos = 0
        f = self._noise[self._noise_pos]
        self._noise_pos += 1
        return f

    def _out(self, t: float, noise: float | None) -> float:
        if noise is None:
            return t * self.draw_noise() if self.noise_sigma else t
        return t * noise

    # ---------------------------------------------------------------- helpers

    def train_rate(self, model: ModelSpec) -> float:
        """FLOP/s of one device in an actor update of ``model`` (peak x the size curve)."""
        return self.accel.peak_flops * self.params.train_mfu(model.num_params)

    def logprob_rate(self, model: ModelSpec) -> float:
        """FLOP/s of one device in a forward-only log-prob pass of ``model``."""
        return self.accel.peak_flops * self.params.logprob_mfu(model.num_params)

    def _bw(self, share: float) -> float:
        s_sat = self.params.s_sat
        return self._hbm_rate * (share / s_sat if share < s_sat else 1.0)

    def _link_bw(self, n_devices: int) -> float:
        if n_devices <= self.params.devices_per_node:
            return self.accel.intra_node_bytes_per_s
        return self.accel.inter_node_bytes_per_s

    def _tp_comm(self, model: ModelSpec, tokens: float, tp: int) -> float:
        if tp <= 1:
            return 0.0
        return tp_allreduce_s(model, tokens, tp, self._link_bw(tp), self.params.allreduce_latency_s)
