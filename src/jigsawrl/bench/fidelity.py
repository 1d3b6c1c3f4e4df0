"""``jigsawrl bench fidelity``: the simulator against published GPU runs, leave-one-out.

What: each file of ``anchors/`` is a published verl run (``reference/gpu-anchors.md``): an
experiment config that reproduces its setup (cluster, one pipeline, a verl placement), its
published stage times, its source text and every setting the source leaves unstated, fixed in
the file with the reason. This bench

1. *probes* each anchor: one simulation (verl on the run's GPUs, noise off) gives the tokens
   of each step and the generation time, and for an eager rollout a second one how the
   generation grows with the eager-decode cost (:class:`~jigsawrl.costmodel.anchor_fit.AnchorProbe`);
2. fits the cost model's few global constants (:mod:`jigsawrl.costmodel.anchor_fit`) once per
   anchor *without* it (leave-one-out), and once on all anchors (what ``CostParams``' defaults
   must be: the bench says whether they are);
3. simulates each anchor again with the constants fitted without it, and compares every stage
   with the published time: ``log_ratio = ln(predicted / published)``; the error is its
   absolute value. Target: median <= ln 1.2 and max <= ln 2 over all stages of all anchors.

verl's ``gen`` includes the weight sync (the hybrid engine's sharding manager syncs weights when
generation starts), so the predicted ``gen`` is the simulated rollout plus the weight sync. A PPO
anchor's ``values`` and ``update_critic`` are the cost model's split of the critic time the
simulator charges inside the actor-update stage (``TrainCosts.critic_time_s``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jigsawrl.config import validate_config
from jigsawrl.costmodel import CostModel, CostParams
from jigsawrl.costmodel.anchor_fit import (
    GEN,
    STEP,
    THROUGHPUT,
    UPDATE_ACTOR,
    UPDATE_CRITIC,
    VALUES,
    AnchorProbe,
    Fitted,
    apply,
    fit_constants,
    verl_key,
)
from jigsawrl.costmodel.deploy import deployment_of
from jigsawrl.errors import InputError
from jigsawrl.events import SampleFinished
from jigsawrl.executors.simulated import SimulatedExecutor
from jigsawrl.experiments.core import drive, make_policy, run_info, summarize_run
from jigsawrl.experiments.resolve import resolve
from jigsawrl.stages import ROLLOUT_BANDS, VERL_TIMING, Stage
from jigsawrl.workload.experiment import Experiment
from jigsawrl.workload.task_presets import DIFFICULTY_SHARE, SAMPLE_SHARE, RequestSampler

log = logging.getLogger(__name__)

TARGET_MEDIAN = math.log(1.2)
TARGET_MAX = math.log(2.0)
# The eager-decode cost and KV efficiency of the probe's extra simulations (the generation is
# close to linear in the eager cost and in 1 / kv_bw_eff).
PROBE_EAGER_S = 1e-3
PROBE_KV_EFF = (0.8, 0.4)
KINDS = ("per-stage", "step-level")
LENGTH_KEYS = ("response_median", "response_sigma", "prompt_mean", "prompt_std")
WEIGHT_SYNC_KEY = verl_key((Stage.WEIGHT_SYNC,))


@dataclass(frozen=True, slots=True)
class Anchor:
    """One published run (see the module docstring and any file of ``anchors/``)."""

    name: str
    kind: str
    source: str
    published: dict[str, float]
    config: Any  # ExperimentConfig
    lengths: dict[str, Any] | None
    fixed: tuple[dict[str, str], ...]
    path: str = ""

    @property
    def per_stage(self) -> bool:
        return self.kind == "per-stage"


def load_anchor(path: str | Path) -> Anchor:
    """Read and check one anchor file.

    Raises:
        InputError: not YAML, a missing key, an empty ``published`` or an unfixed setting list,
            a config that is not one pipeline, or a config error (named with the file).
    """
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"cannot read anchor: {exc}", where=str(path)) from None
    if not isinstance(doc, dict):
        raise InputError("an anchor is a YAML mapping", where=str(path))
    missing = [k for k in ("name", "kind", "source", "published", "fixed", "config") if k not in doc]
    if missing:
        raise InputError(f"missing keys: {', '.join(missing)}", where=str(path))
    if doc["kind"] not in KINDS:
        raise InputError(f"kind must be one of {KINDS}, got {doc['kind']!r}", where=str(path))
    published = {str(k): float(v) for k, v in (doc["published"] or {}).items()}
    if not published or any(not v > 0 for v in published.values()):
        raise InputError("'published' needs positive stage times", where=str(path))
    fixed = tuple(doc["fixed"] or ())
    if not fixed or any(not {"setting", "reason"} <= set(f) for f in fixed):
        raise InputError("'fixed' lists every unstated setting with 'setting' and 'reason'",
                         where=str(path))
    cfg = validate_config(doc["config"], source=f"{path}: config")
    if len(cfg.pipelines) != 1:
        raise InputError("an anchor's config has exactly one pipeline", where=str(path))
    lengths = doc.get("lengths")
    if lengths is not None and any(k not in lengths for k in LENGTH_KEYS):
        raise InputError(f"'lengths' needs {', '.join(LENGTH_KEYS)}", where=str(path))
    return Anchor(str(doc["name"]), doc["kind"], " ".join(str(doc["source"]).split()),
                  published, cfg, lengths, fixed, str(path))


def load_anchors(folder: str | Path) -> list[Anchor]:
    """Every ``*.yaml`` anchor of ``folder``, by name."""
    folder = Path(folder)
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise InputError("no anchor files (*.yaml)", where=str(folder),
                         fix="run from the repository root or pass --anchors DIR")
    return sorted((load_anchor(f) for f in files), key=lambda a: a.name)


def anchor_experiment(anchor: Anchor) -> Experiment:
    """The anchor's resolved experiment, its response lengths replaced by the anchor's own."""
    exp = resolve(anchor.config)
    if anchor.lengths is None:
        return exp
    pipe = exp.pipelines[0]
    le = anchor.lengths
    sigma = float(le["response_sigma"])
    task = dataclasses.replace(pipe.task, response_median=float(le["response_median"]),
                               response_sigma=SAMPLE_SHARE * sigma,
                               prompt_difficulty_sigma=DIFFICULTY_SHARE * sigma,
                               prompt_mean=float(le["prompt_mean"]),
                               prompt_std=float(le["prompt_std"]))
    spec = pipe.spec
    sampler = RequestSampler(task, group_size=spec.group_size,
                             max_response_tokens=spec.max_response_tokens,
                             drift_per_step=spec.length_drift_per_step)
    return dataclasses.replace(exp, pipelines=(dataclasses.replace(pipe, task=task,
                                                                   sampler=sampler),))


@dataclass(slots=True)
class Simulated:
    """One simulation of an anchor: verl's stage times and the tokens of each step."""

    stages: dict[str, float]
    step_tokens: tuple[int, ...]
    samples: int


