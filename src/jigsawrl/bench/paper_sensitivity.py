"""How much each headline ratio of ``bench paper`` rests on an assumption no GPU here measures.

Two assumptions of the cost model move ratios between co-locating and dedicated placements and
cannot be profiled without the GPUs (``docs/FIDELITY.md``):

- **co-location slowdown**: ``CostParams.s_sat``, the share of a device's compute at which a
  decode already reads at full memory bandwidth. The default, 0.4, makes a decode beside other
  work nearly free (cheap co-location); 0.8 makes it costly;
- **offload**: verl's ``param_offload`` and ``optimizer_offload``, which add host transfers
  around every actor call (off by default; the lab's anchored run uses them).

For every group, the lead policy and each headline baseline in it (``verl``, ``rollmux``,
``streamrl``, ``areal``) are re-run under each setting below, on the group's first seed, and the
lead's throughput ratio to each is kept beside the default's. The default column is the main
run's ratio (its mean over seeds); with one seed they are the same run.

What moves with offload is only time: the memory accounting of every policy keeps the train
state on the device either way (the same for all of them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jigsawrl.bench.paper_matrix import GroupResult
from jigsawrl.config import ExperimentConfig
from jigsawrl.errors import ConfigError
from jigsawrl.experiments.compare import compare_policies
from jigsawrl.experiments.simulated import cost_assumptions

log = logging.getLogger(__name__)

HEADLINE_BASELINES = ("verl", "rollmux", "streamrl", "areal")


@dataclass(frozen=True, slots=True)
class Setting:
    """One assumption changed from the default."""

    label: str
    params: dict[str, Any]
    offload: bool = False


SETTINGS = (Setting("s_sat 0.8", {"s_sat": 0.8}), Setting("offload on", {}, offload=True))


def with_offload(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with verl's parameter and optimizer offload on for every pipeline."""
    pipes = [p.model_copy(update={"train": p.train.model_copy(update={
        "param_offload": True, "optimizer_offload": True})}) for p in cfg.pipelines]
    return cfg.model_copy(update={"pipelines": pipes})


def run_sensitivity(res: GroupResult, *, on_run: Callable[[], None] | None = None,
                    ) -> dict[str, dict[str, float]]:
    """``setting label -> baseline -> lead ÷ baseline throughput`` for one group (module
    docstring); a setting under which the lead or every baseline cannot run is left out."""
    if res.result is None or res.group.lead not in res.result.runs:
        return {}
    lead = res.group.lead
    bases = [b for b in HEADLINE_BASELINES if b in res.result.runs]
    if not bases:
        return {}
    labels = [lead, *bases]
    variants = {k: res.group.policy_of(k) for k in labels}
    out: dict[str, dict[str, float]] = {}
    for s in SETTINGS:
        cfg = with_offload(res.config) if s.offload else res.config
        try:
            with cost_assumptions(**s.params):
                r = compare_policies(cfg, labels, seeds=1, on_run=on_run, baseline=bases[0],
                                     skip_failed=True, variants=variants)
        except ConfigError as exc:
            log.warning("%s: sensitivity %s skipped: %s", res.group.name, s.label, exc)
            continue
        if lead in r.runs:
            ratios = r.ratios()[lead]
            out[s.label] = {b: ratios[b] for b in bases if b in ratios}
    return out
