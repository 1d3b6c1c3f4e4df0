"""A small event queue with one ordering key, ``(time_s, priority, seq)``.

Why one key: simultaneous events must be processed in a defined order or a simulation stops being
deterministic. Ties on ``time_s`` are broken by ``priority`` (lower first), then by ``seq`` (the order
of scheduling). Cancelled entries are skipped lazily (tombstones), which keeps rescheduling O(log n)
— the simulator reschedules a worker's completion every time its share or batch changes.

The heap holds ``(time_s, priority, seq, entry)`` tuples: ``seq`` is unique, so the order is the
key's and tuples compare in C (an ordered dataclass compares through Python, the simulator's
single largest cost at 512 devices).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

# Priorities for simultaneous events: completions first (they free resources), then arrivals
# (tool results), then wake-ups. Tested in tests/sim/test_kernel.py.
PRIO_FINISH = 0
PRIO_ARRIVAL = 1
PRIO_WAKE = 2


@dataclass(slots=True, eq=False)
class Entry:
    time_s: float
    priority: int
    seq: int
    payload: Any
    cancelled: bool = False


class EventQueue:
    """Min-heap of :class:`Entry` ordered by ``(time_s, priority, seq)``."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Entry]] = []
        self._seq = 0
        self.now_s = 0.0

    def schedule(self, time_s: float, payload: Any, priority: int = PRIO_FINISH) -> Entry:
        """Schedule ``payload`` at ``time_s`` (not before now). Returns a handle for :meth:`cancel`."""
        if time_s < self.now_s:
            time_s = self.now_s  # float rounding can land a hair in the past
        seq = self._seq
        entry = Entry(time_s, priority, seq, payload)
        self._seq = seq + 1
        heapq.heappush(self._heap, (time_s, priority, seq, entry))
        return entry

    @staticmethod
    def cancel(entry: Entry | None) -> None:
        if entry is not None:
            entry.cancelled = True

    def pop(self) -> Entry | None:
        """Remove and return the next live entry, advancing ``now_s``; ``None`` when empty."""
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)[3]
            if not entry.cancelled:
                self.now_s = entry.time_s
                return entry
        return None

    def peek_time(self) -> float | None:
        heap = self._heap
        while heap and heap[0][3].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def __len__(self) -> int:
        return sum(1 for e in self._heap if not e[3].cancelled)
