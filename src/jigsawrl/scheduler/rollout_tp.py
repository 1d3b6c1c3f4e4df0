"""Rollout tensor parallelism as a choice, not a given (issue 11 item 6).

A config's ``rollout_tp`` is what its author wrote; the fastest rollout TP of a workload depends
on the model, the pool and the other jobs, and a careful user tries a few. This module lets any
policy run with other rollout TPs than the config's: :func:`retp_view` is the view the policy sees
(each pipeline's ``spec.rollout_tp`` replaced), :class:`RolloutTP` wraps a policy so that it
decides on that view throughout a run. Only the rollout changes: training TP, devices and
everything else stay the config's, and the simulator charges the weight sync onto the TP the
rollout ran at.

Two users: every baseline that searches its placements (``verl``, its async recipes,
``streamrl``, ``areal``, ``rollmux``, ``muxserve``) runs each at the config's TP and at scaled
TPs (:data:`TP_FACTORS`, :func:`with_scaled_tps`), the runner keeping the best it measures (a
user tuning verl's ``rollout.tensor_model_parallel_size``); jigsaw chooses its own by prediction
(``scheduler/jigsaw/tp_search.py``), never by a measured run.

Only where the executor can form TP groups of any width (``View.can_regroup``: the simulator
on GPU-style pools; the Ray CPU workers run TP 1 only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from jigsawrl.config import PipelineSpec
from jigsawrl.costmodel.memory import response_kv_room
from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import (
    Decision,
    PipelineView,
    Policy,
    PolicyBase,
    RunningTask,
    View,
)
from jigsawrl.workload.experiment import DEFAULT_GPU_MEMORY_UTILIZATION

# The scales of each pipeline's configured rollout TP tried (1: the config's own). x8 takes a
# TP-1 config to a whole 8-device node: measured best for both sides of the heterogeneous
# 0.6B + 8B pair (docs/BENCHMARKS.md); a scale that caps to an earlier one's TPs is skipped.
TP_FACTORS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 0.5)


def scaled_tp(pv: PipelineView, factor: float, per_node: int) -> int:
    """``pv``'s configured rollout TP times ``factor``: a power of two within one node that
    divides the model's heads (the nearest below where the scaled one does not)."""
    tp = max(1, min(per_node, int(pv.spec.rollout_tp * factor)))
    while tp > 1 and (pv.model.num_heads % tp or tp & (tp - 1)):
        tp -= 1
    return tp


def scaled_tps(view: View, factor: float) -> dict[str, int]:
    """Every pipeline's rollout TP scaled by ``factor`` (:func:`scaled_tp`)."""
    return {pv.name: scaled_tp(pv, factor, view.accelerators_per_node) for pv in view.pipelines}


def check_rollout_tp(view: View, pv: PipelineView, tp: int) -> None:
    """A rollout engine of TP ``tp`` must hold one full response's KV cache per device (as the
    config's own TP is checked when it is resolved).

    Raises:
        ConfigError: naming the pipeline and the TP.
    """
    budget, need = response_kv_room(view.cost, pv.model, tp, pv.spec.max_response_tokens,
                                    view.accelerator.hbm_bytes, DEFAULT_GPU_MEMORY_UTILIZATION)
    if budget < need:
        raise ConfigError(f"pipeline {pv.name!r} at rollout TP {tp} leaves {budget / 1e9:.1f} "
                          f"GB per device for the KV cache, one response needs {need / 1e9:.2f}",
                          where="scheduler variants", fix="(this TP is skipped)")


def is_configured(view: View, tps: Mapping[str, int]) -> bool:
    """Whether ``tps`` are the config's own rollout TPs."""
    return all(tps.get(pv.name, pv.spec.rollout_tp) == pv.spec.rollout_tp
               for pv in view.pipelines)


def retp_view(view: View, tps: Mapping[str, int],
              specs: dict[str, PipelineSpec] | None = None) -> View:
    """``view`` with each named pipeline's ``spec.rollout_tp`` replaced by ``tps``; ``specs``:
    the replaced specs kept across the views of one run (a spec does not change in a run, and a
    policy asks for this view at every decision)."""
    specs = {} if specs is None else specs

    def spec(pv: PipelineView) -> PipelineSpec:
        got = specs.get(pv.name)
        if got is None:
            got = specs[pv.name] = pv.spec.model_copy(update={"rollout_tp": tps[pv.name]})
        return got
    return replace(view, pipelines=tuple(
        replace(pv, spec=spec(pv)) if tps.get(pv.name, pv.spec.rollout_tp) != pv.spec.rollout_tp
        else pv for pv in view.pipelines))


def label(tps: Mapping[str, int]) -> str:
    """``tp2`` when every pipeline runs TP 2, ``tp1/2`` for two that differ (config order)."""
    values = list(tps.values())
    return f"tp{values[0]}" if len(set(values)) == 1 else "tp" + "/".join(map(str, values))


def with_scaled_tps(make: Callable[[], Sequence[Policy]]) -> list[Policy]:
    """``make()``'s policies, then fresh ones of each at every scaled rollout TP (a variant's
    policy keeps its run's state: none is run twice)."""
    return [*make(), *(RolloutTP(v, f) for f in TP_FACTORS[1:] for v in make())]


class RolloutTP(PolicyBase):
    """``inner`` deciding on every view with its pipelines' rollout TPs scaled by ``factor``.

    The TPs are fixed at the first decision (they need the pool). A factor that changes no
    pipeline's TP or gives the TPs of an earlier factor (capped at a node), or an executor that
    cannot form other TP groups, fails fast there with a :class:`ConfigError`, so that a runner
    comparing variants skips it.
    """

    def __init__(self, inner: Policy, factor: float) -> None:
        self.inner = inner
        self.factor = factor
        self.tps: dict[str, int] | None = None
        self._specs: dict[str, PipelineSpec] = {}  # pipeline -> its spec at those TPs
        self.wants_rank_progress = inner.wants_rank_progress

    @property
    def name(self) -> str:
        tps = label(self.tps) if self.tps else f"tp x{self.factor:g}"
        return f"{self.inner.name}@{tps}"

    def decide(self, view: View) -> Decision:
        if self.tps is None:
            tps = scaled_tps(view, self.factor)
            if is_configured(view, tps):
                raise ConfigError(f"rollout TP x{self.factor:g} is the config's own here",
                                  where="scheduler variants", fix="(a duplicate; skipped)")
            earlier = TP_FACTORS[1:TP_FACTORS.index(self.factor)] if (
                self.factor in TP_FACTORS) else ()
            if any(scaled_tps(view, f) == tps for f in earlier):
                raise ConfigError(f"rollout TP x{self.factor:g} runs an earlier scale's TPs here",
                                  where="scheduler variants", fix="(a duplicate; skipped)")
            if not view.can_regroup:
                raise ConfigError("this executor runs each pipeline's configured rollout TP only",
                                  where="scheduler variants", fix="(skipped)")
            for pv in view.pipelines:
                check_rollout_tp(view, pv, tps[pv.name])
            self.tps = tps
        return self.inner.decide(retp_view(view, self.tps, self._specs))

    def wakes_on_progress(self, task: RunningTask, unfinished: Sequence[int]) -> bool:
        return self.inner.wakes_on_progress(task, unfinished)

    def report(self) -> dict[str, Any]:
        return {**self.inner.report(), "rollout_tp": dict(self.tps or {})}

    def background(self) -> Callable[[], None] | None:
        return self.inner.background()
