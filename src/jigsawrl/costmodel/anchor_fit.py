"""Fit the cost model's few global GPU constants to published verl runs (numpy only, no sims).

What: ``jigsawrl bench fidelity`` (:mod:`jigsawrl.bench.fidelity`) simulates each anchor of
``anchors/`` once to *probe* it — the tokens of each step, the samples, the generation time and
how it grows with the eager-decode cost — and hands the probes here. This module fits, from any
subset of the probes (leave-one-out: all but one):

- ``eager_iter_overhead_s_per_layer`` and ``kv_bw_eff`` — jointly, from the generation times
  of the per-stage anchors (verl's ``gen`` includes the weight sync, so the sync's offload
  transfers are in it): least squares of ``ln gen``, the simulated generation being (to a good
  approximation, checked by the final simulations) linear in the eager cost and in the KV
  cache's seconds per byte, and exactly linear in the sync's transfers
  (:meth:`AnchorProbe.gen_s`). The sync's fixed cost (``weight_sync_overhead_s``) is not fitted:
  with it free, the eager anchors trade it against the eager cost (a 13 s sync without A);
- the actor-update MFU size curve (``train_mfu_at_1b``, ``train_mfu_exponent``), the log-prob
  pass's MFU relative to it (``logprob_mfu_ratio``) and ``offload_bytes_per_s``, jointly: least
  squares of ``ln`` of the old log-prob, ref and actor-update times of the per-stage anchors,
  priced by the cost model itself (the same calls the simulator makes for a serial verl step,
  offload transfers included). PPO's critic stages are *not* fitted (one anchor has them, with
  settings its source does not give): they are predicted and reported;
- ``reward_s_per_sample`` — the smallest per-sample step time left outside the published stages
  over the per-stage anchors (that residual bounds the reward's cost from above; the smallest is
  the tightest bound).

Each fitted constant comes back with the anchors it came from (:class:`Fitted`). Everything else
in :class:`~.roofline.CostParams` keeps its documented default. Why least squares of the log:
the fidelity metric is the symmetric ``|ln(predicted / published)|``, so the fit minimises the
sum of its squares. The optimiser is a small Nelder-Mead (no scipy in band 1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from jigsawrl.costmodel.deploy import Deployment
from jigsawrl.costmodel.model import CostModel
from jigsawrl.costmodel.roofline import CostParams
from jigsawrl.stages import ROLLOUT_BANDS, VERL_TIMING, Stage
from jigsawrl.workload.accelerators import AcceleratorSpec
from jigsawrl.workload.models import ModelSpec


def verl_key(stages: tuple[Stage, ...]) -> str:
    """verl's timing key (``timing_s/<key>``) that measures ``stages`` (stages.VERL_TIMING)."""
    return next(key for key, value in VERL_TIMING.items() if value == stages)


# verl's names of the stages an anchor publishes (from stages.VERL_TIMING), and the extra keys
# of PPO's critic stages and of the step-level anchors.
GEN = verl_key(ROLLOUT_BANDS)
OLD_LOG_PROB = verl_key((Stage.OLD_LOGPROB,))
REF = verl_key((Stage.REF_LOGPROB,))
UPDATE_ACTOR = verl_key((Stage.ACTOR_UPDATE,))
VALUES = "values"
UPDATE_CRITIC = "update_critic"
STEP = "step"
THROUGHPUT = "throughput"  # prompt + response tokens per second per device
TRAIN_KEYS: dict[str, Stage] = {OLD_LOG_PROB: Stage.OLD_LOGPROB, REF: Stage.REF_LOGPROB,
                                UPDATE_ACTOR: Stage.ACTOR_UPDATE}
# The constants this module fits, in CostParams' names.
CURVE_KEYS = ("train_mfu_at_1b", "train_mfu_exponent", "logprob_mfu_ratio")
DECODE_KEYS = ("eager_iter_overhead_s_per_layer", "kv_bw_eff")
FITTED_KEYS = (*DECODE_KEYS, *CURVE_KEYS, "offload_bytes_per_s", "reward_s_per_sample")
# kv_bw_eff stays in this range (a fraction of the datasheet bandwidth).
KV_EFF_RANGE = (0.1, 1.0)
# Where every fit starts, and what a constant no anchor of the fit set constrains keeps:
# neutral values that carry no anchor's information (never CostParams' defaults, which *are*
# the all-anchor fit: starting a leave-one-out fit there would leak the held-out anchor back
# in). MFU 0.1 at 1B growing as sqrt(size); forward passes as
# efficient as the update; offload at a fifth of PCIe Gen5 (~11 GB/s); no eager cost; KV
# streamed like weights (hbm_bw_eff's 0.8).
NEUTRAL_START: dict[str, float] = {
    "train_mfu_at_1b": 0.1, "train_mfu_exponent": 0.5,
    "logprob_mfu_ratio": 1.0, "offload_bytes_per_s": 11e9,
    "eager_iter_overhead_s_per_layer": 0.0, "kv_bw_eff": 0.8, "reward_s_per_sample": 0.0,
}


