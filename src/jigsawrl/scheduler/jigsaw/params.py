"""The ``jigsaw`` policy's parameters (``scheduler.params``), validated once and shared, read-only,
by the pieces of the planner."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from jigsawrl.errors import ConfigError

_KIND = {"bool": "true or false", "int": "a whole number", "float": "a finite number"}


def _is(kind: str, value: object) -> bool:
    """Whether ``value`` is of the parameter type named ``kind`` (bools are not numbers)."""
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) if kind == "int" else math.isfinite(value)


@dataclass(frozen=True, slots=True)
class JigsawParams:
    """What :class:`~jigsawrl.scheduler.jigsaw.JigsawPolicy` is configured with.

    Args:
        depth: look-ahead depth in forecast events (0: ``greedy``, the first candidate).
        migration: move long tails onto fewer ranks and release ranks that drained (off:
            neither, and no regroup either: every tail action is off).
        dynamic_shares: pick compute splits from the slowdown table (else equal splits).
        max_colocated: rollout engines of different pipelines per device.
        tail_requests: a rollout with at most this many unfinished requests is a tail.
        tail_batch: at most this many tail requests per destination rank.
        history_window: steps of history the rollout prediction pools.
        min_rollout_fraction: a rollout starts only on at least this fraction of its width.
        max_train_states: train states on the devices at once.
        plan_widths: choose each rollout's width by critical path (:mod:`.planner`; off: every
            rollout takes a fair share of the pool, the ablation of planned widths).
        tail_tp: re-form a small tail on one wider TP group when it ends sooner for it
            (:mod:`.regroup`; only where the executor can, and never while a stage waits for
            devices; off: the ablation).
        fallback: run the best verl placement instead when it is predicted to finish sooner
            (:mod:`.fallback`; off: always jigsaw's own plan).
        tp_search: run the rollout TPs predicted soonest among the config's scaled by
            ``rollout_tp.TP_FACTORS`` (:mod:`.tp_search`; only where the executor forms TP
            groups of any width; off: the config's TPs).
        tail_logprobs: a sync pipeline's finished groups get their old (and reference)
            log-probs on the rollout's drained devices while its tail still runs (the
            simulator's ``sim/stream.py`` tail mode; on Ray ``executors/raycluster/tail.py``);
            the post-rollout passes then cover only the rest. Off by default: an option, as
            issue 11 item 4 asks.
        spread: a running rollout grows onto whole TP groups nobody else wants when the belief
            cost model says it then ends sooner (:mod:`.spread`; only where the executor can;
            off: the ablation).
        colocate: at the first decision, forecast the plan with two rollout engines per
            device (pipeline multiplexing of rollouts, :mod:`.corun`) beside the plan with one,
            and run two where that is predicted ``COLOCATE_MARGIN`` sooner, or as soon with
            the pipelines finishing sooner on average (``policy.TIE``; only with
            ``max_colocated`` 1 and where the executor forms TP groups of any width; off: the
            ablation, one engine per device unless ``max_colocated`` says otherwise).
        short_first: a ready pass predicted to take at most this fraction of the pass the
            look-ahead chose, on one of its devices, runs first (a short step's pass no longer
            waits a whole update; :meth:`~.lookahead.LookAhead.choose`); 0 (default): off.

    Raises:
        ConfigError: a depth below 0, or a count below 1.
    """

    depth: int = 2
    migration: bool = True
    dynamic_shares: bool = True
    max_colocated: int = 1
    tail_requests: int = 128
    tail_batch: int = 64
    history_window: int = 3
    min_rollout_fraction: float = 0.5
    max_train_states: int = 1
    plan_widths: bool = True
    fallback: bool = True
    tail_tp: bool = True
    tp_search: bool = True
    tail_logprobs: bool = False
    spread: bool = True
    colocate: bool = True
    short_first: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not _is(f.type, value):
                raise ConfigError(f"scheduler parameter {f.name!r} must be {_KIND[f.type]}, "
                                  f"got {value!r}", where=f"scheduler.params.{f.name}",
                                  fix=f"set it to {_KIND[f.type]} (default {f.default!r})")
        if not 0.0 <= self.short_first < 1.0:
            raise ConfigError(f"short_first must be in [0, 1), got {self.short_first}",
                              where="scheduler.params.short_first",
                              fix="a fraction such as 0.1, or 0 to turn it off")
        if (self.depth < 0 or self.max_colocated < 1 or self.tail_batch < 1
                or self.max_train_states < 1):
            raise ConfigError("depth >= 0, max_colocated >= 1, tail_batch >= 1 and "
                              "max_train_states >= 1 are required", where="scheduler.params")
