"""``jigsawrl bench real``: several real pipelines under each policy, measured and predicted.

What: :func:`run_bench_real` runs one real multi-pipeline config (by default
``configs/real/bench-tools.yaml``: four pipelines on two devices, three of them waiting 0.5 s on
each tool call — the room for multiplexing issue 14 asks a bench to have, which a user running
agents would recognise; ``configs/real/bench.yaml``, three pipelines with short tool waits, is
the compute-bound case where a queue of single-device jobs leaves nothing to fill) on the local
pool under each policy
— every verl placement, ``greedy`` and ``jigsaw`` by default, same config, same seed — through
:func:`jigsawrl.experiments.real.run_real`, ``repeats`` times each, and for each run asks
:mod:`jigsawrl.experiments.calibrate` for the simulator's prediction of it (the same workload
replayed, the machine's profile as cost model). The result is a :class:`BenchCompare`
(``compare.json`` in the shape of ``jigsawrl compare``): ``runs[label]`` lists every run of the
label, each summary carrying its prediction under ``"predicted"``.

Definitions (said here because the table is read against them):

- *label*: what ``--policies`` names — a registered policy, or ``verl-queue-K`` (``verl-queue``
  with ``k=K``); ``verl-queue`` stands for every queue width 2 .. #pipelines - 1 and ``verl`` for
  every verl placement (``verl-split``, ``verl-serial``, ``verl-sized``, each ``verl-queue-K``).
- *alone*: a pipeline's mean step latency in the ``verl-serial`` runs (the median over
  repeats). verl-serial runs each pipeline alone on the whole pool, one after the other, so its
  step latencies are the pipelines' solo latencies on this pool (the simulator's
  ``solo_latencies`` uses verl on the whole pool too). Every run's ``latency_vs_solo`` is taken
  against it.
- *verl*: the best (by median finished tokens/s) of the verl placements that ran, named in
  ``variant`` — the project's definition of the verl baseline (DESIGN.md §6: never a weakened
  baseline; ``experiments/simulated.py::simulate`` does the same in simulation). A placement that
  cannot hold the config (three pipelines on two devices leave ``verl-split`` and ``verl-sized``
  without a device each) is skipped with its reason, before any real run starts.
- *repeats*: run 1 of every label, then run 2 of every label, ...: a busy spell on a shared
  machine hits every policy, not one. The tables print the median and the spread (min–max);
  ratios are of medians, and ``per_repeat_ratios`` pairs the runs of one repeat. Each summary
  records its ``repeat`` and the machine's 1-minute load average before and after it.
- *skipped*: a label that cannot place the workload (the dry run above) or whose every real run
  failed is reported with its reason — in ``compare.json`` under ``skipped``, as a row of the
  table and in the notes — and the others are compared; a label that failed in its first repeat
  is not run again; a later failure is a note. Only when no label runs is the bench an error. A
  bad config is an error before any policy runs.
- Ray start-up and warm starts are excluded from every makespan (``run_real`` measures them as
  ``startup_s``); the bench's wall time includes them.

Why: ROADMAP item 6 and issue 14 — the number that matters is jigsaw's gain over the strongest
verl on *real* pipelines, told apart from a loaded machine's noise, and whether the simulator that
claims the larger gains predicts these runs.

``ray`` and ``torch`` are imported only by ``run_real``; library code logs, the CLI prints.
"""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jigsawrl.config import ExperimentConfig, SchedulerSpec, dump_config, load_config
from jigsawrl.errors import ConfigError, JigsawError
from jigsawrl.experiments.calibrate import Calibration, calibrate, simulate_replay, truth_cost
from jigsawrl.experiments.compare import CANNOT_RUN, NUMERIC_FIELDS, CompareResult, write_compare

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path("configs/real/bench-tools.yaml")
DEFAULT_PROFILE = Path("profiles/cpu.yaml")
POLICIES: tuple[str, ...] = ("verl-serial", "verl-split", "verl-sized", "verl-queue", "greedy",
                             "jigsaw")
