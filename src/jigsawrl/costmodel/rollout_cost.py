"""Rollout side of the cost model: prefill and decode times (and FLOPs) of an engine instance.

The hot paths (:meth:`RolloutCosts.prefill_time_s`, :meth:`RolloutCosts.decode_span_time_s`,
:meth:`RolloutCosts.decode_iters_within`) are called ~10^5 times per simulation, so they are plain
float math: no arrays, no per-call containers.

Decode, as a roofline: one iteration decoding ``batch`` tokens with ``ctx`` KV tokens (summed over
the batch) takes ``k + max(c0 + c1*i, m0 + m1*i)`` at iteration ``i`` of a span (``k``: the fixed
iteration overhead, plus a launch cost per layer when the deployment's rollout runs eager, without
CUDA graphs; the memory line streams the weights at ``hbm_bw_eff`` and the KV cache at
``kv_bw_eff`` of the datasheet bandwidth), since the context
grows by ``batch`` per iteration: both the compute line and the memory line are linear in ``i``,
so a span is a sum over at most two arithmetic series (closed form, :func:`span_sum`), and its
inverse is a quadratic root per series (:func:`series_count`), corrected to the exact integer.

Truth-model recipe for a span interrupted by a share change: draw ``f = cm.draw_noise()``, time
the span as ``cm.decode_span_time_s(..., noise=f)``, and on interruption after ``t`` seconds ask
``cm.decode_iters_within(..., t, noise=f)``.
"""

from __future__ import annotations

import math
from typing import Any

from jigsawrl.costmodel.core import CostCore, check_share
from jigsawrl.costmodel.roofline import decode_flops, kv_bytes_per_token_per_device, prefill_flops
from jigsawrl.workload.models import ModelSpec


def line_sum(a0: float, a1: float, lo: float, hi: float) -> float:
    """sum_{i=lo}^{hi-1} (a0 + a1*i) for integers lo <= hi."""
    return (hi - lo) * a0 + a1 * (hi * (hi - 1.0) - lo * (lo - 1.0)) * 0.5


def regimes(c0: float, c1: float, m0: float, m1: float) -> tuple[float, float, float, float, float]:
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
        return _crossing(-d0 / d1), m0, m1, c0, c1
    return _crossing(d0 / -d1), c0, c1, m0, m1  # compute first; memory overtakes


def _crossing(i: float) -> float:
    """The first whole iteration at or after ``i`` (``inf`` when ``i`` overflowed: a slope so
    small that the lines never cross within float range)."""
    return math.inf if math.isinf(i) else float(math.ceil(i))


def span_sum(k: float, c0: float, c1: float, m0: float, m1: float, n: float) -> float:
    """sum_{i<n} k + max(c0 + c1*i, m0 + m1*i), exactly, for an integer n >= 0."""
    n_x, a0, a1, b0, b1 = regimes(c0, c1, m0, m1)
    if n <= n_x:
        return k * n + line_sum(a0, a1, 0.0, n)
    return k * n + line_sum(a0, a1, 0.0, n_x) + line_sum(b0, b1, n_x, n)


def series_count(first: float, step: float, budget: float) -> float:
    """Real m >= 0 with sum_{j<m} (first + step*j) == budget (first > 0, step >= 0)."""
    if budget <= 0.0:
        return 0.0
    b = first - 0.5 * step
    root = math.sqrt(b * b + 2.0 * step * budget)
    if b > 0.0:  # numerically stable form when b > 0
        return 2.0 * budget / (b + root)
    return (root - b) / step  # b <= 0 implies step > 0 (first > 0)


# Entries of the per-batch decode-line cache before it is cleared (shares the executor sets
# are continuous, so the keys are not a small set everywhere).
BATCH_CACHE = 65_536


