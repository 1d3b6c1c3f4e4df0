"""Issue 11 item 3: the plan forecast's makespan — what jigsaw predicts at its first decision
for its own plan (``policy_report.plan.jigsaw_s``) — within 10% of what the event kernel (the
simulator) then runs, on fixed scenarios: the example configs and the paper's groups at seeds
0 and 1 (jigsaw's own plan: ``fallback`` off; the rollout TPs it searched). The forecast reads the task priors
and the belief cost model only; the run samples its requests and noise from the truth."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jigsawrl.config import validate_config
from jigsawrl.experiments.simulated import simulate

ROOT = Path(__file__).resolve().parents[2]
PAPER = ("sync-gsm8k-gsm8k", "sync-gsm8k-math", "sync-aime-aime", "sync-search-search",
         "sync-32b-gsm8k-math", "async-gsm8k-math", "async-aime-search", "hetero-0.6b-llama8b")
SCENARIOS = [
    (path, seed)
    for path in (*(f"configs/{c}.yaml" for c in ("two-gsm8k", "four-mixed", "eight-per-node",
                                                  "two-async")),
                 *(f"configs/paper/{c}.yaml" for c in PAPER))
    for seed in (0, 1)
]
MAX_ERROR = 0.10


@pytest.mark.parametrize(("path", "seed"), SCENARIOS)
def test_the_plan_forecast_is_within_10_percent_of_the_simulated_makespan(path: str,
                                                                          seed: int) -> None:
    raw = yaml.safe_load((ROOT / path).read_text())
    raw.pop("bench", None)
    raw["seed"] = seed
    raw["scheduler"] = {"name": "jigsaw", "params": {"fallback": False}}
    run = simulate(validate_config(raw, source=path), policy="jigsaw", solo=False)
    predicted = run.summary["policy_report"]["plan"]["jigsaw_s"]
    simulated = run.summary["makespan_s"]
    assert abs(predicted / simulated - 1.0) <= MAX_ERROR, (predicted, simulated)