@dataclass(frozen=True, slots=True)
class AnchorProbe:
    """What one simulation of an anchor tells the fit (see the module docstring).

    ``gen0_s`` is the simulated generation (rollout + weight sync, as verl's ``gen`` times it)
    under ``probe_params`` (no eager cost); ``gen_slope`` its growth per second of
    ``eager_iter_overhead_s_per_layer`` (0 when the rollout uses CUDA graphs), ``gen_kv_slope``
    per unit of ``1 / kv_bw_eff``. ``step_tokens``: prompt + response tokens per step.
    """

    name: str
    per_stage: bool
    accel: AcceleratorSpec
    model: ModelSpec
    n_devices: int
    devices_per_node: int
    deployment: Deployment
    step_tokens: tuple[int, ...]
    samples: int
    gen0_s: float
    gen_slope: float
    gen_kv_slope: float
    probe_params: CostParams
    published: dict[str, float]

    def cost_model(self, params: CostParams, *, critic: bool = True) -> CostModel:
        """The anchor's cost model under ``params`` (without the critic if not ``critic``)."""
        dep = self.deployment if critic else dataclasses.replace(self.deployment, critic=False)
        return CostModel(self.accel, deployment=dep,
                         params=dataclasses.replace(params,
                                                    devices_per_node=self.devices_per_node))

    def sync_s(self, params: CostParams) -> float:
        """The weight sync's fixed cost and offload transfers under ``params``."""
        cm = self.cost_model(params)
        return (params.weight_sync_overhead_s
                + cm.offload_time_s(self.model, Stage.WEIGHT_SYNC, self.n_devices))

    def gen_s(self, params: CostParams) -> float:
        """The generation time under ``params`` (the probe's linear model)."""
        p0 = self.probe_params
        kv, kv0 = (q.kv_bw_eff or q.hbm_bw_eff for q in (params, p0))
        return (self.gen0_s
                + self.gen_slope * (params.eager_iter_overhead_s_per_layer
                                    - p0.eager_iter_overhead_s_per_layer)
                + self.gen_kv_slope * (1.0 / kv - 1.0 / kv0)
                + self.sync_s(params) - self.sync_s(p0))


@dataclass(frozen=True, slots=True)
class Fitted:
    """One fitted constant: its value and the anchors it came from."""

    value: float
    sources: tuple[str, ...]


def training_times(probe: AnchorProbe, params: CostParams) -> dict[str, float]:
    """Old log-prob, ref and actor-update seconds of ``probe``'s steps under ``params`` (mean
    over its steps, offload transfers included, the critic left out of the update)."""
    cm = probe.cost_model(params, critic=False)
    n, m = probe.n_devices, probe.model
    out: dict[str, float] = {}
    for key, stage in TRAIN_KEYS.items():
        if key not in probe.published:
            continue
        times = []
        for tokens in probe.step_tokens:
            t = (cm.train_time_s(m, n, tokens) if stage == Stage.ACTOR_UPDATE
                 else cm.logprob_time_s(m, n, tokens))
            times.append(t + cm.offload_time_s(m, stage, n))
        out[key] = float(np.mean(times))
    return out


def _log_error(pred: float, pub: float) -> float:
    return math.log(max(pred, 1e-12) / pub)


def fit_decode(probes: Sequence[AnchorProbe], base: CostParams) -> dict[str, Fitted]:
    """The eager cost, ``kv_bw_eff`` and the sync's fixed cost, from the generation times
    (``base``: the other constants, the offload bandwidth among them)."""
    used = [p for p in probes if p.per_stage and GEN in p.published]
    eager = [p for p in used if p.gen_slope > 0.0]
    lo, hi = KV_EFF_RANGE
    kv0 = NEUTRAL_START["kv_bw_eff"]

    def params_of(x: np.ndarray) -> CostParams:  # c >= 0; kv in (lo, hi) by a logistic
        return dataclasses.replace(
            base, eager_iter_overhead_s_per_layer=abs(float(x[0])) * 1e-3,
            kv_bw_eff=lo + (hi - lo) / (1.0 + math.exp(-float(x[1]))))

    def loss(x: np.ndarray) -> float:
        params = params_of(x)
        return sum(_log_error(p.gen_s(params), p.published[GEN]) ** 2 for p in used)

    if not used:
        return {k: Fitted(NEUTRAL_START[k], ()) for k in DECODE_KEYS}
    x0 = np.array([NEUTRAL_START["eager_iter_overhead_s_per_layer"] * 1e3,
                   -math.log((hi - lo) / (kv0 - lo) - 1.0)])
    fitted = params_of(nelder_mead(loss, x0, np.array([0.2, 0.5])))
    names = tuple(p.name for p in used)
    c = (fitted.eager_iter_overhead_s_per_layer if eager
         else NEUTRAL_START["eager_iter_overhead_s_per_layer"])
    return {"eager_iter_overhead_s_per_layer": Fitted(c, tuple(p.name for p in eager)),
            "kv_bw_eff": Fitted(float(fitted.kv_bw_eff or 0.0), names)}