class RolloutCosts(CostCore):
    """Prefill and decode of one engine instance (TP group) on a compute share of its devices."""

    def _line_consts(self, model: ModelSpec, tp: int, share: float) -> tuple[Any, ...]:
        """What of the decode lines depends on the model, TP and share only: a replay of a
        rollout asks for the lines on every segment, so they are worked out once per key."""
        check_share(share)
        # attention's price per KV token, in FLOPs at the decode rate: its FLOPs, or what a
        # profile measured it to cost (CostParams.decode_ctx_s_per_token; 0 on a GPU)
        ctx_s = self.params.decode_ctx_s_per_token
        return (model, self._decode_rate * share * tp, self._bw(share),
                ctx_s * self._decode_rate if ctx_s > 0 else model.attn_flops_per_token_per_ctx(),
                kv_bytes_per_token_per_device(model, tp) * self._kv_scale,
                model.weight_bytes() / tp, self._eager_per_layer * model.num_layers)

    def _consts(self, model: ModelSpec, tp: int, share: float) -> tuple[Any, ...]:
        """:meth:`_line_consts`, worked out once per (model, TP, share)."""
        key = (id(model), tp, share)
        got = self._line_cache.get(key)
        if got is None or got[0] is not model:
            got = self._line_cache[key] = self._line_consts(model, tp, share)
        return got

    def _decode_lines(self, model: ModelSpec, tp: int, batch: int, ctx_tokens: float,
                      share: float) -> tuple[float, float, float, float, float]:
        """(k, c0, c1, m0, m1): iteration i of a span takes k + max(c0 + c1 i, m0 + m1 i).

        What depends on the batch but not the context (k, c1, m1, the dense FLOPs) is worked
        out once per batch size: a replay times thousands of spans over a few hundred sizes."""
        key = (id(model), tp, share, batch)
        got = self._batch_cache.get(key)
        if got is None or got[0] is not model:
            _, comp, bw, attn, kv, weights, fixed = self._consts(model, tp, share)
            p = self.params
            k = (p.iter_overhead_s + p.iter_overhead_per_seq_s * batch
                 + self._tp_comm(model, batch, tp) + fixed)
            if len(self._batch_cache) >= BATCH_CACHE:
                self._batch_cache.clear()
            got = self._batch_cache[key] = (model, 2.0 * model.num_params * batch, comp, attn,
                                            attn * batch / comp, weights, kv, bw,
                                            kv * batch / bw, k)
        _, dense, comp, attn, c1, weights, kv, bw, m1, k = got
        c0 = (dense + attn * ctx_tokens) / comp
        m0 = (weights + kv * ctx_tokens) / bw
        return k, c0, c1, m0, m1

    def prefill_time_s(self, model: ModelSpec, tp: int, new_tokens: int, ctx_tokens: int = 0,
                       share: float = 1.0, *, num_seqs: int = 1,
                       noise: float | None = None) -> float:
        """One engine iteration prefilling ``new_tokens`` over ``ctx_tokens`` cached tokens.

        Compute-bound for all but tiny prefills: ``max(flops / compute, bytes / bandwidth)`` plus
        the iteration overhead and the TP all-reduces. ``num_seqs``: how many sequences the new
        (and cached) tokens belong to, for the causal attention term (1 = one long sequence, an
        upper bound for batched prompts). ``noise``: the factor to apply instead of a fresh draw.
        """
        check_share(share)
        if new_tokens <= 0:
            return 0.0
        p = self.params
        flops = prefill_flops(model, new_tokens, ctx_tokens, num_seqs)
        compute = flops / (self._prefill_rate * share * tp)
        _, _, bw, _, kv, weights, _ = self._consts(model, tp, share)
        mem = (weights + kv * (ctx_tokens + new_tokens)) / bw
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
        return self._out(span_sum(k, c0, c1, m0, m1, float(iters)), noise)

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
        n_x, a0, a1, b0, b1 = regimes(c0, c1, m0, m1)
        n = series_count(k + a0, a1, budget)
        if n > n_x:
            rest = budget - (k * n_x + line_sum(a0, a1, 0.0, n_x))
            n = n_x + series_count(k + b0 + b1 * n_x, b1, rest)
        count = int(n)
        # Rounding of the roots can be off by one either way: settle on the exact integer.
        while span_sum(k, c0, c1, m0, m1, count + 1.0) <= budget:
            count += 1
        while count > 0 and span_sum(k, c0, c1, m0, m1, float(count)) > budget:
            count -= 1
        return count

    # ---------------------------------------------------------------- FLOPs (for MFU)

    def prefill_flops(self, model: ModelSpec, new_tokens: int, ctx_tokens: int = 0, *,
                      num_seqs: int = 1) -> float:
        return prefill_flops(model, new_tokens, ctx_tokens, num_seqs)

    def decode_flops(self, model: ModelSpec, batch: int, ctx_tokens: int,
                     iters: int = 1) -> float:
        return decode_flops(model, batch, ctx_tokens, iters)
