"""How a careful verl user places several jobs on one pool: the arithmetic behind ``verl-sized``
and ``verl-queue`` (DESIGN.md §6, ``reference/peers.md``).

verl runs one job per pipeline; a user with several chooses where each job runs. Beside the equal
split and the jobs one after another (``scheduler/verl.py``), two placements a lab uses:

- **sized split** (``verl-sized``): each job on its own disjoint slice, the slice sized to the
  job's predicted work — a short GSM8K job on 2 GPUs beside a long MATH job on 6;
- **job queue** (``verl-queue``, parameter ``k``): ``k`` jobs at a time on ``k`` disjoint equal
  slices; when a job finishes all its steps the next one takes its slice.

**What the prediction reads.** Only what a user knows before the run: the task preset's length
distribution (its median per turn, its spread, its turns and tool latencies — public knowledge of
the task type, as in ``graph/predict.py``'s prior), the batch and group sizes, the model, the TP
degrees, ``max_response_tokens`` and the step count; and the belief cost model. Never a sampled
length and never the run's history: the placement is fixed before the first step, as a user fixes
it when submitting the jobs. We chose the preset prior over a pilot step because a pilot step of
each job is a run the user pays for and then restarts (verl cannot resize a running job); the
prior costs nothing and already separates short tasks from long ones. A length drift or a length
trace is not read (a drift is unknown before the run; a trace file is I/O, which a policy does not
do): a documented simplification.

**The prediction.** A job's duration on ``n`` devices is its steps × (generation + post-rollout
stages). Generation is the slowest rank's timeline, each rank with its contiguous chunk of a
batch drawn from the task preset's prior (verl's dispatch; averaged over a few draws:
``scheduler/batch_replay.py``), under the same continuous-batching model the simulator runs
(``sim/rollout.py``), with the KV budget verl's engine would get on that slice; the post-rollout
stages are ``graph/build.py``'s on ``n``
devices. So a tail-bound job is predicted to gain little from more devices, as it does.

**Sizes.** Slices are whole TP groups (the least common multiple of ``rollout_tp`` and
``train_tp``) large enough to hold the colocated train state (:func:`check_fit`, as ``verl-split``
checks), and placed as verl places a job (``trainer.nnodes`` × ``trainer.n_gpus_per_node``): a
job smaller than a node inside one node, a larger one on whole nodes (:func:`slice_sizes`,
:func:`pack`). :func:`sized_split` starts every job at its smallest feasible slice and moves the
job with the longest predicted duration (the makespan of a split is the longest job) to its next
larger slice while that shortens it and the slices still pack — optimal for the min-max objective
when every job's sizes are the same steps and durations only fall with devices; a near-optimal
heuristic otherwise. Queue slices are node-aligned the same way (:func:`queue_slice_size`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from jigsawrl.config import PipelineSpec
from jigsawrl.costmodel import CostModelProtocol
from jigsawrl.errors import ConfigError
from jigsawrl.graph.build import post_rollout_stages
from jigsawrl.scheduler.base import PipelineView, View
from jigsawrl.scheduler.batch_replay import (
    MAX_RANKS,
    RanksReplay,
    instances,
    memo,
    prior_batches,
    prior_key,
    rollout_s,
)
from jigsawrl.workload.requests import RequestTruth, TurnTruth
from jigsawrl.workload.task_presets import TASKS, TaskSpec

# verl's dynamic batch size default for the actor: ppo_max_token_len_per_gpu = 16384.
MICRO_BATCH_TOKENS = 16384
# Queue widths tried when the pool is unknown (``variants()`` takes no view): every k from 2 up
# to this; a k past the pool's or the pipelines' count fails fast at the first decision.
MAX_QUEUE_K = 16
# The prompt (tokens) of a task without a preset when nothing measured it.
DEFAULT_PROMPT_TOKENS = 128


def pipeline_resident_bytes(cost: CostModelProtocol, pv: PipelineView, n_devices: int) -> float:
    """Persistent per-device state of a colocated pipeline: FSDP train state + reference weights."""
    ref = pv.model.weight_bytes() / n_devices if pv.spec.use_ref else 0.0
    return cost.train_state_bytes(pv.model, n_devices) + ref


def colocated_need_bytes(view: View, pv: PipelineView, n: int) -> float:
    """Per device: the train state, reference and one micro-batch's activations on ``n``."""
    return pipeline_resident_bytes(view.cost, pv, n) + view.cost.activation_bytes(
        pv.model, MICRO_BATCH_TOKENS, n)