def simulate_anchor(anchor: Anchor, params: CostParams,
                    exp: Experiment | None = None) -> Simulated:
    """Simulate ``anchor`` (its verl placement, noise off) under ``params``."""
    exp = exp or anchor_experiment(anchor)
    cfg = exp.config
    pipe = exp.pipelines[0]
    params = dataclasses.replace(params, devices_per_node=cfg.cluster.accelerators_per_node)
    cost = CostModel(exp.accelerator, params=params, deployment=deployment_of(pipe.spec))
    executor = SimulatedExecutor(exp, truth_cost=cost, seed=cfg.seed)
    res = drive(exp, make_policy(cfg), executor, cost)
    summary = summarize_run(res, run_info(exp, cfg.scheduler.name))["pipelines"][0]
    per_step: dict[int, int] = {}
    for e in res.events:
        if isinstance(e, SampleFinished):
            per_step[e.step] = per_step.get(e.step, 0) + e.prompt_tokens + e.response_tokens
    tokens = tuple(per_step[k] for k in sorted(per_step))
    t = {key: float(summary.get(f"timing_s/{key}") or 0.0) for key in (*VERL_TIMING, STEP)}
    stages = _verl_stages(t, cost, pipe.model, exp.num_devices, tokens)
    samples = round(summary["samples"] / max(1, len(tokens)))
    return Simulated(stages, tokens, samples)