# The verl placements a user of verl chooses between, in the order a tie is named (split and
# serial first, as in simulation); each verl-queue-K follows them.
VERL_PLACEMENTS: tuple[str, ...] = ("verl-split", "verl-serial", "verl-sized")
QUEUE = "verl-queue"
ALONE_POLICY = "verl-serial"
# --quick: the same pipelines for fewer steps (the bench's wall time is mostly Ray start-ups
# and the pipeline actors' imports, ~30-40 s per policy on a 2-core machine).
QUICK_STEPS = 3
_QUEUE_LABEL = re.compile(rf"{QUEUE}-(\d+)")

# (label, repeat (1-based; 0: skipped by the dry run, no real run), summary or None, why not)
OnRun = Callable[[str, int, dict[str, Any] | None, str | None], None]


@dataclass(frozen=True, slots=True)
class BenchRealSpec:
    """What ``jigsawrl bench real`` runs.

    Args:
        config: the real multi-pipeline config.
        quick: run every pipeline for :data:`QUICK_STEPS` steps.
        policies: labels to run (module docstring: ``verl`` and ``verl-queue`` expand).
        profile: the machine profile for the predictions (None: the built-in preset).
        overrides: ``key.path=value`` overrides applied after ``quick``.
        out_dir: write ``compare.json``, ``compare.png`` and a run folder per label there
            (``<label>/repeat-R/`` when ``repeats`` > 1).
        threads_per_device: torch threads one logical device maps to.
        cache_dir: warm-start cache (None: the engine's default, ``~/.cache/jigsawrl``).
        repeats: real runs per label, interleaved (module docstring).
    """

    config: Path = DEFAULT_CONFIG
    quick: bool = False
    policies: tuple[str, ...] = POLICIES
    profile: Path | None = None
    overrides: tuple[str, ...] = ()
    out_dir: Path | None = None
    threads_per_device: int = 1
    cache_dir: Path | None = None
    repeats: int = 1

    def load(self) -> ExperimentConfig:
        """The config with the quick and user overrides applied (raises ConfigError)."""
        base = load_config(self.config)
        quick = [f"pipelines.{i}.steps={QUICK_STEPS}" for i in range(len(base.pipelines))]
        return load_config(self.config, [*(quick if self.quick else []), *self.overrides])


# ---------------------------------------------------------------------------- repeats maths

@dataclass(frozen=True, slots=True)
class Spread:
    """The median and the range (min–max) of one quantity over repeats."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[Any]) -> Spread | None:
        """Over the numbers among ``values`` (None and non-numbers are left out: a run that
        has no value for a quantity does not count); None when there is none."""
        vals = sorted(float(v) for v in values
                      if isinstance(v, int | float) and not isinstance(v, bool))
        if not vals:
            return None
        return cls(statistics.median(vals), vals[0], vals[-1], len(vals))

    def to_json(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.lo, "max": self.hi, "n": self.n}

    @classmethod
    def json_of(cls, values: Iterable[Any]) -> dict[str, float | int]:
        """``of(values).to_json()`` where ``values`` must hold a number (ValueError if not)."""
        spread = cls.of(values)
        if spread is None:
            raise ValueError("no numbers to summarise")
        return spread.to_json()


def median_summary(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One summary standing for a label's runs: the first run's, with :data:`NUMERIC_FIELDS`,
    ``startup_s`` and each pipeline's step latency, tokens/s and latency vs alone replaced by
    their medians over the runs, ``spread`` (field -> ``[min, max]``) and ``repeats`` (how many
    runs). With one run it is that run (plus ``spread`` and ``repeats``)."""
    out = dict(summaries[0])
    spread: dict[str, list[float]] = {}
    for key in (*NUMERIC_FIELDS, "startup_s"):
        s = Spread.of(x.get(key) for x in summaries)
        if s is not None:
            out[key], spread[key] = s.median, [s.lo, s.hi]
    rows = []
    for p in summaries[0].get("pipelines", []):
        row = dict(p)
        same = [q for x in summaries for q in x.get("pipelines", []) if q["name"] == p["name"]]
        for key in ("mean_step_latency_s", "tokens_per_s", "latency_vs_solo"):
            s = Spread.of(q.get(key) for q in same)
            row[key] = None if s is None else s.median
        rows.append(row)
    out["pipelines"] = rows
    out["spread"], out["repeats"] = spread, len(summaries)
    return out


def _tput(summary: Mapping[str, Any]) -> float | None:
    v = summary.get("throughput_tokens_per_s")
    return float(v) if isinstance(v, int | float) else None


