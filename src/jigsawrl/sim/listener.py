"""What the simulator tells its owner: a rollout rank changed, a task finished.

The simulator sits below the driver (DESIGN.md §4), so it does not build the driver's
notifications itself; its owner (``executors/simulated.py``) passes a :class:`SimListener` that
turns these calls into :mod:`jigsawrl.driver.protocol` records. Metric records (spans, finished
samples) are :mod:`jigsawrl.events`, which the simulator writes directly.
"""

from __future__ import annotations

from typing import Protocol


class SimListener(Protocol):
    """Receives the simulator's control messages, in the order they happen."""

    def rank_progress(self, task_id: str, rank: int, unfinished: int, band: str, time_s: float,
                      ctx_tokens: int) -> None:
        """Rank ``rank`` of rollout ``task_id`` now has ``unfinished`` requests, in ``band``
        (its running sub-stage, ``tool_wait``, or ``done``), holding ``ctx_tokens`` of context."""
        ...

    def task_done(self, task_id: str, pipeline: str, step: int, stage: str, time_s: float,
                  prompt_tokens: tuple[int, ...] = (),
                  response_tokens: tuple[int, ...] = ()) -> None:
        """Task ``task_id`` ended at ``time_s`` (a rollout: with its samples' token counts, in
        sample order)."""
        ...