def _verl_stages(t: dict[str, float], cost: CostModel, model: Any, n: int,
                 tokens: Sequence[int]) -> dict[str, float]:
    """verl's names for a simulated step: ``gen`` with the weight sync; a critic's split."""
    out = dict(t)
    out[GEN] = t[verl_key(ROLLOUT_BANDS)] + t.pop(WEIGHT_SYNC_KEY)
    if cost.deployment.critic and tokens:
        parts = [cost.critic_time_s(model, n, k) for k in tokens]
        out[VALUES] = statistics.fmean(v for v, _ in parts)
        out[UPDATE_CRITIC] = statistics.fmean(u for _, u in parts)
        out[UPDATE_ACTOR] -= out[VALUES] + out[UPDATE_CRITIC]
    if t[STEP] > 0 and tokens:
        out[THROUGHPUT] = statistics.fmean(tokens) / t[STEP] / n
    return out


def probe_anchor(anchor: Anchor, base: CostParams) -> AnchorProbe:
    """What the fit needs from ``anchor``: one simulation (two for an eager rollout)."""
    exp = anchor_experiment(anchor)
    pipe = exp.pipelines[0]
    dep = deployment_of(pipe.spec)
    kv0, kv1 = PROBE_KV_EFF
    probe = dataclasses.replace(base, eager_iter_overhead_s_per_layer=0.0, kv_bw_eff=kv0)
    first = simulate_anchor(anchor, probe, exp)
    slow_kv = simulate_anchor(anchor, dataclasses.replace(probe, kv_bw_eff=kv1), exp)
    kv_slope = (slow_kv.stages[GEN] - first.stages[GEN]) / (1.0 / kv1 - 1.0 / kv0)
    slope = 0.0
    if dep.enforce_eager:
        second = simulate_anchor(anchor, dataclasses.replace(
            probe, eager_iter_overhead_s_per_layer=PROBE_EAGER_S), exp)
        slope = (second.stages[GEN] - first.stages[GEN]) / PROBE_EAGER_S
    return AnchorProbe(anchor.name, anchor.per_stage, exp.accelerator, pipe.model,
                       exp.num_devices, exp.config.cluster.accelerators_per_node, dep,
                       first.step_tokens, first.samples, first.stages[GEN], slope, kv_slope,
                       probe, dict(anchor.published))


def loo_constants(probes: Sequence[AnchorProbe], base: CostParams
                  ) -> dict[str, dict[str, Fitted]]:
    """For each probe's anchor, the constants fitted on all the *other* anchors."""
    return {p.name: fit_constants([q for q in probes if q.name != p.name], base)
            for p in probes}


@dataclass(slots=True)
class FidelityResult:
    """The bench's outcome (:meth:`as_json` is ``fidelity.json``)."""

    anchors: list[dict[str, Any]]
    fitted: dict[str, Fitted]
    loo: dict[str, dict[str, Fitted]]
    defaults: dict[str, float]
    in_sample: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    probes: list[AnchorProbe] = field(default_factory=list)  # what the fits saw (not in JSON)

    @property
    def errors(self) -> list[tuple[str, str, float]]:
        """(anchor, stage, |ln ratio|) of every leave-one-out prediction."""
        return _errors(self.anchors)

    @property
    def median_abs_log_ratio(self) -> float:
        return statistics.median(e for *_, e in self.errors)

    @property
    def max_abs_log_ratio(self) -> float:
        return max(e for *_, e in self.errors)

    def misses(self) -> list[str]:
        """What misses the target, by how much and where (empty when both are met)."""
        out = []
        med, worst = self.median_abs_log_ratio, self.max_abs_log_ratio
        if med > TARGET_MEDIAN:
            out.append(f"median |ln ratio| {med:.3f} > ln 1.2 = {TARGET_MEDIAN:.3f} "
                       f"(by {med - TARGET_MEDIAN:.3f})")
        for name, stage, e in sorted(self.errors, key=lambda x: -x[2]):
            if e > TARGET_MAX:
                out.append(f"{name}/{stage}: |ln ratio| {e:.3f} > ln 2 = {TARGET_MAX:.3f} "
                           f"(by {e - TARGET_MAX:.3f}; x{math.exp(e):.2f} off)")
        if worst <= TARGET_MAX and med <= TARGET_MEDIAN:
            return []
        return out

    def defaults_match(self, rel: float = 0.02) -> bool:
        """Whether ``CostParams``' defaults are the all-anchor fit (within ``rel``)."""
        return all(math.isclose(self.defaults[k], f.value, rel_tol=rel, abs_tol=1e-9)
                   for k, f in self.fitted.items())

    def as_json(self) -> dict[str, Any]:
        def plain(f: dict[str, Fitted]) -> dict[str, Any]:
            return {k: {"value": v.value, "from": list(v.sources)} for k, v in f.items()}

        inside = _errors(self.in_sample)
        in_sample = {"anchors": self.in_sample,
                     "median_abs_log_ratio": statistics.median(e for *_, e in inside),
                     "max_abs_log_ratio": max(e for *_, e in inside)} if inside else None
        return {"anchors": self.anchors,
                "median_abs_log_ratio": self.median_abs_log_ratio,
                "max_abs_log_ratio": self.max_abs_log_ratio,
                "target": {"median_abs_log_ratio": TARGET_MEDIAN,
                           "max_abs_log_ratio": TARGET_MAX},
                "met": not self.misses(), "misses": self.misses(),
                "fitted": plain(self.fitted), "defaults": self.defaults,
                "defaults_match_fit": self.defaults_match(),
                "leave_one_out": {name: plain(f) for name, f in self.loo.items()},
                "in_sample": in_sample, **self.info}


