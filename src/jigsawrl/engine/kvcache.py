"""A slot KV cache for continuous batching, and the batch layout of one forward pass.

Design (and why): every request that holds a cache owns one *slot*, a row of a preallocated
tensor per layer of shape ``[slots, kv_heads, capacity + 1, head_dim]``; its tokens sit at
positions ``0..len-1`` of that row. A forward pass covers any set of slots, each extending its
own sequence by its own number of tokens from its own start position:

- new keys/values are scattered into ``(slot, start + t)`` in place (one ``index_put_`` per layer),
  so nothing is ever concatenated or re-copied as a sequence grows; left-padding positions of a
  short row are written to a trash column (index ``capacity``) that is never read;
- attention reads the first ``max(len)`` positions of the batch's rows (a view when the slots are
  ``0..B-1`` in order, which the lowest-free-slot allocation makes the common case; otherwise one
  ``index_select``), and a 4D mask lets row ``b``, query ``t`` see positions ``<= start_b + t``;
- positions (RoPE) are explicit ``position_ids``, so rows of different lengths batch together
  with no effect of the batch on a row's result beyond float rounding.

The alternative, a transformers ``DynamicCache`` per request re-padded into a batch each step,
copies every request's whole context every decode step; at 1M-10M parameters that copying and its
Python bookkeeping would dominate. Capacity (slots and length) grows by doubling, so the memory is
``slots x longest sequence``: a few long requests beside many short ones waste some of it (a paged
cache would not; the token budget of the engine bounds what is live).

The object is duck-typed to what transformers' decoder layers call (``update``); it is not a
``transformers.Cache`` subclass, so mask creation takes our 4D mask as given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BatchLayout:
    """Tensors describing one forward pass over ``B`` rows padded on the left to ``T`` tokens."""

    input_ids: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, 1, T, L], bool (True = attend) or additive float
    slots: torch.Tensor  # [B]
    write_pos: torch.Tensor  # [B, T]; padding goes to the trash column
    read_len: int  # L
    contiguous: bool  # slots are 0..B-1 in order: attention reads a view, no gather


def build_layout(
    slots: list[int],
    starts: list[int],
    segments: list[list[int]],
    trash_pos: int,
    float_mask_dtype: torch.dtype | None,
    device: torch.device,
) -> BatchLayout:
    """Lay out rows that extend slot ``slots[b]`` by ``segments[b]`` from position ``starts[b]``.

    Args:
        trash_pos: the cache's trash column; padding writes there.
        float_mask_dtype: None for a boolean mask (sdpa); a dtype for an additive mask (eager).
    """
    start_t = torch.tensor(starts, dtype=torch.long)
    if all(len(seg) == 1 for seg in segments):  # decode: no padding (the common, hot path)
        input_ids = torch.tensor(segments, dtype=torch.long, device=device)
        position_ids = write_pos = start_t[:, None].to(device)
        read_len = max(starts) + 1
    else:  # index arithmetic on the host (small), then one copy each to the device
        lens = torch.tensor([len(s) for s in segments], dtype=torch.long)
        width = int(lens.max())
        input_ids = torch.zeros(len(slots), width, dtype=torch.long)
        for b, seg in enumerate(segments):
            input_ids[b, width - len(seg):] = torch.tensor(seg, dtype=torch.long)
        rel = torch.arange(width)[None, :] - (width - lens)[:, None]  # < 0 on padding
        pos = start_t[:, None] + rel
        write_pos = torch.where(rel >= 0, pos, torch.full_like(pos, trash_pos)).to(device)
        input_ids, position_ids = input_ids.to(device), pos.clamp(min=0).to(device)
        read_len = int((start_t + lens).max())
    # The mask ([B, 1, T, L], the largest tensor here) is built on the device itself.
    # Padding queries see position 0 (always written, finite) so no softmax row is empty.
    cols = torch.arange(read_len, device=device)
    mask = (cols[None, None, :] <= position_ids[:, :, None])[:, None]
    if float_mask_dtype is not None:
        zero = torch.zeros((), dtype=float_mask_dtype, device=device)
        neg = torch.tensor(torch.finfo(float_mask_dtype).min, dtype=float_mask_dtype,
                           device=device)
        mask = torch.where(mask, zero, neg)
    return BatchLayout(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=mask,
        slots=torch.tensor(slots, dtype=torch.long, device=device),
        write_pos=write_pos,
        read_len=read_len,
        contiguous=slots == list(range(len(slots))),
    )


def group_by_length(lengths: list[int]) -> list[list[int]]:
    """Split rows (given by their token counts) into passes whose left padding costs at most
    about as much as their real tokens: a 900-token re-prefill and a 10-token prompt do not
    share a pass. Returns row indices, ascending within each group (slot order is kept)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    real = 0
    for i in order:
        n = lengths[i]
        if groups and n * (len(groups[-1]) + 1) <= 2 * (real + n) + 64:
            groups[-1].append(i)
            real += n
        else:
            groups.append([i])
            real = n
    return [sorted(g) for g in groups]


