"""Request values of the rollout engine: what a caller submits, what it gets back, what migrates.

`RequestState` holds plain lists, ints and bytes only, so it pickles and travels between
processes: it is what long-tail migration moves from one engine to another (abort here, resume
there by re-prefilling). These classes are re-exported by `jigsawrl.engine.rollout`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from jigsawrl.errors import InputError

FINISH_REASONS = ("eos", "stop", "length", "abort")


@dataclass
class SamplingParams:
    """How one request samples.

    ``stop`` strings are matched on the decoded model-generated text since the last tool
    insertion; the stop string is kept in the output. ``seed`` seeds a generator of the request's
    own, so its samples do not depend on the batch it shares.
    """

    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def validate(self, where: str) -> None:
        if self.max_new_tokens < 1:
            raise InputError(f"max_new_tokens is {self.max_new_tokens}", where=where,
                             fix="ask for at least one new token")
        if not self.temperature >= 0:
            raise InputError(f"temperature is {self.temperature}", where=where,
                             fix="use a temperature >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p is {self.top_p}", where=where, fix="use 0 < top_p <= 1")
        if isinstance(self.stop, str):
            raise InputError("stop is a string, not a tuple of strings", where=where,
                             fix=f"use stop=({self.stop!r},)")
        if any(not s for s in self.stop):
            raise InputError("an empty stop string", where=where, fix="remove the empty string")


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    user_data: dict = field(default_factory=dict)  # opaque (tool/agent state), carried along


@dataclass
class RequestState:
    """Everything needed to continue a request on any engine (plain values only)."""

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]  # after the prompt: model tokens AND tool-inserted tokens
    output_logprobs: list[float]  # per output token; 0.0 for tool tokens
    output_mask: list[int]  # 1 = sampled by the model, 0 = inserted (tool result)
    params: SamplingParams
    num_generated: int  # model tokens only; counts toward max_new_tokens
    rng_state: bytes | None  # sampling generator state
    finish_reason: str | None  # None while running/paused
    user_data: dict
    # Output index where stop-string matching starts: after the last tool insertion or the last
    # stop string already acted on, so neither can end the request again.
    stop_from: int = 0

    @property
    def context_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def snapshot(self) -> RequestState:
        """A copy whose lists the engine will not touch again."""
        return replace(
            self,
            prompt_ids=list(self.prompt_ids),
            output_ids=list(self.output_ids),
            output_logprobs=list(self.output_logprobs),
            output_mask=list(self.output_mask),
            user_data=dict(self.user_data),
        )

    def append_inserted(self, ids: list[int]) -> None:
        """Append tool-result tokens (log-prob 0.0, mask 0)."""
        self.output_ids.extend(ids)
        self.output_logprobs.extend([0.0] * len(ids))
        self.output_mask.extend([0] * len(ids))
        self.stop_from = len(self.output_ids)


@dataclass
class RequestOutput:
    request_id: str
    state: RequestState
    finish_reason: str  # "eos" | "stop" | "length" | "abort"
    matched_stop: str | None


@dataclass
class EngineStats:
    """Counters of one engine. ``last_iter_tokens`` (tokens processed by the last iteration) is
    what classifies its sub-stage: >= 1024 prefill-like, [128, 1024) large decode, < 128 tail."""

    iterations: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    last_iter_tokens: int = 0
    running: int = 0
    waiting: int = 0
    paused: int = 0
    preemptions: int = 0  # running requests sent back to wait (KV budget), re-prefilled later
    kv_tokens: int = 0  # tokens whose K/V are held in the cache (running + paused)
    kv_cache_bytes: int = 0  # memory of the allocated cache (0 when no request holds one)
