"""The cost model: how long each sub-stage takes on a device or a share of one, and what it holds.

One class serves two roles with the same code (DESIGN.md §3): a deterministic *belief* model that
schedulers forecast with (``noise_sigma=0``), and a *truth* model for the simulator, whose every
``*_time_s`` result is multiplied by an independent lognormal(0, noise_sigma) factor drawn from its
own seeded generator (median 1, so the belief is the truth's median).

The hot paths (:meth:`CostModel.prefill_time_s`, :meth:`CostModel.decode_span_time_s`,
:meth:`CostModel.decode_iters_within`) are called ~10^5 times per simulation, so they are plain
float math: no arrays, no per-call containers.

Decode, as a roofline: one iteration decoding ``batch`` tokens with ``ctx`` KV tokens (summed over
the batch) takes ``k + max(c0 + c1*i, m0 + m1*i)`` at iteration ``i`` of a span, since the context
grows by ``batch`` per iteration: both the compute line and the memory line are linear in ``i``,
so a span is a sum over at most two arithmetic series (closed form), and its inverse is a
quadratic root per series, corrected to the exact integer.

Truth-model recipe for a span interrupted by a share change: draw ``f = cm.draw_noise()``, time
the span as ``cm.decode_span_time_s(..., noise=f)``, and on interruption after ``t`` seconds ask
``cm.decode_iters_within(..., t, noise=f)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from jigsawrl.costmodel import memory, slowdown
from jigsawrl.costmodel.roofline import (
    FP32_BYTES,
    CostParams,
    decode_flops,
    kv_bytes_per_token_per_device,
    logprob_flops,
    overlap_comm,
    prefill_flops,
    ring_collective_s,
    tp_allreduce_s,
    train_flops,
)
from jigsawrl.workload.accelerators import AcceleratorSpec
from jigsawrl.workload.models import ModelSpec

_NOISE_BLOCK = 4096
# Adam step per parameter: read fp32 master, m, v, fp32 grad (16 B); write master, m, v (12 B)
# and the bf16 working copy (2 B).
_ADAM_BYTES_PER_PARAM = 30.0
# FSDP gradient reduce-scatter in fp32 (verl's default reduce_dtype), params gathered in bf16.
_GRAD_REDUCE_BYTES_PER_PARAM = 4.0


def _check_share(share: float) -> None:
    if not 0.0 < share <= 1.0:
        raise ValueError(f"compute share must be in (0, 1], got {share}")


def _line_sum(a0: float, a1: float, lo: float, hi: float) -> float:
    """sum_{i=lo}^{hi-1} (a0 + a1*i) for integers lo <= hi."""
    return (hi - lo) * a0 + a1 * (hi * (hi - 1.0) - lo * (lo - 1.0)) * 0.5


def _regimes(c0: float, c1: float, m0: float, m1: float) -> tuple[float, float, float, float, float]:
    """Split max(c0 + c1*i, m0 + m1*i) over i >= 0 into two lines.

    Returns ``(n_x, a0, a1, b0, b1)``: line a dominates for ``i < n_x`` (possibly ``inf``), line b
    from there on.
    """
    d0 = c0 - m0
    d1 = c1 - m1
    if d1 == 0.0 or (d1 > 0.0 and d0 >= 0.0):
        return (math.inf, c0, c1, c0, c1) if d0 >= 0.0 else (math.inf, m0, m1, m0, m1)
    if d1 < 0.0 and d0 <= 0.0:
        return math.inf, m0, m1, m0, m1
    if d1 > 0.0:  # memory-bound first; compute overtakes from i >= -d0/d1
        return float(math.ceil(-d0 / d1)), m0, m1, c0, c1
    return float(math.ceil(d0 / -d1)), c0, c1, m0, m1  # compute first; memory overtakes


def _span(k: float, c0: float, c1: float, m0: float, m1: float, n: float) -> float:
    """sum_{i<n} k + max(c0 + c1*i, m0 + m1*i), exactly, for an integer n >= 0."""
    n_x, a0, a1, b0, b1 = _regimes(c0, c1, m0, m1)
    if n <= n_x:
        return k * n + _line_sum(a0, a1, 0.0, n)
    return k * n + _line_sum(a0, a1, 0.0, n_x) + _line_sum(b0, b1, n_x, n)


def _series_count(first: float, step: float, budget: float) -> float:
    """Real m >= 0 with sum_{j<m} (first + step*j) == budget (first > 0, step >= 0)."""
    if budget <= 0.0:
        return 0.0
    b = first - 0.5 * step
    root = math.sqrt(b * b + 2.0 * step * budget)
    if b > 0.0:  # numerically stable form when b > 0
        return 2.0 * budget / (b + root)
    return (root - b) / step  # b <= 0 implies step > 0 (first > 0)


class CostModel:
    """Times, FLOPs and memory of RL sub-stages on one accelerator type (see module docstring).

    Args:
        accel: the accelerator preset whose datasheet numbers the roofline scales.
        noise_sigma: 0 for the deterministic belief model; > 0 for a truth model whose
            ``*_time_s`` results carry independent lognormal(0, noise_sigma) factors.
        seed: seed of the truth model's own ``numpy.random.Generator``.
        params: efficiencies and overheads; :class:`CostParams` documents the defaults.

    Raises:
        ValueError: on a negative ``noise_sigma``.
    """

    def __init__(self, accel: AcceleratorSpec, *, noise_sigma: float = 0.0, seed: int = 0,
                 params: CostParams | None = None) -> None:
        if noise_sigma < 0.0 or not math.isfinite(noise_sigma):
            raise ValueError(f"noise_sigma must be a finite number >= 0, got {noise_sigma}")
        self.accel = accel
        self.params = params or CostParams()
        self.noise_sigma = float(noise_sigma)
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._noise: list[float] = []
        self._noise_pos = 0
        p = self.params
        self._prefill_rate = accel.peak_flops * p.prefill_eff
        self._decode_rate = accel.peak_flops * p.decode_compute_eff
        self._train_rate = accel.peak_flops * p.train_eff
        self._logprob_rate = accel.peak_flops * p.logprob_eff
        self._hbm_rate = accel.hbm_bytes_per_s * p.hbm_bw_eff

    # ---------------------------------------------------------------- noise

    def draw_noise(self) -> float:
        """Next lognormal(0, noise_sigma) factor of this model's stream (1.0 when sigma is 0)."""
        if self.noise_sigma == 0.0:
            return 1.0
        if self._noise_pos >= len(self._noise):
            z = self._rng.standard_normal(_NOISE_BLOCK)
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

    def _decode_lines(self, model: ModelSpec, tp: int, batch: int, ctx_tokens: float,
                      share: float) -> tuple[float, float, float, float, float]:
        """(k, c0, c1, m0, m1): iteration i of a span takes k + max(c0 + c1 i, m0 + m1 i)."""
        _check_share(share)
        p = self.params
        comp = self._decode_rate * share * tp
        bw = self._bw(share)
        attn = model.attn_flops_per_token_per_ctx()
        kv = kv_bytes_per_token_per_device(model, tp)
        c0 = (2.0 * model.num_params * batch + attn * ctx_tokens) / comp
        c1 = attn * batch / comp
        m0 = (model.weight_bytes() / tp + kv * ctx_tokens) / bw
        m1 = kv * batch / bw
        k = p.iter_overhead_s + p.iter_overhead_per_seq_s * batch + self._tp_comm(model, batch, tp)
        return k, c0, c1, m0, m1

    # ---------------------------------------------------------------- rollout

    def prefill_time_s(self, model: ModelSpec, tp: int, new_tokens: int, ctx_tokens: int = 0,
                       share: float = 1.0, *, num_seqs: int = 1,
                       noise: float | None = None) -> float:
        """One engine iteration prefilling ``new_tokens`` over ``ctx_tokens`` cached tokens.

        Compute-bound for all but tiny prefills: ``max(flops / compute, bytes / bandwidth)`` plus
        the iteration overhead and the TP all-reduces. ``num_seqs``: how many sequences the new
        (and cached) tokens belong to, for the causal attention term (1 = one long sequence, an
        upper bound for batched prompts). ``noise``: the factor to apply instead of a fresh draw.
        """
        _check_share(share)
        if new_tokens <= 0:
            return 0.0
        p = self.params
        flops = prefill_flops(model, new_tokens, ctx_tokens, num_seqs)
        compute = flops / (self._prefill_rate * share * tp)
        kv = kv_bytes_per_token_per_device(model, tp)
        mem = (model.weight_bytes() / tp + kv * (ctx_tokens + new_tokens)) / self._bw(share)
        t = (compute if compute > mem else mem) + p.iter_overhead_s
        t += p.iter_overhead_per_seq_s * num_seqs + self._tp_comm(model, new_tokens, tp)
        return self._out(t, noise)

    def decode_iter_time_s(self, model: ModelSpec, tp: int, batch: int, ctx_tokens: int,
                           share: float = 1.0, *, noise: float | None = None) -> float:
        """One iteration decoding ``batch`` tokens; ``ctx_tokens`` = KV tokens summed over batch."""
        if batch <= 0:
            return 0.0
        k, c0, _, m0, _ = self._decode_lines(model, tp, batch, ctx_tokens, share)
        return self._out(k + (c0 if c0 > m0 else m0), noise)

    def decode_span_time_s(self, model: ModelSpec, tp: int, batch: int, ctx_tokens: int,
                           iters: int, share: float = 1.0, *,
                           noise: float | None = None) -> float:
        """``iters`` iterations at a constant batch, the context growing by ``batch`` each.

        Exactly the sum of :meth:`decode_iter_time_s` over the span (closed form, O(1)).
        """
        if batch <= 0 or iters <= 0:
            return 0.0
        k, c0, c1, m0, m1 = self._decode_lines(model, tp, batch, ctx_tokens, share)
        return self._out(_span(k, c0, c1, m0, m1, float(iters)), noise)

    def decode_iters_within(self, model: ModelSpec, tp: int, batch: int, ctx_tokens: int,
                            time_s: float, share: float = 1.0, *, noise: float = 1.0) -> int:
        """How many whole iterations of a span fit in ``time_s`` (inverse of the span time).

        The largest ``n`` with ``decode_span_time_s(..., n, noise=noise) <= time_s``. Never draws
        noise: pass the factor the span was timed with (see the module docstring).
        """
        if batch <= 0:
            raise ValueError(f"batch must be >= 1 to count iterations, got {batch}")
        if not noise > 0.0:
            raise ValueError(f"noise factor must be > 0, got {noise}")
        budget = time_s / noise
        if budget <= 0.0:
            return 0
        if not math.isfinite(budget):
            raise ValueError(f"time_s must be finite, got {time_s}")
        k, c0, c1, m0, m1 = self._decode_lines(model, tp, batch, ctx_tokens, share)
        n_x, a0, a1, b0, b1 = _regimes(c0, c1, m0, m1)
        n = _series_count(k + a0, a1, budget)
        if n > n_x:
            rest = budget - (k * n_x + _line_sum(a0, a1, 0.0, n_x))
            n = n_x + _series_count(k + b0 + b1 * n_x, b1, rest)
        count = int(n)
        # Rounding of the roots can be off by one either way: settle on the exact integer.
        while _span(k, c0, c1, m0, m1, count + 1.0) <= budget:
            count += 1
        while count > 0 and _span(k, c0, c1, m0, m1, float(count)) > budget:
            count -= 1
        return count

    # ---------------------------------------------------------------- training side

    def _micro_batches(self, n_devices: int, tokens: float) -> int:
        per = n_devices * self.params.train_micro_batch_tokens
        return max(1, math.ceil(tokens / per))

    def pass_tokens(self, seq_lens: Sequence[int], n_devices: int, micro_batch_rows: int) -> int:
        """The tokens a log-prob or update pass over sequences of ``seq_lens`` computes.

        The real tokens, unless ``train_pads_rows``: then the rows are split into ``n_devices``
        contiguous data-parallel shards (as the Ray executor does), each shard into micro-batches
        of ``micro_batch_rows`` padded to their longest row, and the pass costs ``n_devices``
        times the largest shard's padded tokens (the shards run in parallel; the slowest ends
        the stage), so that ``logprob_time_s(model, n_devices, tokens)`` is that shard's time.
        """
        if not self.params.train_pads_rows or not seq_lens:
            return int(sum(seq_lens))
        rows = len(seq_lens)
        shards = max(1, min(n_devices, rows))
        base, extra = divmod(rows, shards)
        start, widest = 0, 0
        for i in range(shards):
            stop = start + base + (1 if i < extra else 0)
            step = max(1, micro_batch_rows)
            micro = [seq_lens[lo:min(lo + step, stop)] for lo in range(start, stop, step)]
            widest = max(widest, sum(len(mb) * max(mb) for mb in micro))
            start = stop
        return widest * n_devices

    def logprob_time_s(self, model: ModelSpec, n_devices: int, tokens: int, share: float = 1.0,
                       *, noise: float | None = None) -> float:
        """Forward-only log-prob pass over ``tokens`` tokens, FSDP-sharded over ``n_devices``.

        Compute at ``logprob_eff`` of peak, plus one bf16 parameter all-gather per micro-batch
        (partly hidden behind compute, ``comm_overlap``).
        """
        _check_share(share)
        if tokens <= 0:
            return 0.0
        compute = logprob_flops(model, tokens) / (self._logprob_rate * share * n_devices)
        gather = ring_collective_s(model.weight_bytes(), n_devices, self._link_bw(n_devices),
                                   self.params.collective_step_latency_s)
        comm = self._micro_batches(n_devices, tokens) * gather
        t = overlap_comm(compute, comm, self.params.comm_overlap) + self.params.logprob_overhead_s
        return self._out(t, noise)

    def train_time_s(self, model: ModelSpec, n_devices: int, tokens: int, share: float = 1.0,
                     *, noise: float | None = None) -> float:
        """Forward + backward + optimizer step(s) over ``tokens`` tokens on ``n_devices``.

        ZeRO-3/FSDP: per micro-batch two bf16 parameter all-gathers (forward, backward) and one
        fp32 gradient reduce-scatter, over NVLink inside a node and the NIC across nodes; then
        ``optimizer_steps`` memory-bound Adam steps over the local shard.
        """
        _check_share(share)
        if tokens <= 0:
            return 0.0
        p = self.params
        compute = train_flops(model, tokens) / (self._train_rate * share * n_devices)
        link = self._link_bw(n_devices)
        lat = p.collective_step_latency_s
        per_micro = (2.0 * ring_collective_s(model.weight_bytes(), n_devices, link, lat)
                     + ring_collective_s(_GRAD_REDUCE_BYTES_PER_PARAM * model.num_params,
                                         n_devices, link, lat))
        comm = self._micro_batches(n_devices, tokens) * per_micro
        adam = _ADAM_BYTES_PER_PARAM * model.num_params / n_devices / self._bw(share)
        t = overlap_comm(compute, comm, p.comm_overlap) + p.optimizer_steps * adam
        return self._out(t + p.train_overhead_s, noise)

    def weight_sync_time_s(self, model: ModelSpec, n_devices: int, tp: int = 1, *,
                           noise: float | None = None) -> float:
        """Trainer (FSDP over ``n_devices``) -> colocated rollout engines of TP size ``tp``.

        Each device all-gathers the full bf16 weights layer by layer, keeps its TP slice and
        copies it into the engine (read + write at HBM speed), plus a fixed overhead.
        """
        w = model.weight_bytes()
        gather = ring_collective_s(w, n_devices, self._link_bw(n_devices),
                                   self.params.collective_step_latency_s)
        load = 2.0 * w / tp / self._hbm_rate
        return self._out(gather + load + self.params.weight_sync_overhead_s, noise)

    def host_transfer_time_s(self, nbytes: float, n_devices: int = 1, *,
                             noise: float | None = None) -> float:
        """Offload or onload of ``nbytes`` over the host link, ``nbytes / n_devices`` per device."""
        if nbytes <= 0:
            return 0.0
        per_device = nbytes / max(1, n_devices)
        t = per_device / self.accel.host_link_bytes_per_s + self.params.host_transfer_latency_s
        return self._out(t, noise)

    def dispatch_time_s(self, model: ModelSpec, stage: str, n_devices: int) -> float:
        """What a worker pool adds to ``stage`` beside its compute: the call to the worker, and
        the fp32 weights moved to data-parallel helpers (update: and the gradients back) or to
        the rollout engines (weight sync). See ``CostParams.call_overhead_s``; 0 by default.
        Reward (``reward_overhead_s``) and host moves (``host_transfer_latency_s``) have their
        call in their own cost already."""
        p = self.params
        if stage in ("reward", "offload", "onload"):
            return 0.0
        if stage == "weight_sync":
            moves = 1
        elif n_devices >= 2:
            moves = {"old_logprob": 1, "ref_logprob": 1, "actor_update": 2}.get(stage, 0)
        else:
            moves = 0
        if moves == 0 or p.worker_link_bytes_per_s <= 0:
            return p.call_overhead_s
        per_move = (p.worker_link_latency_s
                    + model.weight_bytes(FP32_BYTES) / p.worker_link_bytes_per_s)
        return p.call_overhead_s + moves * per_move

    def reward_time_s(self, num_samples: int, *, noise: float | None = None) -> float:
        """Rule-based reward on CPU: a fixed overhead plus a constant per sample."""
        if num_samples <= 0:
            return 0.0
        p = self.params
        return self._out(p.reward_overhead_s + p.reward_s_per_sample * num_samples, noise)

    # ---------------------------------------------------------------- FLOPs (for MFU)

    def prefill_flops(self, model: ModelSpec, new_tokens: int, ctx_tokens: int = 0, *,
                      num_seqs: int = 1) -> float:
        return prefill_flops(model, new_tokens, ctx_tokens, num_seqs)

    def decode_flops(self, model: ModelSpec, batch: int, ctx_tokens: int,
                     iters: int = 1) -> float:
        return decode_flops(model, batch, ctx_tokens, iters)

    def logprob_flops(self, model: ModelSpec, tokens: int) -> float:
        return logprob_flops(model, tokens)

    def train_flops(self, model: ModelSpec, tokens: int) -> float:
        return train_flops(model, tokens)

    # ---------------------------------------------------------------- memory (bytes per device)

    def rollout_weight_bytes(self, model: ModelSpec, tp: int) -> float:
        return memory.rollout_weight_bytes(model, tp)

    def kv_bytes(self, model: ModelSpec, tokens: int, tp: int) -> float:
        return memory.kv_bytes(model, tokens, tp)

    def kv_budget_tokens(self, model: ModelSpec, tp: int, mem_bytes: float) -> int:
        return memory.kv_budget_tokens(model, tp, mem_bytes)

    def train_state_bytes(self, model: ModelSpec, n_devices: int) -> float:
        return memory.train_state_bytes(model, n_devices)

    def activation_bytes(self, model: ModelSpec, micro_batch_tokens: int,
                         n_devices: int) -> float:
        return memory.activation_bytes(model, micro_batch_tokens, n_devices, self.params)

    def fits_training(self, model: ModelSpec, n_devices: int) -> tuple[bool, str]:
        return memory.fits_training(model, self.accel, n_devices, self.params)

    # ---------------------------------------------------------------- slowdown under a share

    def slowdown(self, stage: str, share: float, *, model: ModelSpec | None = None, tp: int = 1,
                 batch: int | None = None, ctx_tokens: int | None = None) -> float:
        """Time at ``share`` over time at full device, >= 1; see :mod:`.slowdown` for stages."""
        return slowdown.slowdown(self, stage, share, model=model, tp=tp, batch=batch,
                                 ctx_tokens=ctx_tokens)

    def slowdown_table(self, model: ModelSpec, tp: int = 1) -> dict[str, dict[float, float]]:
        """stage -> {share level: factor} at each stage's typical operating point."""
        return slowdown.slowdown_table(self, model, tp)
