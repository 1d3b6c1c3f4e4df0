"""Task presets for the simulator: prompt lengths, response lengths, turns, tool latencies.

These are *distributions* of the paper's workloads (DESIGN.md §2), sampled by the simulator's truth
model only; schedulers never see the samples. Response lengths are long-tailed (lognormal) and
capped at ``max_response_tokens``; the samples of one GRPO group share a prompt and a per-prompt
difficulty factor, so lengths are correlated within a group as in real RL.

Thinking and instruct models differ by an order of magnitude on the same dataset (reference/
gpu-anchors.md, "Response lengths in RL"), so each single-turn preset says which it is and what
published statistic it was checked against (``tests/workload`` recomputes the capped mean and
clip ratio of each from :func:`capped_lognormal_mean` / :func:`clip_ratio`):

- ``gsm8k`` — *thinking* (Qwen3 in thinking mode): median 700, capped mean ~1,000 at an 8192
  cap, 0.2% clipped. No published thinking-mode GSM8K statistics exist here; the medians were set
  for the JigsawRL lab's runs (generation 40-80% of a step, as the lab profiled; anchor ``lab``
  of ``anchors/`` uses this preset and its generation time comes out within 13%).
- ``gsm8k-instruct`` — *instruct* (non-thinking 7B-class): capped mean 200 and 0.13% clipped at
  a 1024 cap, inside the published 180-230 tokens and 0.0002-0.003 clip ratio.
- ``math`` — *thinking* (Qwen3 on MATH, competition math): median 1,600, capped mean ~2,360 at
  8192 (5% clipped). Not checked against a published run: the published thinking-model numbers
  are on the harder DAPO-Math set (``dapo-math``); MATH answers are shorter.
- ``dapo-math`` — *thinking*, hard math (DAPO-Math-17k): a Qwen3-8B run at a 4096 cap had mean
  4,003 and 90% at the cap; this preset gives 4,003 and 90% there, and 55% at an 8192 cap
  ("over half" for Qwen3-235B).
- ``math-r1`` — *thinking*, DeepSeek-R1 distills' long chains of thought: capped mean 14,255 at a
  27,648 cap (anchor ``H``'s published mean; 10% clipped, the spread an assumption).

Prompt lengths come from the datasets' question lengths plus a chat template (~60–150 tokens of
question + ~40 of template). Where no per-token statistics exist for a setup, a value is a
documented estimate that ``length_trace`` replaces with measured data when a user has it:

- ``aime-tool``: up to 4 assistant turns with a Python/math tool (paper's AIME-with-tool workload);
  sandboxed code execution latency ~0.3–3 s (lognormal, median 1 s).
- ``search-r1``: Search-R1 style multi-turn retrieval; each call inserts the top-3 documents
  (~100 tokens each); dense retrieval (e5 + FAISS IVF) latency ~0.1–1 s (median 0.3 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from jigsawrl.errors import InputError
from jigsawrl.workload.requests import RequestTruth, TurnTruth

_NORMAL = NormalDist()
# How a preset's total lognormal sigma of response lengths splits into the per-prompt difficulty
# and the per-sample part (0.6^2 + 0.8^2 = 1): samples of one prompt are correlated, as in real
# GRPO groups (an assumption; the split moves neither the mean nor the clip ratio).
DIFFICULTY_SHARE = 0.6
SAMPLE_SHARE = 0.8


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
        prompt_difficulty_sigma=0.5, description="grade-school math, single turn, thinking model",
    ),
    "gsm8k-instruct": TaskSpec(
        name="gsm8k-instruct", prompt_mean=140, prompt_std=35, response_median=167.1,
        response_sigma=SAMPLE_SHARE * 0.602, prompt_difficulty_sigma=DIFFICULTY_SHARE * 0.602,
        description="grade-school math, single turn, instruct (non-thinking) model",
    ),
    "math": TaskSpec(
        name="math", prompt_mean=160, prompt_std=60, response_median=1600, response_sigma=0.8,
        prompt_difficulty_sigma=0.6,
        description="competition math (MATH), single turn, thinking model",
    ),
    "dapo-math": TaskSpec(
        name="dapo-math", prompt_mean=160, prompt_std=60, response_median=8860.0,
        response_sigma=SAMPLE_SHARE * 0.602, prompt_difficulty_sigma=DIFFICULTY_SHARE * 0.602,
        description="hard competition math (DAPO-Math-17k), single turn, thinking model",
    ),
    "math-r1": TaskSpec(
        name="math-r1", prompt_mean=160, prompt_std=60, response_median=12758.6,
        response_sigma=SAMPLE_SHARE * 0.6, prompt_difficulty_sigma=DIFFICULTY_SHARE * 0.6,
        description="competition math, thinking model with long chains of thought (R1 distills)",
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


def capped_lognormal_mean(median: float, sigma: float, cap: float) -> float:
    """Mean of ``min(X, cap)`` for X lognormal with ``median`` and log-sigma ``sigma``."""
    if sigma <= 0.0:
        return min(median, cap)
    mu = math.log(median)
    a = (math.log(cap) - mu) / sigma
    return (math.exp(mu + sigma * sigma / 2.0) * _NORMAL.cdf(a - sigma)
            + cap * (1.0 - _NORMAL.cdf(a)))


def clip_ratio(median: float, sigma: float, cap: float) -> float:
    """Fraction of lognormal(median, sigma) lengths at or above ``cap`` (clipped responses)."""
    if sigma <= 0.0:
        return 1.0 if median >= cap else 0.0
    return 1.0 - _NORMAL.cdf((math.log(cap) - math.log(median)) / sigma)


def lognormal_for(cap: float, *, median: float | None = None, mean: float | None = None,
                  clip: float | None = None, sigma: float | None = None) -> tuple[float, float]:
    """``(median, sigma)`` of a lognormal whose capped lengths match published statistics.

    Give two of: ``median`` (uncapped median), ``mean`` (mean of the *capped* lengths),
    ``clip`` (fraction at the cap, in (0, 1)), ``sigma``. Solved in closed form where one is,
    else by bisection (the capped mean grows with the median at a fixed sigma, and falls with
    sigma at a fixed clip ratio).

    Raises:
        ValueError: not exactly two statistics, or ones no lognormal under ``cap`` reaches.
    """
    given = {k: v for k, v in (("median", median), ("mean", mean), ("clip", clip),
                               ("sigma", sigma)) if v is not None}
    if len(given) != 2:
        raise ValueError(f"give exactly two of median, mean, clip, sigma; got {sorted(given)}")
    if clip is not None and not 0.0 < clip < 1.0:
        raise ValueError(f"clip must be in (0, 1), got {clip}")
    if median is not None and sigma is not None:
        return median, sigma
    if median is not None and clip is not None:
        return median, math.log(cap / median) / _NORMAL.inv_cdf(1.0 - clip)
    if sigma is not None:  # with mean or clip
        if clip is not None:
            return cap / math.exp(sigma * _NORMAL.inv_cdf(1.0 - clip)), sigma
        assert mean is not None
        return _bisect(lambda m: capped_lognormal_mean(m, sigma, cap) - mean,
                       1e-3, 1e3 * cap), sigma
    assert mean is not None and clip is not None
    z = _NORMAL.inv_cdf(1.0 - clip)

    def excess(s: float) -> float:  # at a fixed clip ratio the capped mean falls with sigma
        return mean - capped_lognormal_mean(cap / math.exp(s * z), s, cap)

    s = _bisect(excess, 1e-4, 5.0)
    return cap / math.exp(s * z), s


def _bisect(f, lo: float, hi: float, iters: int = 200) -> float:  # noqa: ANN001
    """Root of an increasing ``f`` in [lo, hi] (geometric midpoints: the range spans decades)."""
    if f(lo) > 0.0 or f(hi) < 0.0:
        raise ValueError("no lognormal under the cap matches these statistics")
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        if f(mid) < 0.0:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


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