def check_fit(view: View, pv: PipelineView, n: int) -> None:
    """A colocated pipeline must hold its train state, reference and activations on ``n`` devices.

    Raises:
        ConfigError: naming the pipeline and what to change.
    """
    need = colocated_need_bytes(view, pv, n)
    have = view.accelerator.hbm_bytes
    if need > have:
        raise ConfigError(
            f"pipeline {pv.name!r} ({pv.spec.model}) needs {need / 1e9:.0f} GB per device to "
            f"train colocated on {n} device(s), {view.accelerator.name} has {have / 1e9:.0f} GB",
            where=f"pipelines.{pv.index}.num_devices",
            fix="give it more devices (num_devices) or use verl-serial")


def tp_group(pv: PipelineView) -> int:
    """Devices of one whole TP group of both the rollout engine and the trainer."""
    return math.lcm(pv.spec.rollout_tp, pv.spec.train_tp)


def usable(pv: PipelineView, n: int) -> int:
    """The devices of an ``n``-device slice that ``pv`` uses: whole TP groups only."""
    return n - n % tp_group(pv)


def fits(view: View, pv: PipelineView, n: int) -> bool:
    """Whether ``pv`` runs colocated on an ``n``-device slice (>= 1 group, memory)."""
    m = usable(pv, n)
    return m >= 1 and colocated_need_bytes(view, pv, m) <= view.accelerator.hbm_bytes


def min_devices(view: View, pv: PipelineView) -> int:
    """The smallest slice (whole TP groups) that holds ``pv``.

    Raises:
        ConfigError: not even the whole pool does (as :func:`check_fit` says).
    """
    g, n = tp_group(pv), len(view.devices)
    for m in range(g, n + 1, g):
        if fits(view, pv, m):
            return m
    check_fit(view, pv, max(usable(pv, n), 1))
    raise ConfigError(f"pipeline {pv.name!r} needs a TP group of {g} devices, the pool has {n}",
                      where=f"pipelines.{pv.index}.rollout_tp")


# ---------------------------------------------------------------------------- prediction

