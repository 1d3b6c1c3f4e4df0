"""Compute works: the post-rollout stages (reward, log-probs, update, weight sync) and the train
state's memory moves (offload, onload), on the event clock.

A work's remaining work is tracked in *full-share seconds* and progresses at
``1 / slowdown(stage, share)``, so a share change mid-run re-times its completion exactly; each
share it ran at is one span, carrying its part of the work's FLOPs and tokens. A running model pass
demands memory bandwidth on its devices (:func:`~.contention.work_demand`), which slows the decodes
there. A work's true cost (:func:`stage_cost`) comes from the truth cost model and the finished
rollout's sequence lengths; on a profiled worker pool a work also pays the train-state moves
the Ray executor makes before it (:mod:`.residency`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.events import Event, Span
from jigsawrl.sim.contention import BandwidthContention, work_demand
from jigsawrl.sim.gates import GATED_STAGES, DeviceGates
from jigsawrl.sim.hostload import HostLoad
from jigsawrl.sim.kernel import PRIO_FINISH, Entry, EventQueue
from jigsawrl.sim.listener import SimListener
from jigsawrl.sim.residency import WorkerResidency, moves_modelled, worker_param
from jigsawrl.stages import Stage
from jigsawrl.workload.experiment import ResolvedPipeline

# The rank a work's spans and demand key carry (a work spans its devices as one group).
WORK_RANK = 0
WORK_DEMAND_RANK = -1


@dataclass(slots=True, eq=False)
class Work:
    """A running compute work (see the module docstring)."""

    tid: str
    pipe: ResolvedPipeline
    step: int
    stage: str
    devices: tuple[int, ...]
    share: float
    remaining_full_s: float  # work left, in seconds at share 1.0
    since_s: float  # time of the last progress update
    flops: float
    tokens: int
    total_full_s: float = 0.0
    slowdown: float = 1.0
    host_factor: float = 1.0  # the host's slowdown it was last timed at (sim/hostload.py)
    entry: Entry | None = None
    span_start_s: float = 0.0
    done_frac: float = 0.0


def stage_cost(cost: CostModelProtocol, pipe: ResolvedPipeline, stage: str, n: int,
               lens: tuple[int, ...],
               prompts: tuple[int, ...] | None = None,
               rollout_tp: int | None = None) -> tuple[float, float, int]:
    """True full-share seconds, FLOPs and tokens of a post-rollout stage or memory move of
    ``pipe`` on ``n`` devices, after a rollout whose sequences had ``lens`` tokens (``prompts``
    of them prompt tokens, in GRPO groups of ``group_size`` rows; None: not known).

    Raises:
        ValueError: on a stage that is neither post-rollout nor a train-state move.
    """
    c, m = cost, pipe.model
    tokens = sum(lens)
    if stage == Stage.REWARD:
        return c.reward_time_s(len(lens)), 0.0, 0
    # the tokens the pass computes over (padding included where the trainer pads)
    computed = c.pass_tokens(lens, n, pipe.spec.train.micro_batch_size, prompts,
                             pipe.spec.group_size)
    if stage in (Stage.OLD_LOGPROB, Stage.REF_LOGPROB):
        return c.logprob_time_s(m, n, computed), c.logprob_flops(m, tokens), tokens
    if stage == Stage.ACTOR_UPDATE:
        epochs = pipe.spec.train.ppo_epochs
        return (epochs * c.train_time_s(m, n, computed), epochs * c.train_flops(m, tokens),
                tokens)
    if stage == Stage.WEIGHT_SYNC:
        return c.weight_sync_time_s(m, n, rollout_tp or pipe.spec.rollout_tp), 0.0, 0
    if stage in (Stage.OFFLOAD, Stage.ONLOAD):
        return c.host_transfer_time_s(c.train_state_bytes(m, n) * n, n), 0.0, 0
    raise ValueError(f"unknown stage {stage!r}")


def dp_rounds(pipe: ResolvedPipeline, stage: str, n: int) -> int:
    """Worker calls of a pass on ``n`` devices: an update of several PPO epochs over several
    devices is one data-parallel round per epoch (the Ray executor's ``UpdateRounds``)."""
    return pipe.spec.train.ppo_epochs if stage == Stage.ACTOR_UPDATE and n >= 2 else 1


class WorkRuntime:
    """Runs compute works on the event queue (see the module docstring).

    Args:
        q: the event queue (its payloads here are ``(handler, *args)``).
        cost: the truth cost model.
        contention: the pool's bandwidth contention (shared with rollouts).
        events: where metric records go (shared with rollouts).
        listener: where finished works are reported.
        step_lens: ``(pipeline, step) -> sequence lengths`` of finished rollouts.
        num_devices: devices of the pool (what a host stage naming no device is costed on).
        streamed: ``(pipeline, step, stage) ->`` the sequence lengths streaming already put
            through that stage (:mod:`.stream`); a work costs only the rest.
        gates: devices that run one call at a time (:mod:`.gates`; None: co-located works
            advance at their shares): a gated stage waits for its devices, then runs at the
            whole device to its end.
        step_prompts: the prompt tokens of ``step_lens``' sequences, in the same order (for a
            trainer that forwards each group's prompt once: ``CostParams.train_shares_prompt``).
        host: the CPU host's load (:mod:`.hostload`; None: not modelled), which slows a gated
            work while its node's busy devices and the rest of the run want more cores than
            it has.
    """

    def __init__(self, q: EventQueue, cost: CostModelProtocol, contention: BandwidthContention,
                 events: list[Event], listener: SimListener,
                 step_lens: Mapping[tuple[str, int], tuple[int, ...]], num_devices: int,
                 streamed: Callable[[str, int, str], Counter[int]] | None = None,
                 gates: DeviceGates | None = None,
                 step_prompts: Mapping[tuple[str, int], tuple[int, ...]] | None = None,
                 host: HostLoad | None = None) -> None:
        self.q = q
        self.host = host
        self.step_prompts = {} if step_prompts is None else step_prompts
        self.gates = gates
        self.cost = cost
        self.contention = contention
        self.events = events
        self.listener = listener
        self.step_lens = step_lens
        self.num_devices = num_devices
        self.streamed = streamed
        self.works: dict[str, Work] = {}
        # pipeline -> TP its last rollout started at (a policy may run another than the
        # config's): the engine its weight sync goes to
        self.rollout_tps: dict[str, int] = {}
        self.residency = WorkerResidency(cost) if moves_modelled(cost) else None
        self.stage_gap_s = worker_param(cost, "stage_gap_s")
        self.sync_measured = worker_param(cost, "weight_sync_s") > 0.0

    def start(self, tid: str, pipe: ResolvedPipeline, step: int, stage: str,
              devices: tuple[int, ...], share: float) -> None:
        """Start ``stage`` of ``pipe``'s ``step`` on ``devices`` at ``share``."""
        n = len(devices) or self.num_devices  # a host stage may name no device
        lens = self.step_lens.get((pipe.spec.name, step), ())
        done = self.streamed(pipe.spec.name, step, stage) if self.streamed else Counter()
        prompts = self.step_prompts.get((pipe.spec.name, step))
        if done:  # the rows left are no longer whole groups: priced in full
            lens, prompts = tuple((Counter(lens) - done).elements()), None
        full_s, flops, tokens = stage_cost(self.cost, pipe, stage, n, lens, prompts,
                                           self.rollout_tps.get(pipe.spec.name))
        if done and stage == Stage.ACTOR_UPDATE and not lens:  # the optimizer step is left
            full_s = self.cost.train_time_s(pipe.model, n, 1)
        full_s += self.cost.dispatch_time_s(pipe.model, stage, n, dp_rounds(pipe, stage, n))
        moved = (self.residency.move_s(pipe.spec.name, pipe.model, stage, devices)
                 if self.residency is not None else None)
        if moved is not None:  # a worker pool's train-state moves (sim/residency.py)
            full_s = moved if stage in (Stage.ONLOAD, Stage.OFFLOAD) else full_s + moved
        if not (stage == Stage.WEIGHT_SYNC and self.sync_measured):  # (measured with its wait)
            full_s += self.stage_gap_s  # a worker pool's wait for the call (stage_gap_s)
        w = Work(tid, pipe, step, stage, devices, share, full_s, self.q.now_s, flops,
                 tokens, total_full_s=full_s, span_start_s=self.q.now_s)
        self.works[tid] = w
        if self._gated(stage) and devices:
            self.gates.request(tid, devices, lambda: self._granted(w))
        else:
            self._schedule(w)

    def _granted(self, w: Work) -> None:
        """A gated work holds its devices: it runs from now (its span starts here)."""
        if w.tid in self.works and w.entry is None:
            w.span_start_s = self.q.now_s
            self._schedule(w)

    def _gated(self, stage: str) -> bool:
        """Whether ``stage`` queues for its devices and then runs at the whole device."""
        return self.gates is not None and stage in GATED_STAGES

    def rescale(self, tid: str, share: float) -> None:
        """Run work ``tid`` at ``share`` from now on (its span so far is written)."""
        w = self.works[tid]
        if self._gated(w.stage):
            w.share = share  # a gated work runs at the whole device whatever its share
            return
        self.q.cancel(w.entry)
        self._progress(w)
        self._emit_span(w, self.q.now_s)
        w.share = share
        self._schedule(w)

    def _set_demand(self, w: Work, demand: float) -> None:
        self.contention.set_demand((w.tid, WORK_DEMAND_RANK), w.devices, demand)

    def _schedule(self, w: Work) -> None:
        rate = 1.0 if self._gated(w.stage) else w.share
        self._set_demand(w, work_demand(w.stage, rate))
        w.host_factor = self._host_factor(w)
        w.slowdown = (1.0 if rate <= 0 else
                      self.cost.slowdown(w.stage, rate, model=w.pipe.model) * w.host_factor)
        w.since_s = self.q.now_s
        w.entry = self.q.schedule(self.q.now_s + w.remaining_full_s * w.slowdown,
                                  (self._on_end, w), PRIO_FINISH)

    def _host_factor(self, w: Work) -> float:
        """The host's slowdown of a gated work (it holds its devices' gates: they are busy)."""
        if self.host is None or not self._gated(w.stage):
            return 1.0
        return self.host.factor(w.devices)

    def retime_host(self, nodes: set[int]) -> None:
        """Re-time the running works on ``nodes``, whose busy devices changed: the work done
        so far stands, the rest runs at the host's new slowdown (no new span: the share is
        unchanged)."""
        assert self.host is not None
        for w in self.works.values():
            if w.entry is None or not self.host.on_nodes(w.devices, nodes):
                continue
            factor = self._host_factor(w)
            if abs(factor - w.host_factor) <= 1e-12:
                continue
            self.q.cancel(w.entry)
            self._progress(w)
            w.slowdown *= factor / w.host_factor
            w.host_factor = factor
            w.entry = self.q.schedule(self.q.now_s + w.remaining_full_s * w.slowdown,
                                      (self._on_end, w), PRIO_FINISH)

    def _progress(self, w: Work) -> None:
        now = self.q.now_s
        w.remaining_full_s = max(0.0, w.remaining_full_s - (now - w.since_s) / w.slowdown)
        w.since_s = now

    def _emit_span(self, w: Work, end_s: float) -> None:
        total = w.total_full_s
        frac = 1.0 if total <= 0 else 1.0 - w.remaining_full_s / total
        part = frac - w.done_frac
        w.done_frac = frac
        if end_s > w.span_start_s:
            self.events.append(Span(w.pipe.spec.name, w.step, w.stage, WORK_RANK, w.devices,
                                    w.span_start_s, end_s, w.share, w.flops * part,
                                    int(w.tokens * part)))
        w.span_start_s = end_s

    def _on_end(self, w: Work) -> None:
        w.remaining_full_s = 0.0
        self._emit_span(w, self.q.now_s)
        del self.works[w.tid]
        self._set_demand(w, 0.0)
        if self.gates is not None:
            self.gates.release(w.tid)
        self.listener.task_done(w.tid, w.pipe.spec.name, w.step, w.stage, self.q.now_s)