@dataclass(slots=True)
class BenchCompare(CompareResult):
    """:class:`CompareResult` of real repeats: every run of a label in ``runs[label]`` (each
    with its ``repeat``), ratios of medians instead of means, and ``per_repeat_ratios`` (label
    -> baseline -> one ratio per repeat, None where either did not run in that repeat)."""

    repeats: int = 1

    def medians(self) -> dict[str, dict[str, Any]]:
        return {p: median_summary(s) for p, s in self.runs.items() if s}

    def ratios(self) -> dict[str, dict[str, float]]:
        """Median tokens/s of every label over every other's."""
        med = {p: _tput(s) for p, s in self.medians().items()}
        return {p: {q: a / b for q, b in med.items() if a is not None and b}
                for p, a in med.items() if a is not None}

    def per_repeat_ratios(self, base: str | None = None) -> dict[str, list[float | None]]:
        """Each label's tokens/s over ``base``'s (default the baseline), repeat by repeat."""
        base = base or self.baseline

        def by_repeat(label: str) -> dict[int, float | None]:
            return {int(s.get("repeat") or i + 1): _tput(s)
                    for i, s in enumerate(self.runs.get(label, []))}

        ref = by_repeat(base)
        out: dict[str, list[float | None]] = {}
        for label in self.runs:
            mine = by_repeat(label)
            out[label] = [a / b if a is not None and b else None
                          for r in range(1, self.repeats + 1)
                          for a, b in [(mine.get(r), ref.get(r))]]
        return out

    def to_json(self) -> dict[str, Any]:
        doc = CompareResult.to_json(self)  # (zero-argument super() fails in a slots subclass)
        meds = self.medians()
        doc["repeats"] = self.repeats
        doc["median"] = meds
        doc["spread"] = {p: m["spread"] for p, m in meds.items()}
        doc["per_repeat_ratios"] = self.per_repeat_ratios()
        return doc


@dataclass(slots=True)
class BenchRealResult:
    """Everything one bench produced; ``compare`` is what ``compare.json`` holds.

    ``calibrations[label]`` lines up with ``compare.runs[label]`` (None where no prediction
    could be made)."""

    config: ExperimentConfig
    compare: BenchCompare
    calibrations: dict[str, list[Calibration | None]] = field(default_factory=dict)
    alone_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    profile: str | None = None
    # The machine's 1-minute load average before and after the bench: real timings on a shared
    # machine are only as good as its quiet (recorded, not corrected for; per run too).
    load_average: tuple[float | None, float | None] = (None, None)

    @property
    def summaries(self) -> dict[str, dict[str, Any]]:
        """Label -> its median summary (:func:`median_summary`), in display order."""
        meds = self.compare.medians()
        return {p: meds[p] for p in self.compare.policies if p in meds}

    def ratio(self, policy: str, base: str = "verl") -> float | None:
        """Median measured tokens/s of ``policy`` over ``base``'s (None if either did not
        run)."""
        return self.compare.ratios().get(policy, {}).get(base)


# ---------------------------------------------------------------------------- labels

def queue_k(label: str) -> int | None:
    """``K`` of a ``verl-queue-K`` label, else None."""
    m = _QUEUE_LABEL.fullmatch(label)
    return int(m.group(1)) if m else None


def is_verl_placement(label: str) -> bool:
    """Whether ``label`` is one of the placements the derived ``verl`` picks from."""
    return label in VERL_PLACEMENTS or queue_k(label) is not None