def _errors(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, float]]:
    return [(a["name"], s, abs(v["log_ratio"])) for a in rows for s, v in a["stages"].items()]


def run_fidelity(anchors: Sequence[Anchor], *, steps: int | None = None,
                 base: CostParams | None = None, in_sample_too: bool = True) -> FidelityResult:
    """Probe, fit leave-one-out, predict every anchor (module docstring).

    ``steps`` overrides each anchor's step count (fewer: faster); ``base`` the parameters whose
    unfitted values are used (default: ``CostParams()``); ``in_sample_too`` also simulates every
    anchor under the all-anchor fit (what the defaults give: ``in_sample`` in the JSON).
    """
    base = base or CostParams()
    if steps is not None:
        anchors = [_with_steps(a, steps) for a in anchors]
    probes = [probe_anchor(a, base) for a in anchors]
    loo = loo_constants(probes, base)
    fitted = fit_constants(probes, base)
    rows = [_compare(a, loo[a.name], base) for a in anchors]
    in_sample = ([_compare(a, fitted, base) for a in anchors] if in_sample_too else [])
    defaults = {k: float(getattr(CostParams(), k)) for k in fitted}
    return FidelityResult(rows, fitted, loo, defaults, in_sample=in_sample, probes=probes)


def _compare(anchor: Anchor, fitted: dict[str, Fitted], base: CostParams) -> dict[str, Any]:
    """Simulate ``anchor`` under ``fitted`` and compare each published stage."""
    sim = simulate_anchor(anchor, apply(base, fitted))
    stages = {}
    for key, pub in anchor.published.items():
        pred = sim.stages.get(key, 0.0)
        stages[key] = {"published": pub, "predicted": pred,
                       "log_ratio": math.log(max(pred, 1e-12) / pub)}
    return {"name": anchor.name, "kind": anchor.kind, "source": anchor.source,
            "file": anchor.path, "stages": stages,
            "constants": {k: f.value for k, f in fitted.items()}}


def _with_steps(anchor: Anchor, steps: int) -> Anchor:
    cfg = anchor.config
    pipe = cfg.pipelines[0].model_copy(update={"steps": steps})
    return dataclasses.replace(anchor, config=cfg.model_copy(update={"pipelines": [pipe]}))


def git_commit(folder: str | Path = ".") -> str:
    """The checkout's commit (``+dirty`` when files differ from it), or ``unknown``."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True,
                             check=False, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if head and dirty else head or "unknown"


def write_fidelity(result: FidelityResult, out_dir: str | Path) -> Path:
    """Write ``out_dir/fidelity.json``; return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fidelity.json"
    path.write_text(json.dumps(result.as_json(), indent=1, sort_keys=False) + "\n")
    return path
