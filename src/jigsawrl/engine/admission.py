"""Request admission and KV-cache slots of the rollout engine: its queues and the budget rules.

What: `RequestQueues` holds every request of one `jigsawrl.engine.rollout.RolloutEngine` — waiting
(FIFO), running (the batch of the next iteration), paused (stopped on a tool call, its cache kept
until it is needed) and ready (finished outside an iteration, returned by the next `step`) — and
hands out the slots of the engine's `jigsawrl.engine.kvcache.SlotKVCache` (lowest free slot first).
It applies the engine's budget rules:

- admission: waiting requests join while ``max_num_seqs`` and the KV token budget allow (with one
  token of headroom per running request); a request alone may exceed the budget, so one long
  request never deadlocks the engine;
- when decoding would exceed the budget, paused caches are evicted first (oldest pause first),
  then the newest running requests are preempted: their cache is freed and they wait at the front,
  to be re-prefilled (vLLM's recompute preemption).

Why a class of its own: the engine's public calls (add, continue, abort, resume) and its batched
iteration all move requests between these queues; the moves and the budget rules stay in one
place, and the engine reads top to bottom.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

import torch

from jigsawrl.engine.kvcache import SlotKVCache
from jigsawrl.engine.requests import RequestOutput, RequestState
from jigsawrl.engine.sampling import generator_state

__all__ = ["RequestQueues", "Seq"]

log = logging.getLogger(__name__)


@dataclass
class Seq:
    """The engine's bookkeeping of one request (not exported: `export` gives the plain state)."""

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

    def export(self, reason: str | None) -> RequestState:
        """A copy of the state with ``finish_reason=reason`` and the sampling RNG state now."""
        snap = self.state.snapshot()
        snap.finish_reason = reason
        snap.rng_state = generator_state(self.gen) if self.gen is not None else snap.rng_state
        return snap


