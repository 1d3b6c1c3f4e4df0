"""Calibration: the simulator's prediction of a finished real run, side by side with it.

What: given a real-run config, the events of a finished real run (``experiments.real.run_real``), the
policy it ran under and a machine profile (``jigsawrl profile``; None = the built-in, unmeasured
``cpu-worker`` preset), :func:`calibrate` builds a *simulated* experiment that replays the real
run's workload — each step's observed per-sample prompt length, response length and turns
(trace-driven: the simulator sees exactly what the real run saw, never a sampled workload) — and
simulates it with the profile's cost model, noise off, under the same policy. It returns the
predicted step latency and throughput per pipeline and the makespan and throughput of the pool,
beside the measured ones, with their relative errors, and each prediction's range over replays
whose calls scatter as the run's did (:mod:`~jigsawrl.experiments.replay_spread`).

Why: ROADMAP item 5 — a simulator is only worth its ratios if, given the same workload and a
measured cost model, it predicts a real run. The aim is 10%; :attr:`Calibration.within_target`
says whether a run met it, and nothing here is tuned to make it so (DESIGN.md §6): every cost
constant comes from the profile or is the documented default of
:class:`~jigsawrl.costmodel.CostParams`.

How the replay is built (simplifications, said here as DESIGN.md asks):

- A :class:`~jigsawrl.events.SampleFinished` carries the prompt tokens, the response tokens
  (model tokens *and* tool-result tokens, as the engine's ``response_ids``) and the number of
  assistant turns; without ``generated_tokens`` it lacks the split between generated and
  tool-result tokens. Then each tool call is
  given the mean tool-result length of the task's own demo responses (:func:`tool_result_tokens`;
  a workload property read from the task code, not a fitted constant); the rest of the response is
  split evenly over the turns as generated tokens. An event that records ``generated_tokens``
  (the Ray executor does) is split exactly instead.
- Tool latency per call is the config's ``rollout.tool_latency_s`` plus the task's own
  ``tool_latency_s`` (its mean; the task's jitter is symmetric).
- The scheduler in the simulated run gets the same *belief* cost model as ``run_real`` gives it
  (the built-in preset), so it takes the decisions it would take on the real pool; only the
  simulator's *truth* uses the profile.
- Ray start-up and warm starts are not part of the real makespan (``run_real`` excludes them), so
  they are not predicted.

No torch or ray at module level: ``resolve_real`` imports torch only to read the model presets.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jigsawrl.config import ExperimentConfig, PipelineSpec
from jigsawrl.costmodel import CostModel
from jigsawrl.errors import InputError
from jigsawrl.events import Event, SampleFinished, StepFinished
from jigsawrl.executors.simulated import SimulatedExecutor
from jigsawrl.experiments.core import drive, make_policy, run_info
from jigsawrl.experiments.real import real_belief
from jigsawrl.experiments.replay_spread import REPLAYS, call_noise_sigma
from jigsawrl.experiments.replay_spread import replays as replays_under_noise
from jigsawrl.metrics.summary import summarize
from jigsawrl.workload.experiment import Experiment
from jigsawrl.workload.requests import RequestTruth, TurnTruth

log = logging.getLogger(__name__)

# The ROADMAP's aim for a prediction (relative error of step time and throughput).
TARGET_REL_ERROR = 0.10
# Demo responses read per task to measure its mean tool-result length.
_DEMOS = 64

StepRequests = dict[int, list[RequestTruth]]


# --------------------------------------------------------------------------- the replayed workload

def tool_result_tokens(spec: PipelineSpec, demos: int = _DEMOS) -> float:
    """Mean tokens one tool call inserts for ``spec``'s task (0 for a single-turn task).

    Measured on the task's own demo responses (``Example.demo``, split by
    :func:`jigsawrl.tasks.segments`): one character is one token for the engine's tokenizer.
    """
    from jigsawrl.tasks import build_task, segments

    task = build_task(spec)
    if not getattr(task, "multi_turn", False):
        return 0.0
    sizes = [len(text) for ex in task.make_dataset(demos, seed=0)
             for text, generated in segments(task, ex.demo) if not generated]
    return float(np.mean(sizes)) if sizes else 0.0


def tool_latency_s(spec: PipelineSpec) -> float:
    """Latency of one tool call: the config's extra latency plus the task's own."""
    own = spec.rollout.task_params.get("tool_latency_s", 0.0)
    return float(spec.rollout.tool_latency_s) + float(own or 0.0)


def _sample_key(sample_id: str) -> tuple[int, int, str]:
    """Order samples as the engine numbered them (``{pipeline}/{step}/{prompt}/{sample}``)."""
    parts = sample_id.rsplit("/", 2)
    try:
        return int(parts[-2]), int(parts[-1]), ""
    except (ValueError, IndexError):
        return 1 << 30, 0, sample_id


def replay_request(ev: SampleFinished, tool_tokens: float, latency_s: float) -> RequestTruth:
    """The :class:`RequestTruth` that reproduces one finished sample (see the module docstring).

    The request's ``prompt_tokens``, ``response_tokens`` (generated + tool results) and number
    of turns equal the sample's; tool results are capped so each turn generates >= 1 token.
    """
    turns = max(1, int(ev.turns))
    total = max(turns, int(ev.response_tokens))
    generated = getattr(ev, "generated_tokens", None)
    if generated is None or generated < 0:  # not recorded (simulated runs, older event files)
        per_call = int(round(tool_tokens))
        tool_total = min((turns - 1) * per_call, total - turns)
        generated = total - tool_total
    generated = min(total, max(turns, int(generated)))
    results = _spread(total - generated, turns - 1)
    gens = _spread(generated, turns)
    return RequestTruth(ev.sample_id, max(1, int(ev.prompt_tokens)), tuple(
        TurnTruth(gens[i], latency_s, results[i]) if i < turns - 1 else TurnTruth(gens[i])
        for i in range(turns)))


def _spread(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` integers that differ by at most one (earlier ones larger)."""
    if parts <= 0:
        return []
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def observed_requests(events: Iterable[Event], cfg: ExperimentConfig, *,
                      tool_tokens: Mapping[str, float] | None = None) -> dict[str, StepRequests]:
    """Per pipeline and step, the requests that reproduce a real run's finished samples.

    Args:
        events: the real run's events (only ``SampleFinished`` is read).
        cfg: its config (tool latency, task of each pipeline).
        tool_tokens: pipeline -> tokens per tool result (default: :func:`tool_result_tokens`).

    Raises:
        InputError: an event names a pipeline the config does not have.
    """
    specs = {p.name: p for p in cfg.pipelines}
    per: dict[str, dict[int, list[SampleFinished]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        if isinstance(e, SampleFinished):
            if e.pipeline not in specs:
                raise InputError(f"the run's events name pipeline {e.pipeline!r}, which the "
                                 "config does not have", where="events",
                                 fix="calibrate a run with the config that produced it")
            per[e.pipeline][e.step].append(e)
    tokens = dict(tool_tokens) if tool_tokens is not None else {}
    out: dict[str, StepRequests] = {}
    for name, steps in per.items():
        spec = specs[name]
        tt = tokens[name] if name in tokens else tool_result_tokens(spec)
        lat = tool_latency_s(spec)
        out[name] = {s: [replay_request(e, tt, lat)
                         for e in sorted(evs, key=lambda e: _sample_key(e.sample_id))]
                     for s, evs in steps.items()}
    return out


class ReplaySampler:
    """A request sampler that returns observed requests (duck-types ``RequestSampler``).

    ``steps[i]`` is the workload of the simulated step ``i`` (the ``i``-th step the real run
    finished; a resumed run's first step is its ``steps[0]``). A step beyond them is an error:
    the simulator must not invent a workload.
    """

    def __init__(self, pipeline: str, steps: Sequence[list[RequestTruth]]) -> None:
        self.pipeline = pipeline
        self.steps = list(steps)

    def sample_step(self, rng: np.random.Generator, pipeline: str, step: int,
                    batch_size: int) -> list[RequestTruth]:
        del rng, batch_size  # replayed, not sampled
        if not 0 <= step < len(self.steps):
            raise InputError(f"pipeline {pipeline!r} step {step} has no observed samples",
                             where="events", fix="calibrate a run whose steps all finished")
        return list(self.steps[step])


def finished_steps(events: Iterable[Event]) -> dict[str, list[int]]:
    """Pipeline -> the steps it finished (``StepFinished``), sorted."""
    out: dict[str, set[int]] = defaultdict(set)
    for e in events:
        if isinstance(e, StepFinished):
            out[e.pipeline].add(e.step)
    return {p: sorted(s) for p, s in out.items()}


def replay_experiment(exp: Experiment, requests: Mapping[str, StepRequests],
                      finished: Mapping[str, Sequence[int]] | None = None,
                      notes: list[str] | None = None) -> Experiment:
    """``exp`` with each pipeline's sampler replaced by a :class:`ReplaySampler`.

    Args:
        exp: the resolved experiment of the real run.
        requests: :func:`observed_requests`.
        finished: pipeline -> the steps the real run finished (:func:`finished_steps`); a
            pipeline that finished fewer steps than configured (it failed, or the run stopped)
            is replayed for those steps only, and a line saying so goes to ``notes``. None:
            every step with observed samples counts as finished.
        notes: collects those lines.

    Raises:
        InputError: a pipeline of ``exp`` finished no step.
    """
    pipes = []
    for p in exp.pipelines:
        name = p.spec.name
        observed = requests.get(name, {})
        done = [s for s in (finished.get(name, []) if finished is not None else sorted(observed))
                if s in observed]
        if not done:
            raise InputError(f"the run finished no step of pipeline {name!r}", where="events",
                             fix="calibrate a run whose pipelines all ran")
        spec = p.spec
        if len(done) != spec.steps:
            spec = spec.model_copy(update={"steps": len(done)})
            if notes is not None:
                notes.append(f"{name}: the real run finished {len(done)} of {p.spec.steps} "
                             "steps; the prediction replays those")
        pipes.append(dataclasses.replace(p, spec=spec, sampler=ReplaySampler(
            name, [observed[s] for s in done])))
    return dataclasses.replace(exp, pipelines=tuple(pipes))


# --------------------------------------------------------------------------- prediction

@dataclass(frozen=True, slots=True)
class Compared:
    """One measured quantity beside its prediction; ``low`` / ``high``: the range of the
    prediction and of the replays under the run's call-time scatter (None: none were run)."""

    measured: float | None
    predicted: float | None
    low: float | None = None
    high: float | None = None

    @property
    def in_range(self) -> bool | None:
        """Whether the measurement lies within the replays' range (None: no range)."""
        if self.measured is None or self.low is None or self.high is None:
            return None
        return self.low <= self.measured <= self.high

    @property
    def rel_error(self) -> float | None:
        """(predicted - measured) / measured; None when either is missing or measured is 0."""
        if self.measured is None or self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured

    def to_json(self) -> dict[str, float | None]:
        out = {"measured": self.measured, "predicted": self.predicted,
               "rel_error": self.rel_error}
        if self.low is not None:
            out.update(low=self.low, high=self.high)
        return out


@dataclass(slots=True)
class Calibration:
    """The simulator's prediction of one real run beside the measurement.

    ``pool`` holds ``makespan_s``, ``throughput_tokens_per_s``, ``samples_per_s`` and
    ``busy_fraction``; ``pipelines`` maps each pipeline to ``step_latency_s`` (mean) and
    ``tokens_per_s``. ``sim_summary`` / ``sim_events`` are the simulated run's.
    """

    policy: str
    cost_source: str
    pool: dict[str, Compared]
    pipelines: dict[str, dict[str, Compared]]
    sim_summary: dict[str, Any]
    sim_events: list[Event] = field(default_factory=list, repr=False)
    notes: list[str] = field(default_factory=list)
    # pipeline -> stage timing (``StepFinished.timings_s`` keys) -> mean seconds per step:
    # where a step-latency miss comes from (shown, not judged)
    stages: dict[str, dict[str, Compared]] = field(default_factory=dict)
    # the realistic makespan bound (graph/makespan_bound.py) of the replayed workload under the
    # truth's costs: what no schedule of this run's requests beats on the predicted pool
    bound_s: float | None = None
    # the machine's speed for the run against the profile's (run probe / profile probe: > 1 is
    # slower) and the same prediction with the profile scaled by it (costmodel/speed.py); None
    # where the profile or the run has no probe
    speed_factor: float | None = None
    speed_adjusted: dict[str, Any] | None = None
    # the run's call-time scatter (experiments/replay_spread.py) and the replays under it that
    # give each of ``pool`` and ``pipelines`` its range (None / 0: none were run)
    noise_sigma: float | None = None
    replays: int = 0

    # Quantities the 10% aim applies to (busy fraction is shown, not judged).
    JUDGED_POOL = ("makespan_s", "throughput_tokens_per_s")
    JUDGED_PIPELINE = ("step_latency_s", "tokens_per_s")

    @property
    def max_abs_rel_error(self) -> float | None:
        errs = [c.rel_error for k, c in self.pool.items() if k in self.JUDGED_POOL]
        errs += [c.rel_error for p in self.pipelines.values()
                 for k, c in p.items() if k in self.JUDGED_PIPELINE]
        vals = [abs(e) for e in errs if e is not None]
        return max(vals) if vals else None

    @property
    def within_target(self) -> bool:
        err = self.max_abs_rel_error
        return err is not None and err <= TARGET_REL_ERROR

    @property
    def bound_tokens_per_s(self) -> float | None:
        """The pool's tokens over :attr:`bound_s`: the best tokens/s any schedule of this
        workload reaches on the predicted pool (None without a bound)."""
        tokens = self.sim_summary.get("tokens")
        if not self.bound_s or not tokens:
            return None
        return float(tokens) / self.bound_s

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "cost_source": self.cost_source,
                "target_rel_error": TARGET_REL_ERROR, "within_target": self.within_target,
                "max_abs_rel_error": self.max_abs_rel_error, "bound_s": self.bound_s,
                "bound_tokens_per_s": self.bound_tokens_per_s,
                "speed_factor": self.speed_factor, "speed_adjusted": self.speed_adjusted,
                "noise_sigma": self.noise_sigma, "replays": self.replays,
                "pool": {k: c.to_json() for k, c in self.pool.items()},
                "pipelines": {p: {k: c.to_json() for k, c in d.items()}
                              for p, d in self.pipelines.items()},
                "stages": {p: {k: c.to_json() for k, c in d.items()}
                           for p, d in self.stages.items()}, "notes": self.notes}


def truth_cost(exp: Experiment, profile: str | Path | None, *,
               speed_factor: float = 1.0) -> CostModel:
    """The simulator's truth for a real run: the profile's cost model (noise off), or the
    built-in ``cpu-worker`` preset when ``profile`` is None; ``speed_factor``: the profiled
    machine that many times slower (:func:`jigsawrl.costmodel.speed.slower`)."""
    return real_belief(exp, profile, speed_factor=speed_factor)


def speed_factor(profile: str | Path | None, measured: Mapping[str, Any]) -> float | None:
    """The run's speed probe (the median of its workers', before the clock and, where taken,
    again after the run: ``speed_probes_end_s``) over the profile's: how many times slower the
    machine ran than when profiled; None where either has no probe."""
    probes = [*(measured.get("speed_probes_s") or []), *(measured.get("speed_probes_end_s") or [])]
    if profile is None or not probes:
        return None
    from jigsawrl.costmodel.profile import profile_probe_s, read_profile

    base = profile_probe_s(read_profile(profile), where=str(profile))
    return None if base is None else float(np.median(probes)) / base


def simulate_replay(exp: Experiment, policy: str, truth: CostModel, *,
                    params: Mapping[str, Any] | None = None,
                    belief: CostModel | None = None) -> tuple[dict[str, Any], list[Event]]:
    """Simulate a replayed experiment under ``policy`` with ``truth``; the policy's belief is
    ``belief`` — the one its real run had (``run_real``'s profile) — or the built-in preset's.

    Raises:
        ConfigError: an unknown policy, or one that cannot place this experiment.
    """
    cfg = exp.config
    pol = make_policy(cfg, policy, params)
    executor = SimulatedExecutor(exp, truth_cost=truth, seed=cfg.seed)
    result = drive(exp, pol, executor, belief or real_belief(exp))
    info = run_info(exp, policy, name=f"{cfg.name or 'real-run'} (predicted)",
                    accelerator=truth.accel.name, peak_flops=truth.accel.peak_flops)
    return summarize(result.events, info), result.events


def replay_bound(replay: Experiment, truth: CostModel, notes: list[str]) -> float | None:
    """The realistic makespan bound of a replayed experiment's observed requests under
    ``truth`` (None, with a line in ``notes``, where the bound cannot be computed for it), at
    each pipeline's configured rollout TP: the Ray executor runs no other."""
    from jigsawrl.graph.makespan_bound import makespan_bound

    def observed(pipe: Any, step: int) -> list[RequestTruth]:
        return pipe.sampler.sample_step(None, pipe.spec.name, step, pipe.spec.batch_size)

    try:
        return makespan_bound(replay.pipelines, observed, truth, replay.num_devices,
                              tps_of=lambda pipe: (pipe.spec.rollout_tp,)).bound_s
    except (ValueError, InputError) as exc:  # e.g. a pipeline the bound does not model
        notes.append(f"no makespan bound for the replayed workload: {exc}")
        return None


def samples_per_s(summary: Mapping[str, Any]) -> float | None:
    """Finished samples per second of makespan (from a summary's per-pipeline counts)."""
    span = summary.get("makespan_s") or 0.0
    n = sum(int(p.get("samples") or 0) for p in summary.get("pipelines", []))
    return n / span if span > 0 else None


def compare_summaries(measured: Mapping[str, Any], predicted: Mapping[str, Any]
                      ) -> tuple[dict[str, Compared], dict[str, dict[str, Compared]]]:
    """Pool and per-pipeline :class:`Compared` values of two summaries (``summarize`` shape)."""
    pool = {k: Compared(_num(measured.get(k)), _num(predicted.get(k)))
            for k in ("makespan_s", "throughput_tokens_per_s", "busy_fraction")}
    pool["samples_per_s"] = Compared(samples_per_s(measured), samples_per_s(predicted))
    pred = {p["name"]: p for p in predicted.get("pipelines", [])}
    pipes: dict[str, dict[str, Compared]] = {}
    for p in measured.get("pipelines", []):
        q = pred.get(p["name"], {})
        pipes[p["name"]] = {
            "step_latency_s": Compared(_num(p.get("mean_step_latency_s")),
                                       _num(q.get("mean_step_latency_s"))),
            "tokens_per_s": Compared(_num(p.get("tokens_per_s")), _num(q.get("tokens_per_s")))}
    return pool, pipes


def compare_replays(measured: Mapping[str, Any], predicted: Mapping[str, Any],
                    replays: Sequence[Mapping[str, Any]]
                    ) -> tuple[dict[str, Compared], dict[str, dict[str, Compared]]]:
    """:func:`compare_summaries` of ``predicted`` (the noise-free replay), each quantity with
    the range (``Compared.low`` / ``high``) of it and of ``replays`` (under noise)."""
    pool, pipes = compare_summaries(measured, predicted)
    runs = [compare_summaries(measured, one) for one in replays]

    def ranged(c: Compared, others: list[Compared]) -> Compared:
        values = [v for v in (c.predicted, *(o.predicted for o in others)) if v is not None]
        if c.predicted is None or not values:
            return c
        return Compared(c.measured, c.predicted, min(values), max(values))

    return ({k: ranged(c, [r[0][k] for r in runs]) for k, c in pool.items()},
            {name: {k: ranged(c, [r[1][name][k] for r in runs]) for k, c in d.items()}
             for name, d in pipes.items()})


def mean_stage_times(events: Iterable[Event]) -> dict[str, dict[str, float]]:
    """Pipeline -> ``StepFinished.timings_s`` key -> mean seconds over the pipeline's steps."""
    sums: dict[str, dict[str, list[float]]] = {}
    for e in events:
        if isinstance(e, StepFinished):
            for key, value in e.timings_s.items():
                sums.setdefault(e.pipeline, {}).setdefault(key, []).append(value)
    return {p: {k: sum(v) / len(v) for k, v in d.items()} for p, d in sums.items()}


def compare_stages(measured: Iterable[Event], predicted: Iterable[Event]
                   ) -> dict[str, dict[str, Compared]]:
    """Mean per-stage step timings of a real run beside those of its prediction."""
    got, want = mean_stage_times(measured), mean_stage_times(predicted)
    return {p: {k: Compared(v, want.get(p, {}).get(k)) for k, v in d.items()}
            for p, d in got.items()}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def calibrate(cfg: ExperimentConfig, events: Sequence[Event], policy: str, *,
              profile: str | Path | None = None, measured: Mapping[str, Any] | None = None,
              exp: Experiment | None = None,
              tool_tokens: Mapping[str, float] | None = None,
              replays: int = REPLAYS) -> Calibration:
    """Predict a finished real run with the simulator and put it beside the measurement.

    Args:
        cfg: the real run's config (``cluster.accelerator: cpu-worker``).
        events: the real run's events.
        policy: the policy it ran under (its params: ``scheduler.base.params_for``).
        profile: a ``jigsawrl profile`` YAML; None = the built-in (unmeasured) preset.
        measured: the real run's summary (default: summarised from ``events``).
        exp: the resolved experiment (default: ``experiments.resolve.resolve_real(cfg)``; tests pass one to
            stay torch-free).
        tool_tokens: pipeline -> tokens per tool result (default: :func:`tool_result_tokens`).
        replays: replays under the run's call-time scatter that give each prediction its
            range (:mod:`~jigsawrl.experiments.replay_spread`); 0: none. The prediction itself,
            the per-stage comparison and the speed-adjusted prediction are the noise-free
            replay's.

    Raises:
        InputError: an unreadable profile, or events that do not match the config.
        ConfigError: an invalid config or policy.
    """
    if exp is None:
        from jigsawrl.experiments.resolve import resolve_real

        exp = resolve_real(cfg)
    if measured is None:
        measured = summarize(events, run_info(exp, policy, executor="ray",
                                              name=exp.config.name or "real-run"))
    notes: list[str] = []
    replay = replay_experiment(exp, observed_requests(events, cfg, tool_tokens=tool_tokens),
                               finished_steps(events) or None, notes)
    truth = truth_cost(exp, profile)
    # the belief the real run's policy had (its summary names the profile; None: the preset)
    belief = real_belief(exp, measured.get("belief_profile"))
    sim_summary, sim_events = simulate_replay(replay, policy, truth, belief=belief)
    sigma = call_noise_sigma(events, sim_events) if replays > 0 else None
    runs = [] if not sigma else replays_under_noise(
        lambda noisy_truth: simulate_replay(replay, policy, noisy_truth, belief=belief)[0],
        truth, sigma, replays)
    pool, pipes = (compare_replays(measured, sim_summary, runs) if runs
                   else compare_summaries(measured, sim_summary))
    cal = Calibration(policy, truth.accel.source, pool, pipes, sim_summary, sim_events, notes,
                      compare_stages(events, sim_events), replay_bound(replay, truth, notes))
    if runs:
        cal.noise_sigma, cal.replays = sigma, replays
    factor = speed_factor(profile, measured)
    if factor is not None:
        cal.speed_factor = factor
        adj_summary, adj_events = simulate_replay(
            replay, policy, truth_cost(exp, profile, speed_factor=factor), belief=belief)
        adj_pool, adj_pipes = compare_summaries(measured, adj_summary)
        cal.speed_adjusted = {
            "pool": {k: c.to_json() for k, c in adj_pool.items()},
            "pipelines": {p: {k: c.to_json() for k, c in d.items()}
                          for p, d in adj_pipes.items()},
            "stages": {p: {k: c.to_json() for k, c in d.items()}
                       for p, d in compare_stages(events, adj_events).items()}}
    log.info("calibration of %s: max |error| %s (target %.0f%%)", policy,
             "n/a" if cal.max_abs_rel_error is None else f"{cal.max_abs_rel_error:.1%}",
             100 * TARGET_REL_ERROR)
    return cal