class SlotKVCache:
    """Per-layer K/V tensors with one row (slot) per cached request; see the module docstring."""

    def __init__(self, device: torch.device, dtype: torch.dtype, max_len: int) -> None:
        self.device = device
        self.dtype = dtype
        self.max_len = max_len
        self.num_slots = 0
        self.capacity = 0
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._layout: BatchLayout | None = None

    @property
    def trash_pos(self) -> int:
        return self.capacity

    def reserve(self, num_slots: int, length: int) -> None:
        """Make room for ``num_slots`` slots of ``length`` positions (grows by doubling)."""
        if length > self.max_len:
            raise ValueError(f"KV length {length} exceeds the model's {self.max_len} positions")
        new_slots = max(self.num_slots, num_slots)
        if num_slots > self.num_slots:
            new_slots = max(num_slots, 2 * self.num_slots, 4)
        new_cap = self.capacity
        if length > self.capacity:
            new_cap = min(max(length, 2 * self.capacity, 64), self.max_len)
        if (new_slots, new_cap) == (self.num_slots, self.capacity):
            return
        self._keys = [self._grown(t, new_slots, new_cap) for t in self._keys]
        self._values = [self._grown(t, new_slots, new_cap) for t in self._values]
        self.num_slots, self.capacity = new_slots, new_cap

    def _grown(self, old: torch.Tensor, slots: int, cap: int) -> torch.Tensor:
        # Zeros, not empty: masked positions are multiplied by a 0 weight, and 0 * NaN is NaN.
        new = torch.zeros(slots, old.shape[1], cap + 1, old.shape[3], dtype=old.dtype,
                          device=old.device)
        new[: old.shape[0], :, : self.capacity] = old[:, :, : self.capacity]
        return new

    def clear(self) -> None:
        """Free all memory (the engine calls it when no request holds a cache)."""
        self._keys, self._values = [], []
        self.num_slots = self.capacity = 0

    @property
    def mem_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values))

    def begin(self, layout: BatchLayout) -> None:
        """Set the layout the next forward pass uses."""
        self._layout = layout

    def end(self) -> None:
        self._layout = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Called by each attention layer: store the new K/V, return the batch's K/V to attend."""
        lay = self._layout
        if lay is None:
            raise RuntimeError("SlotKVCache.update called outside begin()/end()")
        if layer_idx == len(self._keys):
            shape = (self.num_slots, key_states.shape[1], self.capacity + 1, key_states.shape[3])
            self._keys.append(torch.zeros(shape, dtype=key_states.dtype, device=self.device))
            vshape = (*shape[:3], value_states.shape[3])
            self._values.append(torch.zeros(vshape, dtype=value_states.dtype, device=self.device))
        slot_idx = lay.slots[:, None]
        out = []
        for store, new in ((self._keys[layer_idx], key_states),
                           (self._values[layer_idx], value_states)):
            store[slot_idx, :, lay.write_pos] = new.transpose(1, 2)
            view = store[:, :, : lay.read_len]
            if lay.contiguous:
                out.append(view[: slot_idx.shape[0]])
            else:
                out.append(view.index_select(0, lay.slots))
        return out[0], out[1]

    def copy_prefix(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Copy positions ``0..length-1`` of slots ``src[i]`` into slots ``dst[i]`` (every
        layer): a prompt prefilled once serves the other requests with the same prompt."""
        for store in (*self._keys, *self._values):
            store[dst, :, :length] = store[src, :, :length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Longest sequence of the current batch (transformers asks only without position_ids)."""
        return 0 if self._layout is None else self._layout.read_len
