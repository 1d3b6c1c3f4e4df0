"""Task presets for the simulator: prompt lengths, response lengths, turns, tool latencies.

These are *distributions* of the paper's workloads (DESIGN.md §2), sampled by the simulator's truth
model only; schedulers never see the samples. Response lengths are long-tailed (lognormal) and
capped at ``max_response_tokens``; the samples of one GRPO group share a prompt and a per-prompt
difficulty factor, so lengths are correlated within a group as in real RL.

Sources and guesses (no public per-token statistics exist for these exact setups, so each value is
a documented estimate that ``length_trace`` replaces with measured data when a user has it):

- ``gsm8k`` / ``math``: prompt lengths from the datasets' question lengths plus a chat template
  (~60–150 tokens of question + ~40 of template). Qwen3 thinking-mode responses on GSM8K are a few
  hundred to a few thousand tokens; MATH responses are longer and often hit an 8k cap. The medians
  below put the mean rollout share of a step in the 40–80% range the JigsawRL lab profiled.
- ``aime-tool``: up to 4 assistant turns with a Python/math tool (paper's AIME-with-tool workload);
  sandboxed code execution latency ~0.3–3 s (lognormal, median 1 s).
- ``search-r1``: Search-R1 style multi-turn retrieval; each call inserts the top-3 documents
  (~100 tokens each); dense retrieval (e5 + FAISS IVF) latency ~0.1–1 s (median 0.3 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jigsawrl.errors import InputError
from jigsawrl.workload.requests import RequestTruth, TurnTruth


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """Distribution parameters of one task (all lengths in tokens)."""

    name: str
    prompt_mean: float
    prompt_std: float
    response_median: float  # per assistant turn
    response_sigma: float  # lognormal sigma of a sample around its prompt's median
    prompt_difficulty_sigma: float  # lognormal sigma of the per-prompt median factor
    max_turns: int = 1  # assistant turns (multi-turn tasks call a tool between turns)
    continue_prob: float = 0.0  # probability that a turn ends with a tool call
    tool_latency_median_s: float = 0.0
    tool_latency_sigma: float = 0.0
    tool_result_mean: float = 0.0
    tool_result_std: float = 0.0
    description: str = ""

    @property
    def multi_turn(self) -> bool:
        return self.max_turns > 1


TASKS: dict[str, TaskSpec] = {
    "gsm8k": TaskSpec(
        name="gsm8k", prompt_mean=140, prompt_std=35, response_median=700, response_sigma=0.7,
        prompt_difficulty_sigma=0.5, description="grade-school math, single turn",
    ),
    "math": TaskSpec(
        name="math", prompt_mean=160, prompt_std=60, response_median=1600, response_sigma=0.8,
        prompt_difficulty_sigma=0.6, description="competition math (MATH), single turn",
    ),
    "aime-tool": TaskSpec(
        name="aime-tool", prompt_mean=220, prompt_std=60, response_median=900, response_sigma=0.8,
        prompt_difficulty_sigma=0.5, max_turns=4, continue_prob=0.7, tool_latency_median_s=1.0,
        tool_latency_sigma=0.7, tool_result_mean=60, tool_result_std=30,
        description="AIME with a math/code tool, up to 4 assistant turns",
    ),
    "search-r1": TaskSpec(
        name="search-r1", prompt_mean=160, prompt_std=40, response_median=160, response_sigma=0.7,
        prompt_difficulty_sigma=0.4, max_turns=4, continue_prob=0.75, tool_latency_median_s=0.3,
        tool_latency_sigma=0.5, tool_result_mean=300, tool_result_std=60,
        description="Search-R1 multi-turn retrieval, top-3 documents per call",
    ),
}


class RequestSampler:
    """Samples the true requests of one pipeline's steps (seeded; simulator truth only).

    Args:
        task: the task distribution.
        group_size: samples per prompt (GRPO group).
        max_response_tokens: cap on generated tokens per sample (all turns together).
        drift_per_step: relative growth of response medians per step (RL responses lengthen;
            negative: they shorten; the config keeps it finite and above -1).
        trace: optional measured response lengths to resample instead of the lognormal.
    """

    def __init__(self, task: TaskSpec, *, group_size: int, max_response_tokens: int,
                 drift_per_step: float = 0.0, trace: list[tuple[int, int]] | None = None) -> None:
        self.task = task
        self.group_size = group_size
        self.max_response_tokens = max_response_tokens
        self.drift_per_step = drift_per_step
        self.trace = trace

    def sample_step(self, rng: np.random.Generator, pipeline: str, step: int,
                    batch_size: int) -> list[RequestTruth]:
        """All samples of one step: ``batch_size`` prompts × ``group_size`` responses."""
        out: list[RequestTruth] = []
        growth = self.growth(step)
        for p in range(batch_size):
            if self.trace:
                out.extend(self._from_trace(rng, pipeline, step, p))
                continue
            prompt = int(max(16, rng.normal(self.task.prompt_mean, self.task.prompt_std)))
            median = self.task.response_median * growth * math.exp(
                rng.normal(0.0, self.task.prompt_difficulty_sigma))
            for g in range(self.group_size):
                sid = f"{pipeline}/{step}/{p}/{g}"
                out.append(RequestTruth(sid, prompt, self._turns(rng, median)))
        return out

    def growth(self, step: int) -> float:
        """The factor response medians have grown by at ``step`` (``inf`` past float range:
        lengths are capped at ``max_response_tokens`` anyway)."""
        try:
            return (1.0 + self.drift_per_step) ** step
        except OverflowError:
            return math.inf

    def _turns(self, rng: np.random.Generator, median: float) -> tuple[TurnTruth, ...]:
        t = self.task
        budget = self.max_response_tokens
        turns: list[TurnTruth] = []
        for i in range(t.max_turns):
            # Capped before rounding, so a median grown past float range is the cap, not a
            # crash (for finite lengths this is the same as capping after).
            draw = median * math.exp(rng.normal(0, t.response_sigma))
            n = int(max(1, round(min(float(budget), draw))))
            budget -= n
            more = i + 1 < t.max_turns and budget > 0 and rng.random() < t.continue_prob
            if not more:
                turns.append(TurnTruth(n))
                break
            lat = t.tool_latency_median_s * math.exp(rng.normal(0, t.tool_latency_sigma))
            res = int(max(1, rng.normal(t.tool_result_mean, t.tool_result_std)))
            turns.append(TurnTruth(n, lat, res))
        return tuple(turns)

    def _from_trace(self, rng: np.random.Generator, pipeline: str, step: int,
                    p: int) -> list[RequestTruth]:
        assert self.trace is not None
        idx = rng.integers(0, len(self.trace), size=self.group_size)
        prompt = self.trace[int(idx[0])][0]
        reqs = []
        for g, i in enumerate(idx):
            resp = min(self.max_response_tokens, max(1, self.trace[int(i)][1]))
            reqs.append(RequestTruth(f"{pipeline}/{step}/{p}/{g}", prompt, (TurnTruth(resp),)))
        return reqs


def load_length_trace(path: str | Path) -> list[tuple[int, int]]:
    """Read a trace of ``prompt_tokens,response_tokens`` (or ``response_tokens``) per line.

    Lines starting with ``#`` and blank lines are skipped. A missing prompt length defaults to 128.

    Raises:
        InputError: file missing, a malformed line (named by number), or no rows.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError("length trace not found", where=str(p),
                         fix="give a text file with one 'prompt_tokens,response_tokens' per line")
    rows: list[tuple[int, int]] = []
    for n, line in enumerate(p.read_text().splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = [x.strip() for x in s.replace(";", ",").split(",")]
        try:
            vals = [int(float(x)) for x in parts]
        except ValueError:
            raise InputError(f"line {n}: {s!r} is not numbers", where=str(p),
                             fix="write 'prompt_tokens,response_tokens' per line") from None
        if len(vals) not in (1, 2) or min(vals) < 1:
            raise InputError(f"line {n}: expected 1 or 2 positive integers, got {s!r}",
                             where=str(p))
        rows.append((128, vals[0]) if len(vals) == 1 else (vals[0], vals[1]))
    if not rows:
        raise InputError("length trace has no rows", where=str(p))
    return rows
