"""Slowdown of a sub-stage run on a share of a device's compute (SM share on a GPU).

Why: co-located sub-stages each get a compute share, chosen from discrete levels with a table of
how much each kind of sub-stage slows at each level (the paper profiles this table offline; the
prototype uses levels from 20% to 90% of the SMs, plus 100%). Until ``jigsawrl profile`` measures
one, the table comes from the roofline: ``slowdown = time(share) / time(1)``. Compute-bound work
(prefill, log-prob, actor update) slows ~1/share; memory-bound decode hardly slows until the
share drops below the fraction of SMs that saturates HBM bandwidth (``CostParams.s_sat``).

Stages that use no SMs, or almost none, do not slow (an assumption, stated per stage below):
``offload``/``onload`` run on the copy engines (DMA), ``reward`` runs on the CPU, and
``weight_sync`` is NCCL traffic bound by the links, using a handful of SMs.
"""

from __future__ import annotations

from typing import Protocol

from jigsawrl.stages import COSTED_STAGES, HOST_STAGES, Stage
from jigsawrl.workload.models import MODELS, ModelSpec

# Discrete compute-share levels (paper prototype: levels from 20% to 90% of SMs, plus 100%).
SHARE_LEVELS: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

# The stages with a row in the table are stages.COSTED_STAGES. The host stages (copy engines, CPU,
# link-bound NCCL: stages.HOST_STAGES) do not slow under an SM share (assumption, see docstring).

# Typical operating points, used when the caller gives no batch / context (assumptions):
# running sequences per decode iteration for each decode sub-stage (paper: >= 128 running is
# "large", < 128 the tail), KV context per running sequence, prompt length of a prefill batch,
# and tokens per device for the training-side passes (one verl micro-batch, 16384 tokens).
DECODE_BATCH: dict[Stage, int] = {Stage.DECODE_LARGE: 256, Stage.DECODE_MEDIUM: 64,
                                  Stage.DECODE_SMALL: 8}
CTX_PER_SEQ = 1024
PREFILL_TOKENS = 4096
PROMPT_TOKENS = 512
TRAIN_TOKENS_PER_DEVICE = 16384
# The roofline needs a model for decode; without one, the paper's main 4B model stands in.
DEFAULT_MODEL = "qwen3-4b"


class RooflineTimes(Protocol):
    """The cost-model times a slowdown is the ratio of, each with an explicit noise factor."""

    def prefill_time_s(self, model: ModelSpec, tp: int, new_tokens: int, ctx_tokens: int = 0,
                       share: float = 1.0, *, num_seqs: int = 1,
                       noise: float | None = None) -> float: ...

    def decode_iter_time_s(self, model: ModelSpec, tp: int, batch: int, ctx_tokens: int,
                           share: float = 1.0, *, noise: float | None = None) -> float: ...

    def logprob_time_s(self, model: ModelSpec, n_devices: int, tokens: int, share: float = 1.0,
                       *, noise: float | None = None) -> float: ...

    def train_time_s(self, model: ModelSpec, n_devices: int, tokens: int, share: float = 1.0,
                     *, noise: float | None = None) -> float: ...


def _times(cm: RooflineTimes, stage: str, share: float, model: ModelSpec, tp: int,
           batch: int | None, ctx_tokens: int | None) -> float:
    """Deterministic time of one typical unit of ``stage`` at ``share`` (no noise drawn)."""
    if stage == Stage.PREFILL:
        new = batch if batch is not None else PREFILL_TOKENS
        seqs = max(1, round(new / PROMPT_TOKENS))
        return cm.prefill_time_s(model, tp, new, ctx_tokens or 0, share, num_seqs=seqs, noise=1.0)
    if stage in DECODE_BATCH:
        b = batch if batch is not None else DECODE_BATCH[stage]
        ctx = ctx_tokens if ctx_tokens is not None else b * CTX_PER_SEQ
        return cm.decode_iter_time_s(model, tp, b, ctx, share, noise=1.0)
    tokens = batch if batch is not None else TRAIN_TOKENS_PER_DEVICE * tp
    if stage == Stage.ACTOR_UPDATE:
        return cm.train_time_s(model, tp, tokens, share, noise=1.0)
    return cm.logprob_time_s(model, tp, tokens, share, noise=1.0)


def slowdown(cm: RooflineTimes, stage: str, share: float, *, model: ModelSpec | None = None,
             tp: int = 1, batch: int | None = None, ctx_tokens: int | None = None) -> float:
    """How many times longer ``stage`` takes at compute ``share`` than on the whole device.

    Args:
        cm: the cost model whose roofline is used (its noise is never drawn here).
        stage: one of :data:`~jigsawrl.stages.COSTED_STAGES`.
        share: the compute share, in (0, 1].
        model: the model; :data:`DEFAULT_MODEL` when None.
        tp: devices of the engine (decode, prefill) or of the training group (other stages).
        batch: decode: running sequences; prefill: new tokens; log-prob / update: tokens.
            None: the stage's typical operating point.
        ctx_tokens: decode: KV tokens summed over the batch; prefill: cached tokens.

    Returns:
        The factor, >= 1 and non-increasing in ``share``.

    Raises:
        ValueError: on an unknown stage or a share outside (0, 1].
    """
    if stage not in COSTED_STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(COSTED_STAGES)}")
    if not 0.0 < share <= 1.0:
        raise ValueError(f"compute share must be in (0, 1], got {share}")
    if stage in HOST_STAGES or share == 1.0:
        return 1.0
    spec = model if model is not None else MODELS[DEFAULT_MODEL]
    full = _times(cm, stage, 1.0, spec, tp, batch, ctx_tokens)
    if full <= 0.0:
        return 1.0
    ratio = _times(cm, stage, share, spec, tp, batch, ctx_tokens) / full
    return ratio if ratio > 1.0 else 1.0


def slowdown_table(cm: RooflineTimes, model: ModelSpec, tp: int = 1) -> dict[str, dict[float, float]]:
    """stage -> {share level: slowdown} at each stage's typical operating point."""
    return {
        stage: {level: slowdown(cm, stage, level, model=model, tp=tp) for level in SHARE_LEVELS}
        for stage in COSTED_STAGES
    }
