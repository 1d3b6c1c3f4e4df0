"""Events every executor emits and the driver, scheduler and metrics consume.

The simulated executor and the Ray executor emit the *same* records, so metrics and reports do not
know which one ran. Records are plain frozen dataclasses (not pydantic) because a simulation emits
tens of thousands of them and construction cost matters.

The ``stage`` of a record is a :class:`~jigsawrl.stages.Stage` (its name is the plain string on
disk); the vocabulary and the kinds of stages are in :mod:`jigsawrl.stages`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# The rank of a span of a post-rollout pass computed while its step's rollout still ran
# (StreamRL's streaming of finished groups into training, ``jigsawrl.sim.stream``): the one
# kind of span allowed to overlap its step's rollout.
STREAMED_RANK = -1


@dataclass(frozen=True, slots=True)
class Span:
    """One stretch of one sub-stage of one pipeline on a set of devices.

    ``flops`` is the useful model FLOPs done in the span (for MFU); ``tokens`` the tokens processed
    (prefill/log-prob/train tokens, or decoded tokens). ``compute_share`` is the share of each
    device's compute this span held (1.0 = whole device).
    """

    pipeline: str
    step: int
    stage: str
    rank: int
    devices: tuple[int, ...]
    start_s: float
    end_s: float
    compute_share: float = 1.0
    flops: float = 0.0
    tokens: int = 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class SampleFinished:
    """One response (one sample of a GRPO group) finished; its tokens count toward throughput."""

    pipeline: str
    step: int
    sample_id: str
    time_s: float
    prompt_tokens: int
    response_tokens: int
    turns: int = 1
    policy_version: int = 0
    generated_tokens: int = -1  # model-generated part of response_tokens (-1: not recorded)


@dataclass(frozen=True, slots=True)
class StepFinished:
    """A pipeline finished one training step (its weights are updated and synced)."""

    pipeline: str
    step: int
    start_s: float
    end_s: float
    timings_s: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PipelineFailed:
    """A pipeline stopped with an error; the others go on."""

    pipeline: str
    step: int
    time_s: float
    error: str


Event = Span | SampleFinished | StepFinished | PipelineFailed

_KINDS: dict[str, type] = {
    "span": Span,
    "sample": SampleFinished,
    "step": StepFinished,
    "failed": PipelineFailed,
}
_KIND_OF = {v: k for k, v in _KINDS.items()}


def event_to_dict(event: Event) -> dict[str, Any]:
    """Serialise an event for ``events.jsonl`` (adds a ``type`` key)."""
    d = asdict(event)
    if isinstance(event, Span):
        d["devices"] = list(event.devices)
    d["type"] = _KIND_OF[type(event)]
    return d


def event_from_dict(d: dict[str, Any]) -> Event:
    """Inverse of :func:`event_to_dict`."""
    d = dict(d)
    cls = _KINDS[d.pop("type")]
    if cls is Span:
        d["devices"] = tuple(d["devices"])
    return cls(**d)
