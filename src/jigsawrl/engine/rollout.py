"""The rollout engine: batched generation with a KV cache and continuous batching, on CPU.

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

Speed: ``HF_HUB_OFFLINE=1 python -m jigsawrl.bench.rollout qwen2-1m qwen2-10m`` (random-init
fp32, 1 thread, 16 requests x 64 new tokens, greedy) measured on 2026-11-30 on the project's 2-core
CPU machine while four other jobs shared it (load average ~3): qwen2-1m 1,830 tok/s (a plain
transformers KV-cache loop in the same run: 1,996), qwen2-10m 415 tok/s (plain loop: 480); runs
varied by 20-40% with the load. The engine stays within ~10-15% of the plain loop; the rest is the
model's own per-layer overhead, which dominates at these sizes (cpu-notes.md: 3,800 and 780 tok/s
for a plain loop on an idle machine).
"""

from __future__ import annotations

import functools
import heapq
import logging
from collections import deque
from dataclasses import dataclass, replace

import torch

from jigsawrl.engine.kvcache import SlotKVCache, build_layout, group_by_length
from jigsawrl.engine.models import check_tokenizer_matches, kv_call
from jigsawrl.engine.requests import (
    EngineStats,
    GenerationRequest,
    RequestOutput,
    RequestState,
    SamplingParams,
)
from jigsawrl.engine.sampling import (
    generator_from_state,
    generator_state,
    new_generator,
    sample_tokens,
)
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


@dataclass
class _Seq:
    """Engine-private bookkeeping of one request."""

    state: RequestState
    gen: torch.Generator | None
    slot: int | None = None
    cached_len: int = 0  # tokens of prompt + output whose K/V are in the cache

    def pending(self) -> list[int]:
        """Tokens to feed next: context[cached_len:] (one token while decoding)."""
        st, n_prompt = self.state, len(self.state.prompt_ids)
        if self.cached_len >= n_prompt:
            return st.output_ids[self.cached_len - n_prompt:]
        return st.prompt_ids[self.cached_len:] + st.output_ids