def expand_labels(policies: Sequence[str], cfg: ExperimentConfig
                  ) -> tuple[list[str], dict[str, str]]:
    """The labels to run for ``policies`` (``verl`` and ``verl-queue`` expanded, duplicates
    dropped, order kept) and those left out with why (``verl-queue`` when no width is left
    between verl-serial and the equal split).

    Raises:
        ConfigError: no policy, or a name that is neither a registered policy nor
            ``verl-queue-K``.
    """
    from jigsawrl.scheduler import list_policies

    if not policies:
        raise ConfigError("no policies given", where="--policies", fix="e.g. verl,jigsaw")
    known = set(list_policies())
    queues = [f"{QUEUE}-{k}" for k in range(2, len(cfg.pipelines))]
    out: list[str] = []
    left: dict[str, str] = {}
    for p in policies:
        if p == "verl":
            out += [*VERL_PLACEMENTS, *queues]
        elif p == QUEUE:
            out += queues
            if not queues:
                left[QUEUE] = (f"ConfigError: with {len(cfg.pipelines)} pipelines every queue "
                               "is verl-serial (k = 1) or the equal split (k >= #pipelines)")
        elif p in known or (queue_k(p) or 0) >= 1:
            out.append(p)
        else:
            raise ConfigError(f"{p!r} is not a policy bench real runs", where="--policies",
                              fix="use policy names, e.g. verl,greedy,jigsaw (verl: every verl "
                                  "placement; verl-queue: every queue width; verl-queue-2: one)")
    return list(dict.fromkeys(out)), left


def label_config(cfg: ExperimentConfig, label: str) -> tuple[ExperimentConfig, str]:
    """The config and registered policy name a label runs as: ``verl-queue-K`` is
    ``verl-queue`` with ``scheduler.params.k = K`` (so that ``run_real`` and ``calibrate``,
    which read a policy's params from the config, both see ``k``); any other label is itself."""
    k = queue_k(label)
    if k is None:
        return cfg, label
    return cfg.model_copy(update={"scheduler": SchedulerSpec(name=QUEUE, params={"k": k})}), QUEUE


def feasibility(cfg: ExperimentConfig, policy: str) -> str | None:
    """Why ``policy`` (a label) cannot place ``cfg`` (None if it can), from a simulated dry run.

    The dry run uses the real run's resolved experiment with its neutral stub workload and the
    built-in cost model, so it costs milliseconds and no Ray start-up.
    """
    from jigsawrl.experiments.resolve import resolve_real

    cfg, name = label_config(cfg, policy)
    try:
        exp = resolve_real(cfg)
        simulate_replay(exp, name, truth_cost(exp, None))
    except CANNOT_RUN as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def run_bench_real(spec: BenchRealSpec, *, on_run: OnRun | None = None) -> BenchRealResult:
    """Run the bench (see the module docstring).

    Args:
        spec: what to run.
        on_run: called after each real run with ``(label, repeat, summary or None, why not)``,
            and once with repeat 0 for each label the dry run skips.

    Raises:
        ConfigError: a bad config (schema, presets, request budget), an unknown policy, a
            repeat count below 1, or a profile that cannot be read — before any real run.
        JigsawError: no policy could run at all (with every policy's reason).
    """
    from jigsawrl.experiments.resolve import resolve_real

    t0, load0 = time.monotonic(), _load()
    if not isinstance(spec.repeats, int) or spec.repeats < 1:
        raise ConfigError(f"repeats must be a whole number >= 1, not {spec.repeats!r}",
                          where="--repeats", fix="e.g. --repeats 3")
    cfg = spec.load()
    labels, left = expand_labels(spec.policies, cfg)
    resolve_real(cfg)  # a bad config is an error of the config, not a skip of every policy
    profile = profile_path(spec.profile, spec.threads_per_device)
    compare = BenchCompare([], [cfg.seed], "verl", repeats=spec.repeats)
    compare.skipped.update(left)
    result = BenchRealResult(cfg, compare, profile=profile)
    runnable = []
    for label in sorted(labels, key=lambda p: p != ALONE_POLICY):  # alone first
        why = feasibility(cfg, label)
        if why is None:
            runnable.append(label)
            continue
        log.info("skipping %s: %s", label, why)
        compare.skipped[label] = why
        if on_run is not None:
            on_run(label, 0, None, why)
    for repeat in range(1, spec.repeats + 1):
        for label in list(runnable):
            summary, cal, why = _run_label(spec, cfg, label, profile, repeat)
            if summary is not None:
                compare.runs.setdefault(label, []).append(summary)
                result.calibrations.setdefault(label, []).append(cal)
            elif label in compare.runs:
                compare.notes.append(f"{label}: repeat {repeat} failed: {_one_line(why)}")
            else:  # failed before it ever ran: not run again
                runnable.remove(label)
                compare.skipped[label] = why or "did not run"
            if on_run is not None:
                on_run(label, repeat, summary, why)
    if not compare.runs:
        raise JigsawError("no policy could run:\n  " + "\n  ".join(
            f"{p}: {_one_line(w)}" for p, w in compare.skipped.items()), where="--policies",
            fix="add a policy that can place the pipelines, or change the config")
    _relate(result, labels)
    result.wall_s = time.monotonic() - t0
    result.load_average = (load0, _load())
    if spec.out_dir is not None:
        write_bench(spec.out_dir, result)
    return result


