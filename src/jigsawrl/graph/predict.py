"""History-based prediction of the next step's requests (the paper's temporal consistency).

Rollout shapes change slowly from step to step, so the next step's response lengths are
predicted from the observed lengths of the last ``window`` steps: the pooled lengths' quantiles,
one per sample, in a deterministic order. Before any history exists the prior is the task
preset's median (public knowledge of the task type, not the sampled truth). Multi-turn structure
is not predicted (only totals are observed): a prediction is single-turn with the total length —
a documented simplification.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from jigsawrl.workload.requests import RequestTruth, TurnTruth


@dataclass(frozen=True, slots=True)
class StepObservation:
    """What was observed of one finished rollout: per-sample prompt and response tokens."""

    step: int
    prompt_tokens: tuple[int, ...]
    response_tokens: tuple[int, ...]
    stage_durations_s: Mapping[str, float]


class HistoryPredictor:
    def __init__(self, window: int = 3) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window

    def predict(self, pipeline: str, step: int, n_samples: int,
                history: Sequence[StepObservation], prior_prompt: int, prior_response: int,
                cap: int, n_ranks: int = 1) -> list[RequestTruth]:
        """Predicted requests, ordered so that contiguous chunks for ``n_ranks`` ranks each get
        a representative mix (rank r gets the r-th, r+n-th, ... longest)."""
        prompt, lengths = self.predict_lengths(n_samples, history, prior_prompt, prior_response,
                                               cap, n_ranks)
        return [RequestTruth(f"{pipeline}/{step}/pred/{i}", prompt, (TurnTruth(n),))
                for i, n in enumerate(lengths)]

    def predict_lengths(self, n_samples: int, history: Sequence[StepObservation],
                        prior_prompt: int, prior_response: int, cap: int,
                        n_ranks: int = 1) -> tuple[int, list[int]]:
        """The predicted prompt length and response lengths of :meth:`predict`, in its order
        (for a caller that builds its own requests from them)."""
        recent = list(history)[-self.window:]
        if recent:
            resp = np.concatenate([np.asarray(o.response_tokens, float) for o in recent])
            prompt = int(np.mean(np.concatenate([np.asarray(o.prompt_tokens, float)
                                                 for o in recent])))
            qs = (np.arange(n_samples) + 0.5) / n_samples
            lengths = np.quantile(resp, qs)
        else:
            prompt = prior_prompt
            lengths = np.full(n_samples, float(prior_response))
        lengths = np.clip(np.round(lengths), 1, cap).astype(int)
        ranked = np.sort(lengths)[::-1]
        interleaved = np.concatenate([ranked[r::n_ranks] for r in range(max(1, n_ranks))])
        return prompt, interleaved.tolist()