def prior_requests(pv: PipelineView) -> list[RequestTruth]:
    """One step's requests as the task preset predicts them (no sample is read).

    Per-turn lengths are the preset's lognormal at evenly spaced quantiles (the per-sample and
    per-prompt spreads combined), each request with the expected number of turns, the median tool
    latency and the mean tool result; totals capped at ``max_response_tokens``. A task without a
    preset (a real task) gets a quarter of the cap, single-turn, as ``jigsaw``'s prior does,
    after a prompt of :func:`prior_prompt_tokens`.
    """
    spec = pv.spec
    n = spec.batch_size * spec.group_size
    task = TASKS.get(spec.task)
    if task is None:
        turns = real_task_turns(spec, max(1, spec.max_response_tokens // 4))
        prompt = prior_prompt_tokens(spec)
        return [RequestTruth(f"{pv.name}/prior/{i}", prompt, turns) for i in range(n)]
    sigma = math.hypot(task.response_sigma, task.prompt_difficulty_sigma)
    unit = NormalDist()
    out = []
    for i in range(n):
        length = task.response_median * math.exp(sigma * unit.inv_cdf((i + 0.5) / n))
        out.append(RequestTruth(f"{pv.name}/prior/{i}", int(task.prompt_mean),
                                _turns(task, length, spec.max_response_tokens)))
    return out


def prior_tool_calls(spec: PipelineSpec) -> int:
    """The whole tool calls per response a task without a preset is assumed to make (its
    ``prior_tool_calls``, rounded half up; 0 when unset)."""
    return int((spec.prior_tool_calls or 0.0) + 0.5)


def real_task_turns(spec: PipelineSpec, generated: int) -> tuple[TurnTruth, ...]:
    """``generated`` tokens of a task without a preset as turns: one more than the
    ``prior_tool_calls`` its config (or a real run's resolve, from the task) gives, each turn
    but the last ending in a tool call that waits ``rollout.tool_latency_s`` and returns
    ``prior_tool_result_tokens``; single-turn without tool calls. The tokens split evenly (a
    simplification: a real task's turns differ in length)."""
    calls = prior_tool_calls(spec)
    if calls < 1:
        return (TurnTruth(max(1, generated)),)
    count = calls + 1
    per = max(1, generated // count)
    wait, result = spec.rollout.tool_latency_s, spec.prior_tool_result_tokens or 0
    return tuple(TurnTruth(per) if i == calls else TurnTruth(per, wait, result)
                 for i in range(count))


def prior_prompt_tokens(spec: PipelineSpec) -> int:
    """The prompt length a task without a preset is assumed to have: the config's
    ``prompt_tokens``, or what a real run measured from the task's own prompts before its first
    step (``experiments/resolve.py``), else :data:`DEFAULT_PROMPT_TOKENS`. Prompts are inputs,
    known before anything is generated; a tiny model's step is mostly its prompts' passes, so a
    wrong guess there (128 against the 10-18 tokens of the real bench's tasks) misjudges how a
    job scales with devices."""
    return spec.prompt_tokens or DEFAULT_PROMPT_TOKENS


def _turns(task: TaskSpec, length: float, cap: int) -> tuple[TurnTruth, ...]:
    expected = sum(task.continue_prob ** i for i in range(task.max_turns))
    count = max(1, min(task.max_turns, round(expected)))
    turns: list[TurnTruth] = []
    budget = cap
    for i in range(count):
        tokens = int(max(1, min(budget, round(length))))
        budget -= tokens
        last = i + 1 == count or budget <= 0
        turns.append(TurnTruth(tokens) if last else TurnTruth(
            tokens, task.tool_latency_median_s, int(task.tool_result_mean)))
        if last:
            break
    return tuple(turns)


class JobTimer:
    """Predicted durations of whole jobs (all steps) on slices of the pool, cached per size.

    Args:
        view: the first view (pipelines, pool, belief cost model).
        gpu_memory_utilization: the engine's share of device memory, as the policy runs it.
        gen_replay: how a rollout's ranks are replayed instead of plainly (the seconds its
            generation takes): a policy that speeds up the tails of verl's jobs (jigsaw running a verl
            placement regroups them) times them with it; verl's own sizing never does.
    """

    def __init__(self, view: View, gpu_memory_utilization: float,
                 gen_replay: RanksReplay | None = None) -> None:
        self.view = view
        self.gpu_memory_utilization = gpu_memory_utilization
        self.gen_replay = gen_replay
        self._requests: dict[str, list[RequestTruth]] = {}
        self._batches: dict[str, list[list[RequestTruth]]] = {}
        self._cache: dict[tuple[str, int], float] = {}

    def job_s(self, pv: PipelineView, n: int) -> float:
        """Predicted seconds of all ``pv``'s steps on an ``n``-device slice."""
        key = (pv.name, n)
        if key not in self._cache:
            self._cache[key] = pv.spec.steps * self.step_s(pv, n)
        return self._cache[key]

    def step_s(self, pv: PipelineView, n: int) -> float:
        """Predicted seconds of one step on ``n`` devices: generation + post-rollout stages."""
        cost, spec = self.view.cost, pv.spec
        reqs = self._requests.get(pv.name)
        if reqs is None:  # not setdefault: that would build the prior on every call
            reqs = self._requests[pv.name] = prior_requests(pv)
        batches = self._batches.get(pv.name)
        if batches is None:
            batches = self._batches[pv.name] = prior_batches(pv, reqs)
        ranks = max(1, n // spec.rollout_tp)
        kv_mem = self._kv_mem(pv, n)
        instance, kv = instances(cost, pv, kv_mem, f"{pv.name}/prior")

        def gen_s() -> float:  # every rank with its contiguous chunk of a prior batch
            return rollout_s(pv, batches, ranks, instance, kv_mem, self.gen_replay)
        # a replay whose key names it (or none, or one past a node's ranks: not used) is
        # shared with other timers of this cost model; the prior is the task's, not the job's
        tag = getattr(self.gen_replay, "key", None) if (
            self.gen_replay is not None and ranks <= MAX_RANKS) else "plain"
        prior = prior_key(pv)
        gen = memo(None if tag is None or prior is None else (
            "job", prior, pv.model, spec.rollout_tp, kv, kv_mem, ranks, tag), cost, gen_s)
        tokens = sum(r.total_tokens for r in reqs)
        stages = post_rollout_stages(cost, pv.model, n, tokens, len(reqs), use_ref=spec.use_ref,
                                     ppo_epochs=spec.train.ppo_epochs,
                                     rollout_tp=spec.rollout_tp)
        return gen + sum(stages.values())

    def _kv_mem(self, pv: PipelineView, n: int) -> float:
        return engine_kv_bytes(self.view, pv, n, self.gpu_memory_utilization)


def engine_kv_bytes(view: View, pv: PipelineView, n: int, gpu_memory_utilization: float,
                    ) -> float:
    """Per-device KV memory of verl's rollout engine for ``pv`` on an ``n``-device slice: the
    engine's ``gpu_memory_utilization`` of the device (less what stays resident), less its
    weights; at least 0."""
    cost, hbm = view.cost, view.accelerator.hbm_bytes
    engine = min(gpu_memory_utilization * hbm, hbm - pipeline_resident_bytes(cost, pv, n))
    return max(0.0, engine - cost.rollout_weight_bytes(pv.model, pv.spec.rollout_tp))


# ---------------------------------------------------------------------------- placements

def slice_sizes(view: View, pv: PipelineView) -> list[int]:
    """The slice sizes a verl job of ``pv`` can have, smallest first: whole TP groups within one
    node, or whole nodes (verl's ``trainer.nnodes`` × ``trainer.n_gpus_per_node``; a job smaller
    than a node stays inside one, as a user places it). Memory is not checked here."""
    g, per, n = tp_group(pv), view.accelerators_per_node, len(view.devices)
    inside = list(range(g, min(per, n) + 1, g))
    whole = [j * per for j in range(2, n // per + 1) if (j * per) % g == 0]
    return inside + whole


def pack(view: View, sizes: dict[str, int],
         order: Sequence[str]) -> dict[str, tuple[int, ...]] | None:
    """Devices for slices of ``sizes``: node-sized and larger ones on whole nodes (in
    ``order``), smaller ones inside nodes by first-fit decreasing; None when they do not fit."""
    per = view.accelerators_per_node
    n_nodes = len(view.devices) // per
    out: dict[str, tuple[int, ...]] = {}
    node = 0
    for name in order:
        if sizes[name] >= per:
            out[name] = tuple(range(node * per, node * per + sizes[name]))
            node += sizes[name] // per
    if node > n_nodes:
        return None
    free = [per] * (n_nodes - node)  # devices left per remaining node
    small = sorted((name for name in order if sizes[name] < per), key=lambda x: -sizes[x])
    for name in small:
        i = next((i for i, f in enumerate(free) if f >= sizes[name]), None)
        if i is None:
            return None
        first = (node + i) * per + per - free[i]
        out[name] = tuple(range(first, first + sizes[name]))
        free[i] -= sizes[name]
    return out


def sized_split(view: View, timer: JobTimer) -> dict[str, tuple[int, ...]]:
    """Devices per pipeline for ``verl-sized`` (module docstring: greedy min-max over the
    slice sizes of :func:`slice_sizes` that hold each pipeline).

    Raises:
        ConfigError: the pipelines' smallest feasible slices do not fit in the pool together.
    """
    pipes = list(view.pipelines)
    order = [p.name for p in pipes]
    options = {p.name: [m for m in slice_sizes(view, p) if fits(view, p, m)] for p in pipes}
    for p in pipes:
        if not options[p.name]:
            min_devices(view, p)  # raises, saying what is missing
    sizes = {name: opts[0] for name, opts in options.items()}
    placed = pack(view, sizes, order)
    if placed is None:
        need = ", ".join(f"{name} {m}" for name, m in sizes.items())
        raise ConfigError(f"verl-sized needs at least {sum(sizes.values())} devices ({need}), "
                          f"the pool has {len(view.devices)}", where="pipelines",
                          fix="use verl-queue or verl-serial")
    stuck: set[str] = set()
    while len(stuck) < len(pipes):
        worst = max((p for p in pipes if p.name not in stuck),
                    key=lambda p: timer.job_s(p, sizes[p.name]))
        grown = _grow(view, timer, worst, sizes, options[worst.name], order)
        if grown is None:
            stuck.add(worst.name)
        else:
            sizes, placed = grown
    return placed


def _grow(view: View, timer: JobTimer, pv: PipelineView, sizes: dict[str, int],
          options: list[int], order: Sequence[str]
          ) -> tuple[dict[str, int], dict[str, tuple[int, ...]]] | None:
    """The smallest larger slice of ``pv`` that still packs and on which ``pv`` is predicted
    faster (with the new sizes and their devices), or None."""
    now = timer.job_s(pv, sizes[pv.name])
    for m in options:
        if m <= sizes[pv.name]:
            continue
        trial = {**sizes, pv.name: m}
        placed = pack(view, trial, order)
        if placed is None:
            return None  # larger ones do not pack either
        if timer.job_s(pv, m) < now * (1 - 1e-9):
            return trial, placed
    return None


def queue_slice_size(view: View, k: int) -> int:
    """The size of each of ``k`` equal node-aligned slices: whole nodes when there are at least
    ``k`` nodes, else an equal part of a node (k spread over the nodes)."""
    per = view.accelerators_per_node
    n_nodes = len(view.devices) // per
    if k <= n_nodes:
        return (n_nodes // k) * per
    return per // -(-k // n_nodes)


def queue_slices(view: View, k: int) -> list[tuple[int, ...]]:
    """``k`` equal disjoint node-aligned slices of the pool for ``verl-queue``.

    Raises:
        ConfigError: ``k`` outside 2 .. #pipelines - 1 (1 is verl-serial, #pipelines or more is
            the equal split, verl-split), or a slice that cannot hold some pipeline.
    """
    pipes = view.pipelines
    if not 2 <= k < len(pipes):
        same = "verl-serial" if k <= 1 else "the equal split, verl-split"
        raise ConfigError(f"with {len(pipes)} pipelines verl-queue-{k} is {same} (not rerun)",
                          where="scheduler.params.k")
    size = queue_slice_size(view, k)
    bad = [p for p in pipes if not fits(view, p, size)]
    if bad:
        p = bad[0]
        raise ConfigError(f"verl-queue-{k}: a slice of {size} device(s) cannot hold pipeline "
                          f"{p.name!r} ({p.spec.model}, TP group {tp_group(p)})",
                          where="scheduler.params.k", fix="use a smaller k")
    placed = pack(view, {str(i): size for i in range(k)}, [str(i) for i in range(k)])
    assert placed is not None  # k equal parts of nodes, or k groups of whole nodes
    return [placed[str(i)] for i in range(k)]


def queue_widths(view: View) -> list[int]:
    """The queue widths worth running on this pool: every k from 2 to #pipelines - 1 whose
    equal slices hold every pipeline (k = 1 is verl-serial, k = #pipelines the equal split)."""
    return [k for k in range(2, len(view.pipelines))
            if all(fits(view, p, queue_slice_size(view, k)) for p in view.pipelines)]


def longest_first(view: View, timer: JobTimer, size: int) -> list[str]:
    """Queue order: longest predicted job first (Graham's LPT rule; ties in config order).

    LPT is the stronger reading of "the next job takes the freed slice": on identical slices its
    makespan is within 4/3 of the optimum, an arbitrary (config) order only within 2 — config
    order can leave the longest job to start last and run alone while the other slices idle.
    """
    return [p.name for p in sorted(view.pipelines,
                                   key=lambda p: -timer.job_s(p, usable(p, size)))]
