"""The one stage vocabulary: the names of an RL step's sub-stages, and the sets every layer uses.

Every module names stages through :class:`Stage` (a ``StrEnum``: ``Stage.ACTOR_UPDATE ==
"actor_update"``, so events, summaries and traces keep the plain strings on disk) and asks these
sets which kind a stage is, instead of re-declaring its own tuple of strings (DESIGN.md §5).

A step of a pipeline (DESIGN.md §2), as the scheduler launches it:

- :attr:`Stage.ROLLOUT` — one task per step; its spans are the rollout *bands*
  (:data:`ROLLOUT_BANDS`): ``prefill``, ``decode_large`` (≥ :data:`DECODE_LARGE_MIN_TOKENS`
  tokens per engine iteration), ``decode_medium``, ``decode_small`` (< :data:`DECODE_MEDIUM_MIN_TOKENS`:
  the long tail) and ``tool_wait`` (every request of the rank waits for a tool; the device idles);
- then :data:`POST_ROLLOUT`: ``reward``, ``old_logprob``, ``ref_logprob``, ``actor_update``,
  ``weight_sync``;
- memory moves (:data:`MEMORY_MOVES`): ``offload``, ``onload`` of a train state, and ``migrate`` of
  a rollout's unfinished requests.

Kinds: :data:`MODEL_PASSES` run forward (and backward) passes over the train state on devices
(compute-bound, they hold activations); :data:`HOST_STAGES` run on the host or move memory and hold
no compute share; :data:`DEVICE_STAGES` count as busy device time (all but ``tool_wait``).
"""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    """A sub-stage name (the value is the string written in events and summaries)."""

    ROLLOUT = "rollout"
    PREFILL = "prefill"
    DECODE_LARGE = "decode_large"
    DECODE_MEDIUM = "decode_medium"
    DECODE_SMALL = "decode_small"
    TOOL_WAIT = "tool_wait"
    REWARD = "reward"
    OLD_LOGPROB = "old_logprob"
    REF_LOGPROB = "ref_logprob"
    ACTOR_UPDATE = "actor_update"
    WEIGHT_SYNC = "weight_sync"
    OFFLOAD = "offload"
    ONLOAD = "onload"
    MIGRATE = "migrate"


# The spans of a rollout task (its sub-stages per DP rank).
DECODE_BANDS: tuple[Stage, ...] = (Stage.DECODE_LARGE, Stage.DECODE_MEDIUM, Stage.DECODE_SMALL)
ROLLOUT_BANDS: tuple[Stage, ...] = (Stage.PREFILL, *DECODE_BANDS, Stage.TOOL_WAIT)
# After the rollout, in order (a pipeline without a reference model skips ref_logprob).
POST_ROLLOUT: tuple[Stage, ...] = (Stage.REWARD, Stage.OLD_LOGPROB, Stage.REF_LOGPROB,
                                   Stage.ACTOR_UPDATE, Stage.WEIGHT_SYNC)
MEMORY_MOVES: tuple[Stage, ...] = (Stage.OFFLOAD, Stage.ONLOAD, Stage.MIGRATE)
ALL_SPAN_STAGES: tuple[Stage, ...] = ROLLOUT_BANDS + POST_ROLLOUT + MEMORY_MOVES

# Forward (+ backward) passes over the train state: compute-bound, on devices, with activations.
MODEL_PASSES: frozenset[Stage] = frozenset({Stage.OLD_LOGPROB, Stage.REF_LOGPROB,
                                            Stage.ACTOR_UPDATE})
# Run on the host or move memory: they hold no compute share of a device.
HOST_STAGES: frozenset[Stage] = frozenset({Stage.REWARD, Stage.WEIGHT_SYNC, Stage.OFFLOAD,
                                           Stage.ONLOAD})
# Device time of these counts as busy (tool waits leave the device idle).
DEVICE_STAGES: tuple[Stage, ...] = tuple(s for s in ALL_SPAN_STAGES if s != Stage.TOOL_WAIT)
# Stages the cost model's slowdown table has a row for.
COSTED_STAGES: tuple[Stage, ...] = (Stage.PREFILL, *DECODE_BANDS, Stage.OLD_LOGPROB,
                                    Stage.REF_LOGPROB, Stage.ACTOR_UPDATE, Stage.WEIGHT_SYNC,
                                    Stage.REWARD, Stage.OFFLOAD, Stage.ONLOAD)

# Decode bands by tokens processed per engine iteration (the paper's sub-stage split).
DECODE_LARGE_MIN_TOKENS = 1024
DECODE_MEDIUM_MIN_TOKENS = 128

# verl's timing keys (``timing_s/<key>``) -> the stages whose wall extent each measures.
VERL_TIMING: dict[str, tuple[Stage, ...]] = {
    "gen": ROLLOUT_BANDS,
    "reward": (Stage.REWARD,),
    "old_log_prob": (Stage.OLD_LOGPROB,),
    "ref": (Stage.REF_LOGPROB,),
    "update_actor": (Stage.ACTOR_UPDATE,),
    "update_weights": (Stage.WEIGHT_SYNC,),
}


def decode_band(tokens_per_iter: int) -> Stage:
    """The decode band of an engine iteration that processes ``tokens_per_iter`` tokens."""
    if tokens_per_iter >= DECODE_LARGE_MIN_TOKENS:
        return Stage.DECODE_LARGE
    if tokens_per_iter >= DECODE_MEDIUM_MIN_TOKENS:
        return Stage.DECODE_MEDIUM
    return Stage.DECODE_SMALL