class RequestQueues:
    """The requests of one engine and the slots of its KV cache (see the module docstring).

    Args:
        cache: the engine's slot cache (cleared when no request holds a slot).
        max_batch_tokens: KV budget: tokens cached across running and paused requests.
        max_num_seqs: most requests running at once.
        max_positions: the model's maximum positions (no token may follow a context this long).
    """

    def __init__(self, cache: SlotKVCache, *, max_batch_tokens: int, max_num_seqs: int,
                 max_positions: int) -> None:
        self.cache = cache
        self.max_batch_tokens = max_batch_tokens
        self.max_num_seqs = max_num_seqs
        self.max_positions = max_positions
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.paused: dict[str, Seq] = {}
        self.ready: list[RequestOutput] = []
        self.ids: set[str] = set()  # every request here, in any queue
        self._free_slots: list[int] = []
        self._next_slot = 0

    # ----------------------------------------------------------------- reading

    def has_unfinished(self) -> bool:
        """True while a request is running, waiting or ready (paused ones wait for the caller)."""
        return bool(self.running or self.waiting or self.ready)

    def kv_tokens(self) -> int:
        """Tokens whose K/V are held in the cache (running and paused requests)."""
        return sum(s.cached_len for s in (*self.running, *self.paused.values()))

    def context_tokens(self, request_ids: Collection[str]) -> int:
        """Tokens of context (prompt + output) of the queued requests among ``request_ids``."""
        held = (*self.running, *self.waiting, *self.paused.values())
        return sum(s.state.context_len for s in held if s.state.request_id in request_ids)

    def find(self, request_id: str) -> Seq:
        """The queued (paused, running or waiting) request with this id."""
        seq = self.paused.get(request_id)
        if seq is None:
            seq = next((s for s in (*self.running, *self.waiting)
                        if s.state.request_id == request_id), None)
        if seq is None:
            raise RuntimeError(f"request {request_id!r} is registered but not queued")
        return seq

    # ----------------------------------------------------------------- moving requests

    def add(self, seq: Seq) -> None:
        """Register a request and queue it last."""
        self.ids.add(seq.state.request_id)
        self.waiting.append(seq)

    def rejoin(self, seq: Seq) -> None:
        """Put a continued (formerly paused) request back: into the batch if it kept its cache
        and there is room, else first in line (its cache freed, to be re-prefilled)."""
        if seq.slot is not None and len(self.running) < self.max_num_seqs:
            self.running.append(seq)
        else:
            self.free(seq)
            self.waiting.appendleft(seq)

    def remove(self, request_id: str) -> Seq:
        """Take a request out of every queue and free its cache."""
        seq = self.find(request_id)
        self.ids.discard(request_id)
        if self.paused.pop(request_id, None) is None:
            if any(s is seq for s in self.running):
                self.running = [s for s in self.running if s is not seq]
            else:
                self.waiting = deque(s for s in self.waiting if s is not seq)
        self.free(seq)
        return seq

    def finish(self, finishing: list[tuple[Seq, str, str | None]]) -> list[RequestOutput]:
        """End running requests that sampled their last token: ``(seq, reason, matched stop)``.

        A ``"stop"`` (a tool call) pauses the request with its cache until it is continued or
        released; any other reason unregisters it and frees its cache."""
        outputs = []
        for seq, reason, matched in finishing:
            rid = seq.state.request_id
            if reason == "stop":
                seq.state.stop_from = len(seq.state.output_ids)
                self.paused[rid] = seq
            else:
                self.ids.discard(rid)
                self.free(seq)
            outputs.append(RequestOutput(rid, seq.export(reason), reason, matched))
        if outputs:
            done = {o.request_id for o in outputs}
            self.running = [s for s in self.running if s.state.request_id not in done]
        return outputs

    def finish_if_exhausted(self, seq: Seq, append_ids: list[int]) -> bool:
        """Apply tool tokens; finish with "length" (ready for the next step) if no token may
        follow. Returns True if the request finished."""
        st = seq.state
        if st.context_len + len(append_ids) < self.max_positions:
            if append_ids:
                st.append_inserted(append_ids)
            if st.num_generated < st.params.max_new_tokens:
                return False
        self.ids.discard(st.request_id)
        self.free(seq)
        self.ready.append(RequestOutput(st.request_id, seq.export("length"), "length", None))
        return True

    def drop_caches(self) -> None:
        """Forget every cached K/V (new weights): running and paused requests re-prefill."""
        for seq in (*self.running, *self.paused.values()):
            seq.cached_len = 0

    # ----------------------------------------------------------------- the KV budget

    def admit(self) -> None:
        """Move waiting requests into the batch while the limits allow (evicting paused caches
        if that makes room)."""
        used = self._kv_used()
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            # Headroom of one token per running request, so an admission is not preempted
            # by the very next decode step.
            need = seq.state.context_len + len(self.running) + 1
            while used + need > self.max_batch_tokens and self._evict_one_paused():
                used = self._kv_used()
            if used + need > self.max_batch_tokens and self.running:
                break
            self.waiting.popleft()
            self._allocate(seq)
            self.running.append(seq)
            used += seq.state.context_len

    def enforce_budget(self) -> int:
        """Evict paused caches, then preempt the newest running requests, until the cached
        contexts fit the budget (one running request always stays). Returns the preemptions."""
        preempted = 0
        while self._kv_used() > self.max_batch_tokens:
            if self._evict_one_paused():
                continue
            if len(self.running) <= 1:
                break
            seq = self.running.pop()
            self.free(seq)
            self.waiting.appendleft(seq)
            preempted += 1
            log.debug("preempted %s (KV budget)", seq.state.request_id)
        return preempted

    def free(self, seq: Seq) -> None:
        """Give the request's slot back (its cache is gone); clear the cache when none is held."""
        if seq.slot is not None:
            heapq.heappush(self._free_slots, seq.slot)
            if len(self._free_slots) == self._next_slot:  # nobody holds a cache: free memory
                self._free_slots, self._next_slot = [], 0
                self.cache.clear()
        seq.slot = None
        seq.cached_len = 0

    def _kv_used(self) -> int:
        held = [*self.running, *(s for s in self.paused.values() if s.slot is not None)]
        return sum(s.state.context_len for s in held)

    def _evict_one_paused(self) -> bool:
        for seq in self.paused.values():  # oldest pause first
            if seq.slot is not None:
                self.free(seq)
                log.debug("evicted the cache of paused %s", seq.state.request_id)
                return True
        return False

    def _allocate(self, seq: Seq) -> None:
        if self._free_slots:
            seq.slot = heapq.heappop(self._free_slots)
        else:
            seq.slot = self._next_slot
            self._next_slot += 1
        seq.cached_len = 0
        self.cache.reserve(seq.slot + 1, 0)
