"""Work the ``jigsaw`` policy leaves off its decision path (issue 11: decision p99 ≤ 10 ms).

Why: every event waits for its decision, so a decision reads only what is already worked out.
What it lacks — a replan when the pipelines running change or a prediction moved, a rollout's
time at a width not timed yet — it asks for here and does without this once: the rollout that
needs the plan waits for it, a spread that needs the time is not weighed. The driver runs the
work after the decision's actions (:meth:`~jigsawrl.scheduler.base.PolicyBase.background`) and
asks for a decision again at the same instant, which then finds it done.

What that changes in a simulated run: nothing happens between the two decisions, so the plan is
the one a synchronous replan made at the same view; only the first decision's other actions go
first (they used to wait for the replan too). Replans and replays at 128 GPUs × 16 pipelines
take 10-350 ms on this project's 2-core VM; a decision now takes at most a few (docs/
BENCHMARKS.md). The work itself is timed apart (``background_times_s``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable


class Background:
    """Pending work by key (a later request of the same key replaces the earlier one: it holds
    a newer view), handed to the driver as one piece.

    ``active`` once someone took work (the driver asks after every decision, the first one
    included): until then the policy works synchronously, as it must where nothing would run
    the work — a caller deciding by hand, or a wrapper policy that does not pass ``background``
    on (its rollouts would otherwise wait for a replan forever)."""

    def __init__(self) -> None:
        self._work: dict[Hashable, Callable[[], None]] = {}
        self.handed = 0  # pieces of work handed to the driver in the run
        self.active = False

    def want(self, key: Hashable, work: Callable[[], None]) -> None:
        """Ask for ``work`` to run after this decision."""
        self._work[key] = work

    def take(self) -> Callable[[], None] | None:
        """All pending work as one callable (None: nothing pending); pending is empty after."""
        self.active = True
        if not self._work:
            return None
        todo, self._work = list(self._work.values()), {}
        self.handed += 1

        def run() -> None:
            for work in todo:
                work()
        return run