def _one_line(why: str | None) -> str:
    return "; ".join(x.strip() for x in (why or "did not run").splitlines() if x.strip())


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def profile_path(profile: Path | None, threads_per_device: int) -> str | None:
    """The profile a real run believes and is predicted with: the given one, else
    profiles/cpu.yaml if present; checked now, before any Ray start (``bench real`` and
    ``run --ray`` alike)."""
    if profile is None and DEFAULT_PROFILE.is_file():
        profile = DEFAULT_PROFILE
    if profile is not None:
        from jigsawrl.costmodel.profile import load_profile

        # fail early (InputError) on a bad file or another full share, before any real run
        load_profile(profile, threads_per_device)
        return str(profile)
    log.warning("no profile (%s): predictions use the built-in, unmeasured cpu-worker preset; "
                "measure one with `jigsawrl profile --threads 1 --out %s`", DEFAULT_PROFILE,
                DEFAULT_PROFILE)
    return None


def run_dir(out_dir: Path, label: str, repeat: int, repeats: int) -> Path:
    """A run's folder: ``<label>/`` for a single repeat (as before repeats existed), else
    ``<label>/repeat-<R>/``."""
    return out_dir / label if repeats == 1 else out_dir / label / f"repeat-{repeat}"


def _run_label(spec: BenchRealSpec, cfg: ExperimentConfig, label: str, profile: str | None,
               repeat: int
               ) -> tuple[dict[str, Any] | None, Calibration | None, str | None]:
    """One real run of ``label`` and its prediction: ``(summary, calibration or None, None)``,
    or ``(None, None, why)`` when the run failed."""
    from jigsawrl.experiments.real import run_real

    run_cfg, name = label_config(cfg, label)
    out = run_dir(spec.out_dir, label, repeat, spec.repeats) if spec.out_dir else None
    load_before = _load()
    try:
        summary, events = run_real(run_cfg, policy=name, out_dir=out, cache_dir=spec.cache_dir,
                                   threads_per_device=spec.threads_per_device, profile=profile)
    except Exception as exc:  # noqa: BLE001 - one failed policy must not lose the others
        # The reason is reported (skipped or a note); the traceback only with --verbose.
        log.warning("real run under %s (repeat %d) failed: %s: %s", label, repeat,
                    type(exc).__name__, exc)
        log.debug("real run under %s failed", label, exc_info=True)
        return None, None, f"{type(exc).__name__}: {exc}"
    summary["label"], summary["repeat"] = label, repeat
    summary["load_average_1m"] = [load_before, _load()]
    try:
        cal = calibrate(run_cfg, events, name, profile=profile, measured=summary)
    except JigsawError as exc:
        log.warning("no prediction for %s (repeat %d): %s", label, repeat, exc)
        summary["predicted"] = None
        return summary, None, None
    summary["predicted"] = {**cal.to_json(), "summary": _headline(cal.sim_summary)}
    return summary, cal, None


def _headline(s: dict[str, Any]) -> dict[str, Any]:
    """The predicted summary's headline numbers (the full one is in the calibration)."""
    keys = ("makespan_s", "throughput_tokens_per_s", "busy_fraction", "samples", "tokens")
    return {**{k: s.get(k) for k in keys}, "pipelines": [
        {k: p.get(k) for k in ("name", "mean_step_latency_s", "tokens_per_s", "steps")}
        for p in s.get("pipelines", [])]}