def fit_training(probes: Sequence[AnchorProbe], base: CostParams) -> dict[str, Fitted]:
    """The MFU size curve, the log-prob ratio and the offload bandwidth (module docstring)."""
    used = [p for p in probes if p.per_stage and any(k in p.published for k in TRAIN_KEYS)]
    offloaded = [p for p in used if p.deployment.param_offload or p.deployment.optimizer_offload
                 or p.deployment.ref_param_offload]
    start = NEUTRAL_START
    x0 = np.array([math.log(start["train_mfu_at_1b"]), start["train_mfu_exponent"],
                   math.log(start["logprob_mfu_ratio"]), math.log(start["offload_bytes_per_s"])])

    def params_of(x: np.ndarray) -> CostParams:
        return dataclasses.replace(base, train_mfu_at_1b=math.exp(float(x[0])),
                                   train_mfu_exponent=float(x[1]),
                                   logprob_mfu_ratio=math.exp(float(x[2])),
                                   offload_bytes_per_s=math.exp(float(x[3])))

    def loss(x: np.ndarray) -> float:
        params = params_of(x)
        total = 0.0
        for p in used:
            for key, t in training_times(p, params).items():
                total += _log_error(t, p.published[key]) ** 2
        return total

    x = nelder_mead(loss, x0, np.array([0.3, 0.2, 0.2, 0.5]))
    if not offloaded:  # nothing constrains the bandwidth: keep the neutral start
        x[3] = x0[3]
    fitted = params_of(x)
    names = tuple(p.name for p in used)
    out = {k: Fitted(float(getattr(fitted, k)), names) for k in CURVE_KEYS}
    out["offload_bytes_per_s"] = Fitted(fitted.offload_bytes_per_s,
                                        tuple(p.name for p in offloaded))
    return out


def fit_reward(probes: Sequence[AnchorProbe], default: float) -> Fitted:
    """``reward_s_per_sample``: the smallest per-sample residual of the published step."""
    best: tuple[float, str] | None = None
    for p in probes:
        if not p.per_stage or STEP not in p.published or p.samples <= 0:
            continue
        stages = sum(v for k, v in p.published.items() if k not in (STEP, THROUGHPUT))
        per_sample = max(0.0, p.published[STEP] - stages) / p.samples
        if best is None or per_sample < best[0]:
            best = (per_sample, p.name)
    if best is None:
        return Fitted(default, ())
    return Fitted(best[0], (best[1],))


def fit_constants(probes: Sequence[AnchorProbe], base: CostParams) -> dict[str, Fitted]:
    """Every fitted constant (:data:`FITTED_KEYS`) from ``probes``, each with its sources."""
    out = fit_training(probes, base)
    out.update(fit_decode(probes, apply(base, out)))
    out["reward_s_per_sample"] = fit_reward(probes, NEUTRAL_START["reward_s_per_sample"])
    return out


def apply(base: CostParams, fitted: dict[str, Fitted]) -> CostParams:
    """``base`` with the fitted values in place."""
    return dataclasses.replace(base, **{k: f.value for k, f in fitted.items()})


# ---------------------------------------------------------------- small optimisers (numpy)


def _golden(f: Callable[[float], float], lo: float, hi: float, iters: int = 80) -> float:
    """Minimum of a unimodal ``f`` on [lo, hi] by golden-section search."""
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2.0


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, scale: np.ndarray, *,
                iters: int = 1500, tol: float = 1e-10, restarts: int = 3) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (initial simplex steps ``scale``): the textbook method
    (reflection 1, expansion 2, contraction 0.5, shrink 0.5), restarted ``restarts`` times
    from its result with a fresh simplex (a collapsed simplex stalls it); deterministic."""
    x = np.array(x0, dtype=float)
    for _ in range(1 + restarts):
        x = _nelder_mead_once(f, x, scale, iters, tol)
    return x


def _nelder_mead_once(f: Callable[[np.ndarray], float], x0: np.ndarray, scale: np.ndarray,
                      iters: int, tol: float) -> np.ndarray:
    n = len(x0)
    simplex = [np.array(x0, dtype=float)]
    for i in range(n):
        x = np.array(x0, dtype=float)
        x[i] += scale[i]
        simplex.append(x)
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best + 0.5 * (x - best) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]
