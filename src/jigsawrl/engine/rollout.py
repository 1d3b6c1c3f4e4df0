"""The rollout engine: batched generation with a KV cache and continuous batching, on the model's
device (the CPU, or a CUDA GPU: the cache and every pass's tensors are made where the model is).

One `RolloutEngine.step` is one iteration, as in vLLM: admit waiting requests while the KV token
budget (`max_batch_tokens`) and `max_num_seqs` allow, then run the forward passes: one (or a few,
grouped by length so that left padding stays small) over the rows that extend by several tokens
(new prompts, tool results, re-prefills) and one over the rows that decode a single token, and
sample one token for every running request. Requests join as others finish; rows of different
lengths share a pass through the slot cache of `jigsawrl.engine.kvcache`. The budget counts the
tokens of prompt + output held in the cache; a request alone may exceed it (up to the model's
positions), so that one long request never deadlocks the engine.

- A request whose text hits a stop string (a tool call) is *paused* with its KV cache until
  `continue_request` appends the tool result (mask 0, log-prob 0.0) and prefills only those
  tokens, or `release` drops it. Paused caches are evicted when the budget is needed (the
  request is then re-prefilled when continued).
- When decoding would exceed the budget, the newest running requests are preempted: their cache is
  freed and they wait, to be re-prefilled (vLLM's recompute preemption).
- `abort` exports a request as a plain `RequestState` (`peek` returns the same without removing
  it: a checkpoint); `resume` on any engine re-prefills prompt + output (+ tool tokens) and
  continues. Under greedy sampling the continuation is what the first engine would have produced
  (equal up to float rounding of a batched vs incremental prefill).
- `load_weights` swaps weights between iterations and, by default, drops every KV cache so no token
  is generated from keys computed with old weights.
- Errors a caller can cause (empty or over-long prompt, ids outside the vocabulary, bad sampling
  values, unknown request) raise `InputError`; a request reaching the model's maximum positions
  finishes with ``"length"``.

Where the parts live: this module holds the public API (`RolloutEngine`, and re-exports of the
request values of `jigsawrl.engine.requests`); `jigsawrl.engine.admission` the request queues,
cache slots and the budget rules (admission, preemption, eviction); `jigsawrl.engine.batch` the
forward passes and sampling of one iteration; `jigsawrl.engine.models.load_weights_checked` the
weight copy.

Speed: ``HF_HUB_OFFLINE=1 python -m jigsawrl.bench.rollout qwen2-1m qwen2-10m`` (random-init
fp32, 1 thread, 16 requests x 64 new tokens, greedy) measured on 2026-11-30 on the project's 2-core
CPU machine while four other jobs shared it (load average ~3): qwen2-1m 1,830 tok/s (a plain
transformers KV-cache loop in the same run: 1,996), qwen2-10m 415 tok/s (plain loop: 480); runs
varied by 20-40% with the load. The engine stays within ~10-15% of the plain loop; the rest is the
model's own per-layer overhead, which dominates at these sizes (cpu-notes.md: 3,800 and 780 tok/s
for a plain loop on an idle machine).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace

import torch

from jigsawrl.engine.admission import RequestQueues, Seq
from jigsawrl.engine.batch import BatchRunner, plan_iteration
from jigsawrl.engine.kvcache import SlotKVCache
from jigsawrl.engine.models import check_tokenizer_matches, load_weights_checked
from jigsawrl.engine.requests import (
    EngineStats,
    GenerationRequest,
    RequestOutput,
    RequestState,
    SamplingParams,
)
from jigsawrl.engine.sampling import generator_from_state, new_generator
from jigsawrl.errors import InputError

__all__ = [
    "EngineStats",
    "GenerationRequest",
    "RequestOutput",
    "RequestState",
    "RolloutEngine",
    "SamplingParams",
]

log = logging.getLogger(__name__)


class RolloutEngine:
    """Continuous-batching generation over one causal LM (see the module docstring).

    The request queues and KV budget live in `jigsawrl.engine.admission.RequestQueues`, the
    forward passes and sampling in `jigsawrl.engine.batch.BatchRunner`; this class checks what
    callers pass and drives an iteration.

    Args:
        model: a transformers causal LM (Qwen2 / Qwen3 / Llama family), used in eval mode.
        tokenizer: its tokenizer (stop strings are matched on its decoded text).
        max_batch_tokens: KV budget: tokens cached across running and paused requests.
        max_num_seqs: most requests decoding at once.
        eos_token_id: ends a request with "eos"; default the tokenizer's.
    """

    def __init__(self, model, tokenizer, *, max_batch_tokens: int = 4096, max_num_seqs: int = 64,
                 eos_token_id: int | None = None) -> None:
        if max_batch_tokens < 2 or max_num_seqs < 1:
            raise InputError("max_batch_tokens must be >= 2 and max_num_seqs >= 1",
                             where="RolloutEngine", fix="raise the engine limits")
        check_tokenizer_matches(model, tokenizer)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_tokens = max_batch_tokens
        self.max_num_seqs = max_num_seqs
        self.eos_token_id = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        self.vocab_rows = model.get_input_embeddings().weight.shape[0]
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
        param = next(model.parameters())
        self._cache = SlotKVCache(param.device, param.dtype, self.max_positions)
        self._queues = RequestQueues(self._cache, max_batch_tokens=max_batch_tokens,
                                     max_num_seqs=max_num_seqs, max_positions=self.max_positions)
        self._batch = BatchRunner(self.model, tokenizer, self._cache,
                                  eos_token_id=self.eos_token_id, max_positions=self.max_positions)
        self._stats = EngineStats()

    # ----------------------------------------------------------------- generating

    def add_request(self, req: GenerationRequest) -> None:
        """Queue a new request.

        Raises:
            InputError: duplicate id, empty prompt, prompt not shorter than the model's maximum
                positions or longer than the KV budget, ids outside the vocabulary, bad params.
        """
        where = f"request {req.request_id!r}"
        self._check_new_id(req.request_id)
        req.params.validate(where)
        if not req.prompt_ids:
            raise InputError("empty prompt", where=where, fix="give at least one prompt token")
        n = len(req.prompt_ids)
        if n >= self.max_positions or n > self.max_batch_tokens:
            raise InputError(
                f"prompt of {n} tokens does not fit (model positions {self.max_positions}, "
                f"KV budget {self.max_batch_tokens})",
                where=where, fix="shorten the prompt or raise max_batch_tokens",
            )
        self._check_ids(req.prompt_ids, where)
        state = RequestState(req.request_id, [int(t) for t in req.prompt_ids], [], [], [],
                             req.params, 0, None, None, req.user_data)
        self._queues.add(Seq(state, self._generator(req.params, None)))

    def has_unfinished(self) -> bool:
        """True while a request is running or waiting (paused requests wait for the caller)."""
        return self._queues.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """One iteration: admit, prefill/decode one token per running request; return finishes."""
        queues = self._queues
        outputs, queues.ready = queues.ready, []
        with torch.inference_mode():  # cache tensors are created and written in inference mode
            queues.admit()
            self._stats.preemptions += queues.enforce_budget()
            groups, n_prefill, n_decode = plan_iteration(queues.running)
            for group in groups:
                outputs.extend(queues.finish(self._batch.advance(group)))
        st = self._stats
        st.iterations += bool(groups)
        st.prefill_tokens += n_prefill
        st.decode_tokens += n_decode
        st.last_iter_tokens = n_prefill + n_decode
        return outputs

    def generate(self, requests: list[GenerationRequest]) -> list[RequestOutput]:
        """Add all, step until each has an output; outputs in the order of ``requests``.

        Requests that stop on a stop string stay paused (see `continue_request`)."""
        for req in requests:
            self.add_request(req)
        want = {r.request_id for r in requests}
        got: dict[str, RequestOutput] = {}
        while len(got) < len(want):
            if not self.has_unfinished():
                raise RuntimeError("engine went idle with requests outstanding")
            got.update((o.request_id, o) for o in self.step() if o.request_id in want)
        return [got[r.request_id] for r in requests]

    # ----------------------------------------------------------------- paused requests

    def continue_request(self, request_id: str, append_ids: list[int]) -> None:
        """Resume a paused (stopped) request after appending tool tokens (mask 0).

        If the context would reach the model's maximum positions, the tokens are not appended
        and the request finishes with "length" at the next step.

        Raises:
            InputError: the request is not paused here, or ids are outside the vocabulary.
        """
        seq = self._queues.paused.get(request_id)
        if seq is None:
            raise InputError("no paused request with this id", where=f"request {request_id!r}",
                             fix="continue only requests that finished with 'stop' and were "
                             "not released, aborted or continued already")
        append_ids = [int(t) for t in append_ids]
        self._check_ids(append_ids, f"request {request_id!r}")
        del self._queues.paused[request_id]
        if not self._queues.finish_if_exhausted(seq, append_ids):
            self._queues.rejoin(seq)

    def release(self, request_id: str) -> None:
        """Drop a request (normally a paused one) and free its cache; unknown ids are ignored."""
        if request_id in self._queues.ids:
            self._queues.remove(request_id)

    # ----------------------------------------------------------------- moving requests

    def abort(self, request_id: str) -> RequestState:
        """Remove a running, waiting or paused request and return its resumable state.

        Raises:
            InputError: no such request in this engine.
        """
        self._check_known(request_id, "abort")
        return self._queues.remove(request_id).export(None)

    def peek(self, request_id: str) -> RequestState:
        """What `abort` would return now, leaving the request where it is (running, waiting or
        paused, its cache kept): a checkpoint that `resume` on another engine continues from as
        this engine will (the sampling RNG state is in it).

        Raises:
            InputError: no such request in this engine.
        """
        self._check_known(request_id, "peek")
        return self._queues.find(request_id).export(None)

    def resume(self, state: RequestState, append_ids: list[int] = ()) -> None:
        """Queue an exported request on this engine: re-prefill prompt + output + ``append_ids``
        (inserted as tool tokens), then go on decoding.

        Raises:
            InputError: duplicate id, a request that ended with eos/length, ids outside the
                vocabulary, or a context longer than the KV budget.
        """
        where = f"request {state.request_id!r}"
        append_ids = [int(t) for t in append_ids]
        self._check_new_id(state.request_id)
        if state.finish_reason not in (None, "stop", "abort"):
            raise InputError(f"request finished with {state.finish_reason!r}", where=where,
                             fix="resume only aborted or stopped requests")
        state.params.validate(where)
        state = replace(state.snapshot(), finish_reason=None)
        self._check_ids(state.prompt_ids + state.output_ids + list(append_ids), where)
        if state.context_len + len(append_ids) > self.max_batch_tokens:
            raise InputError(f"context of {state.context_len + len(append_ids)} tokens exceeds "
                             f"the KV budget {self.max_batch_tokens}", where=where,
                             fix="raise max_batch_tokens on this engine")
        seq = Seq(state, self._generator(state.params, state.rng_state))
        self._queues.ids.add(state.request_id)
        if not self._queues.finish_if_exhausted(seq, append_ids):
            self._queues.waiting.append(seq)

    # ----------------------------------------------------------------- weights and progress

    def load_weights(self, state_dict: dict, *, keep_kv: bool = False) -> None:
        """Copy a trainer's weights into the model (call between iterations).

        By default every cached K/V is dropped, so running and paused requests are re-prefilled
        with the new weights; ``keep_kv=True`` keeps the stale caches (cheaper, off-policy).

        Raises:
            InputError: missing or unexpected keys, or tensors of the wrong shape.
        """
        load_weights_checked(self.model, state_dict)
        if not keep_kv:
            self._queues.drop_caches()
        log.debug("loaded %d tensors (keep_kv=%s)", len(state_dict), keep_kv)

    @property
    def stats(self) -> EngineStats:
        queues = self._queues
        return replace(
            self._stats,
            running=len(queues.running),
            waiting=len(queues.waiting),
            paused=len(queues.paused),
            kv_tokens=queues.kv_tokens(),
            kv_cache_bytes=self._cache.mem_bytes,
        )

    def context_tokens(self, request_ids: Collection[str]) -> int:
        """Tokens of context (prompt + output so far) of the requests among ``request_ids`` that
        are running, waiting or paused here (unknown ids count 0)."""
        return self._queues.context_tokens(request_ids)

    # ----------------------------------------------------------------- validation

    def _check_new_id(self, request_id: str) -> None:
        if request_id in self._queues.ids:
            raise InputError("request id already in this engine", where=f"request {request_id!r}",
                             fix="use a unique request_id")

    def _check_known(self, request_id: str, verb: str) -> None:
        if request_id not in self._queues.ids:
            raise InputError("no such request", where=f"request {request_id!r}",
                             fix=f"{verb} only requests that are running, waiting or paused")

    def _check_ids(self, ids: list[int], where: str) -> None:
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_rows):
            raise InputError(f"token ids outside [0, {self.vocab_rows})", where=where,
                             fix="encode with the tokenizer that matches this model")

    def _generator(self, params: SamplingParams, rng_state: bytes | None) -> torch.Generator:
        if rng_state is not None:
            return generator_from_state(rng_state)
        return new_generator(params.seed)