def _relate(result: BenchRealResult, policies: Sequence[str]) -> None:
    """Fill latency vs alone (measured and predicted, against the medians of the alone runs)
    and the derived ``verl`` entry (the placement with the best median tokens/s)."""
    runs = result.compare.runs
    alone = runs.get(ALONE_POLICY)
    if alone:
        result.alone_s = _median_lat(alone)
        cals = [c for c in result.calibrations.get(ALONE_POLICY, []) if c is not None]
        pred_alone = _median_lat([c.sim_summary for c in cals])
        for policy, summaries in runs.items():
            cals_p = result.calibrations.get(policy, [])
            for i, s in enumerate(summaries):
                _vs_alone(s, result.alone_s)
                cal = cals_p[i] if i < len(cals_p) else None
                if cal is not None and pred_alone and s.get("predicted") is not None:
                    s["predicted"]["mean_latency_vs_solo"] = _mean_vs(cal.sim_summary,
                                                                      pred_alone)
    placements = [p for p in (*VERL_PLACEMENTS, *sorted(
        (q for q in runs if queue_k(q) is not None), key=lambda q: queue_k(q) or 0))
        if p in runs]
    if placements:
        meds = {p: _tput(median_summary(runs[p])) or 0.0 for p in placements}
        best = max(placements, key=lambda p: meds[p])  # a tie names the earlier placement
        runs["verl"] = [{**s, "policy": "verl", "variant": best} for s in runs[best]]
        log.info("verl = %s (median %.0f tokens/s; of %s)", best, meds[best],
                 ", ".join(placements))
    order = [p for p in (*placements, "verl", *policies) if p in runs]
    result.compare.policies = list(dict.fromkeys(order))
    if "verl" not in runs:
        result.compare.baseline = result.compare.policies[0]


def _median_lat(summaries: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Pipeline -> median over ``summaries`` of its mean step latency."""
    names = dict.fromkeys(n for s in summaries for n in _step_lat(s))
    out = {}
    for name in names:
        s = Spread.of(_step_lat(x).get(name) for x in summaries)
        if s is not None:
            out[name] = s.median
    return out


def _step_lat(summary: Mapping[str, Any]) -> dict[str, float]:
    return {p["name"]: p["mean_step_latency_s"] for p in summary.get("pipelines", [])
            if p.get("mean_step_latency_s")}


def _vs_alone(summary: dict[str, Any], alone: dict[str, float]) -> None:
    for p in summary["pipelines"]:
        solo, lat = alone.get(p["name"]), p.get("mean_step_latency_s")
        p["latency_vs_solo"] = lat / solo if solo and lat is not None else None
    summary["mean_latency_vs_solo"] = _mean_vs(summary, alone)


def _mean_vs(summary: Mapping[str, Any], alone: dict[str, float]) -> float | None:
    ratios = [lat / alone[name] for name, lat in _step_lat(summary).items() if alone.get(name)]
    return sum(ratios) / len(ratios) if ratios else None


def write_bench(out_dir: Path, result: BenchRealResult) -> list[Path]:
    """Write ``compare.json`` (+ ``compare.png``) and, in each run's folder (:func:`run_dir`),
    its ``calibration.json`` and ``summary.json`` (the measured summary with its prediction;
    the rest of the run folder was written by ``run_real``), and ``bench_real.json`` (wall
    time, profile, alone latencies, jigsaw/verl as a ratio of medians and per repeat, load
    averages). Returns the files written."""
    out_dir = Path(out_dir)
    n = result.compare.repeats
    written = write_compare(out_dir, result.compare, config_yaml=dump_config(result.config),
                            title="real pipelines on this CPU (measured)", highlight="jigsaw")
    for label, cals in result.calibrations.items():
        for s, cal in zip(result.compare.runs[label], cals, strict=True):
            folder = run_dir(out_dir, label, int(s.get("repeat") or 1), n)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "summary.json").write_text(json.dumps(s, indent=1))
            written.append(folder / "summary.json")
            if cal is not None:
                (folder / "calibration.json").write_text(json.dumps(cal.to_json(), indent=1))
                written.append(folder / "calibration.json")
    verl = result.compare.runs.get("verl", [{}])[0].get("variant")
    meta = {"wall_s": result.wall_s, "profile": result.profile, "alone_s": result.alone_s,
            "repeats": n, "verl": verl, "jigsaw_vs_verl": result.ratio("jigsaw"),
            "jigsaw_vs_verl_per_repeat": result.compare.per_repeat_ratios("verl").get("jigsaw")
            if "verl" in result.compare.runs else None,
            "load_average": result.load_average}
    (out_dir / "bench_real.json").write_text(json.dumps(meta, indent=1))
    return [*written, out_dir / "bench_real.json"]
