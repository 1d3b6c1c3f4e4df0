"""StreamRL's output-length ranker, from what a real system sees: history and the prompt.

A skew-aware dispatch (StreamRL, ``reference/peers.md``) deals a step's requests longest-predicted
first to the least-loaded rank. The prediction must not read the response lengths the simulator
sampled for this step (DESIGN.md §6): a real ranker sees the prompt before generating and the
pipeline's finished steps. :class:`LengthRanker` is that predictor: a least-squares line of
response tokens on prompt tokens, fitted on the observed samples of the last ``window`` steps
(``PipelineView.history``), and evaluated by the executor on the prompt lengths of the step it
dispatches. The policy fits it and hands it over on :class:`~jigsawrl.scheduler.base.StartRollout`;
the executor applies it to prompt tokens only, so the order uses no truth.

What this means here: StreamRL's published ranker is a learned model over the prompt's content.
The simulator's prompts carry only a length, which the task presets draw independently of the
response length, so the honest ranker has little signal on preset workloads: skew-aware dispatch
then balances requests by count (ties keep request order), like a random deal. A workload whose
prompt length predicts its response length (a length trace) gives it more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jigsawrl.graph.predict import StepObservation

# Past steps the ranker is fitted on (as HistoryPredictor's window).
RANKER_WINDOW = 3


@dataclass(frozen=True, slots=True)
class LengthRanker:
    """Predicted response tokens = ``intercept + slope × prompt tokens`` (see the module doc).

    The default (no history) predicts the same length for every request: dispatch by count.
    """

    intercept: float = 0.0
    slope: float = 0.0

    def predict(self, prompt_tokens: int) -> float:
        return self.intercept + self.slope * float(prompt_tokens)

    @classmethod
    def fit(cls, history: Sequence[StepObservation],
            window: int = RANKER_WINDOW) -> LengthRanker:
        """Least squares on the observed (prompt, response) pairs of the last ``window`` steps."""
        recent = list(history)[-window:]
        if not recent:
            return cls()
        x = np.concatenate([np.asarray(o.prompt_tokens, float) for o in recent])
        y = np.concatenate([np.asarray(o.response_tokens, float) for o in recent])
        if len(x) == 0 or len(x) != len(y):
            return cls()
        mean_x, mean_y = float(np.mean(x)), float(np.mean(y))
        var = float(np.mean((x - mean_x) ** 2))
        slope = float(np.mean((x - mean_x) * (y - mean_y))) / var if var > 0 else 0.0
        return cls(mean_y - slope * mean_x, slope)