class RolloutEngine:
    """Continuous-batching generation over one causal LM (see the module docstring).

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
        # The Rust tokenizer decodes ~4x faster than the transformers wrapper (stop checks run
        # every step for every request that has stop strings).
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode = (functools.partial(backend.decode, skip_special_tokens=False)
                        if backend is not None else tokenizer.decode)
        self.vocab_rows = model.get_input_embeddings().weight.shape[0]
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
        param = next(model.parameters())
        sdpa = getattr(model.config, "_attn_implementation", "sdpa") == "sdpa"
        self._mask_dtype = None if sdpa else param.dtype
        self._cache = SlotKVCache(param.device, param.dtype, self.max_positions)
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._paused: dict[str, _Seq] = {}
        self._ready: list[RequestOutput] = []
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._ids: set[str] = set()
        self._stats = EngineStats()

    # ----------------------------------------------------------------- public API

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
        self._ids.add(req.request_id)
        self._waiting.append(_Seq(state, self._generator(req.params, None)))

    def has_unfinished(self) -> bool:
        """True while a request is running or waiting (paused requests wait for the caller)."""
        return bool(self._running or self._waiting or self._ready)

    def step(self) -> list[RequestOutput]:
        """One iteration: admit, prefill/decode one token per running request; return finishes."""
        outputs, self._ready = self._ready, []
        with torch.inference_mode():  # cache tensors are created and written in inference mode
            self._admit()
            self._enforce_budget()
            rows = sorted(self._running, key=lambda s: s.slot)
            multi = [s for s in rows if s.cached_len + 1 < s.state.context_len]
            single = [s for s in rows if s.cached_len + 1 >= s.state.context_len]
            pending = [s.state.context_len - s.cached_len for s in multi]
            groups = [[multi[i] for i in g] for g in group_by_length(pending)]
            for group in (*groups, single):
                if group:
                    logits = self._forward(group)
                    outputs.extend(self._advance(group, logits))
        st = self._stats
        st.iterations += bool(rows)
        n_prefill = sum(pending)
        st.prefill_tokens += n_prefill
        st.decode_tokens += len(single)
        st.last_iter_tokens = n_prefill + len(single)
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

    def continue_request(self, request_id: str, append_ids: list[int]) -> None:
        """Resume a paused (stopped) request after appending tool tokens (mask 0).

        If the context would reach the model's maximum positions, the tokens are not appended
        and the request finishes with "length" at the next step.

        Raises:
            InputError: the request is not paused here, or ids are outside the vocabulary.
        """
        seq = self._paused.get(request_id)
        if seq is None:
            raise InputError("no paused request with this id", where=f"request {request_id!r}",
                             fix="continue only requests that finished with 'stop' and were "
                             "not released, aborted or continued already")
        append_ids = [int(t) for t in append_ids]
        self._check_ids(append_ids, f"request {request_id!r}")
        del self._paused[request_id]
        if self._finish_if_exhausted(seq, append_ids):
            return
        if seq.slot is not None and len(self._running) < self.max_num_seqs:
            self._running.append(seq)
        else:
            self._free(seq)
            self._waiting.appendleft(seq)

    def release(self, request_id: str) -> None:
        """Drop a request (normally a paused one) and free its cache; unknown ids are ignored."""
        if request_id in self._ids:
            self._remove(request_id)

    def abort(self, request_id: str) -> RequestState:
        """Remove a running, waiting or paused request and return its resumable state.

        Raises:
            InputError: no such request in this engine.
        """
        if request_id not in self._ids:
            raise InputError("no such request", where=f"request {request_id!r}",
                             fix="abort only requests that are running, waiting or paused")
        seq = self._remove(request_id)
        return self._export(seq, None)

    def peek(self, request_id: str) -> RequestState:
        """What `abort` would return now, leaving the request where it is (running, waiting or
        paused, its cache kept): a checkpoint that `resume` on another engine continues from as
        this engine will (the sampling RNG state is in it).

        Raises:
            InputError: no such request in this engine.
        """
        if request_id not in self._ids:
            raise InputError("no such request", where=f"request {request_id!r}",
                             fix="peek only requests that are running, waiting or paused")
        return self._export(self._find(request_id), None)

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
        seq = _Seq(state, self._generator(state.params, state.rng_state))
        self._ids.add(state.request_id)
        if not self._finish_if_exhausted(seq, append_ids):
            self._waiting.append(seq)

    def load_weights(self, state_dict: dict, *, keep_kv: bool = False) -> None:
        """Copy a trainer's weights into the model (call between iterations).

        By default every cached K/V is dropped, so running and paused requests are re-prefilled
        with the new weights; ``keep_kv=True`` keeps the stale caches (cheaper, off-policy).

        Raises:
            InputError: missing or unexpected keys, or tensors of the wrong shape.
        """
        own = self.model.state_dict()
        tied_out = self._tied_output_key()
        missing = set(own) - set(state_dict) - ({tied_out} if tied_out else set())
        unexpected = set(state_dict) - set(own)
        wrong = [k for k, v in state_dict.items()
                 if k in own and tuple(v.shape) != tuple(own[k].shape)]
        if missing or unexpected or wrong:
            raise InputError(
                f"state dict does not fit the model: missing {sorted(missing)[:3]}, "
                f"unexpected {sorted(unexpected)[:3]}, wrong shape {wrong[:3]}",
                where="load_weights", fix="send the state dict of the same architecture")
        with torch.no_grad():
            self.model.load_state_dict(state_dict, strict=False)
        if not keep_kv:
            for seq in (*self._running, *self._paused.values()):
                seq.cached_len = 0
        log.debug("loaded %d tensors (keep_kv=%s)", len(state_dict), keep_kv)

    @property
    def stats(self) -> EngineStats:
        return replace(
            self._stats,
            running=len(self._running),
            waiting=len(self._waiting),
            paused=len(self._paused),
            kv_tokens=sum(s.cached_len for s in (*self._running, *self._paused.values())),
            kv_cache_bytes=self._cache.mem_bytes,
        )

    # ----------------------------------------------------------------- validation

    def _check_new_id(self, request_id: str) -> None:
        if request_id in self._ids:
            raise InputError("request id already in this engine", where=f"request {request_id!r}",
                             fix="use a unique request_id")

    def _check_ids(self, ids: list[int], where: str) -> None:
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_rows):
            raise InputError(f"token ids outside [0, {self.vocab_rows})", where=where,
                             fix="encode with the tokenizer that matches this model")

    def _generator(self, params: SamplingParams, rng_state: bytes | None) -> torch.Generator:
        if rng_state is not None:
            return generator_from_state(rng_state)
        return new_generator(params.seed)

    def _tied_output_key(self) -> str | None:
        out, inp = self.model.get_output_embeddings(), self.model.get_input_embeddings()
        if out is None or out.weight is not inp.weight:
            return None
        return next((k for k, m in self.model.named_modules() if m is out), "lm_head") + ".weight"

    # ----------------------------------------------------------------- scheduling

    def _kv_used(self) -> int:
        held = [*self._running, *(s for s in self._paused.values() if s.slot is not None)]
        return sum(s.state.context_len for s in held)

    def _admit(self) -> None:
        used = self._kv_used()
        while self._waiting and len(self._running) < self.max_num_seqs:
            seq = self._waiting[0]
            # Headroom of one token per running request, so an admission is not preempted
            # by the very next decode step.
            need = seq.state.context_len + len(self._running) + 1
            while used + need > self.max_batch_tokens and self._evict_one_paused():
                used = self._kv_used()
            if used + need > self.max_batch_tokens and self._running:
                break
            self._waiting.popleft()
            self._allocate(seq)
            self._running.append(seq)
            used += seq.state.context_len

    def _enforce_budget(self) -> None:
        while self._kv_used() > self.max_batch_tokens:
            if self._evict_one_paused():
                continue
            if len(self._running) <= 1:
                break
            seq = self._running.pop()
            self._free(seq)
            self._waiting.appendleft(seq)
            self._stats.preemptions += 1
            log.debug("preempted %s (KV budget)", seq.state.request_id)

    def _evict_one_paused(self) -> bool:
        for seq in self._paused.values():  # oldest pause first
            if seq.slot is not None:
                self._free(seq)
                log.debug("evicted the cache of paused %s", seq.state.request_id)
                return True
        return False

    def _allocate(self, seq: _Seq) -> None:
        if self._free_slots:
            seq.slot = heapq.heappop(self._free_slots)
        else:
            seq.slot = self._next_slot
            self._next_slot += 1
        seq.cached_len = 0
        self._cache.reserve(seq.slot + 1, 0)

    def _free(self, seq: _Seq) -> None:
        if seq.slot is not None:
            heapq.heappush(self._free_slots, seq.slot)
            if len(self._free_slots) == self._next_slot:  # nobody holds a cache: free memory
                self._free_slots, self._next_slot = [], 0
                self._cache.clear()
        seq.slot = None
        seq.cached_len = 0

    def _find(self, request_id: str) -> _Seq:
        """The queued (paused, running or waiting) request with this id."""
        seq = self._paused.get(request_id)
        if seq is None:
            seq = next((s for s in (*self._running, *self._waiting)
                        if s.state.request_id == request_id), None)
        if seq is None:
            raise RuntimeError(f"request {request_id!r} is registered but not queued")
        return seq

    def _remove(self, request_id: str) -> _Seq:
        seq = self._find(request_id)
        self._ids.discard(request_id)
        if self._paused.pop(request_id, None) is None:
            if any(s is seq for s in self._running):
                self._running = [s for s in self._running if s is not seq]
            else:
                self._waiting = deque(s for s in self._waiting if s is not seq)
        self._free(seq)
        return seq

    # ----------------------------------------------------------------- model work

    def _forward(self, group: list[_Seq]) -> torch.Tensor:
        """Feed each row its pending tokens; return the last position's logits, [B, V]."""
        segments = [s.pending() for s in group]
        starts = [s.cached_len for s in group]
        self._cache.reserve(max(s.slot for s in group) + 1,
                            max(a + len(b) for a, b in zip(starts, segments, strict=True)))
        layout = build_layout([s.slot for s in group], starts, segments, self._cache.trash_pos,
                              self._mask_dtype, self._cache.device)
        self._cache.begin(layout)
        try:
            logits = kv_call(self.model, layout.input_ids, layout.attention_mask,
                             layout.position_ids, self._cache, logits_to_keep=1)
        finally:
            self._cache.end()
        for seq, seg in zip(group, segments, strict=True):
            seq.cached_len += len(seg)
        return logits[:, -1]

    def _advance(self, group: list[_Seq], logits: torch.Tensor) -> list[RequestOutput]:
        params = [s.state.params for s in group]
        tokens, logprobs = sample_tokens(
            logits, [p.temperature for p in params], [p.top_p for p in params],
            [s.gen for s in group])
        outputs = []
        for seq, tok, lp in zip(group, tokens, logprobs, strict=True):
            st = seq.state
            st.output_ids.append(tok)
            st.output_logprobs.append(lp)
            st.output_mask.append(1)
            st.num_generated += 1
            matched = None
            if tok == self.eos_token_id:
                reason = "eos"
            elif st.params.stop and (matched := self._match_stop(seq)) is not None:
                reason = "stop"
            elif (st.num_generated >= st.params.max_new_tokens
                  or st.context_len >= self.max_positions):
                reason = "length"
            else:
                continue
            outputs.append(self._finish(seq, reason, matched))
        if outputs:
            done = {o.request_id for o in outputs}
            self._running = [s for s in self._running if s.state.request_id not in done]
        return outputs

    def _match_stop(self, seq: _Seq) -> str | None:
        """The first stop string present in the recent model text (a window covers the longest
        stop string even at 4 tokens per character, e.g. byte-level BPE)."""
        out = seq.state.output_ids
        window = 4 * max(len(s) for s in seq.state.params.stop) + 4
        text = self._decode(out[max(seq.state.stop_from, len(out) - window):])
        hits = [(text.find(s), i) for i, s in enumerate(seq.state.params.stop) if s in text]
        return seq.state.params.stop[min(hits)[1]] if hits else None

    def _finish(self, seq: _Seq, reason: str, matched: str | None) -> RequestOutput:
        rid = seq.state.request_id
        if reason == "stop":  # a tool call: keep the cache until continue_request / release
            seq.state.stop_from = len(seq.state.output_ids)
            self._paused[rid] = seq
            return RequestOutput(rid, self._export(seq, reason), reason, matched)
        self._ids.discard(rid)
        self._free(seq)
        return RequestOutput(rid, self._export(seq, reason), reason, matched)

    def _finish_if_exhausted(self, seq: _Seq, append_ids: list[int]) -> bool:
        """Apply tool tokens; finish with "length" (queued for step) if no token may follow."""
        st = seq.state
        if st.context_len + len(append_ids) < self.max_positions:
            if append_ids:
                st.append_inserted(append_ids)
            if st.num_generated < st.params.max_new_tokens:
                return False
        self._ids.discard(st.request_id)
        self._free(seq)
        self._ready.append(RequestOutput(st.request_id, self._export(seq, "length"), "length",
                                         None))
        return True

    def _export(self, seq: _Seq, reason: str | None) -> RequestState:
        snap = seq.state.snapshot()
        snap.finish_reason = reason
        snap.rng_state = generator_state(seq.gen) if seq.gen is not None else snap.rng_state
        return snap
