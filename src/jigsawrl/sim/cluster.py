"""The simulated cluster: one event clock driving rollouts and compute works on a device pool.

:class:`SimCluster` assembles the simulator's pieces the way Vidur splits one — the event kernel
(:mod:`.kernel`), the rollout-task runtime (:mod:`.rollout_task`, over :mod:`.rollout`'s
continuous-batching instances), compute works (:mod:`.works`), and the bandwidth contention
between co-located work (:mod:`.contention`) — behind plain calls with no scheduler types, so
that ``executors/simulated.py`` is only an adapter from the driver's actions to these calls. The
workload side (true requests, dispatch to ranks) is :mod:`.dispatch`.

After every action and every event, the decodes whose devices' bandwidth contention changed are
re-timed (:meth:`~.rollout_task.RolloutRuntime.refresh`); an interruption re-plans its own ranks
and leaves the re-timing to the next event, as it always did. On devices that run one call at a
time (the truth's ``serial_slice_s`` > 0: Ray CPU workers) calls queue for their devices
(:mod:`.gates`) and rollout ranks run in time slices between them (:mod:`.rollout_gates`).
"""

from __future__ import annotations

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.events import Event
from jigsawrl.sim.contention import BandwidthContention
from jigsawrl.sim.gates import DeviceGates
from jigsawrl.sim.hostload import HostLoad
from jigsawrl.sim.kernel import EventQueue
from jigsawrl.sim.listener import SimListener
from jigsawrl.sim.residency import worker_param
from jigsawrl.sim.rollout_task import RolloutRuntime
from jigsawrl.sim.stream import StreamRuntime
from jigsawrl.sim.works import WorkRuntime
from jigsawrl.workload.experiment import ResolvedPipeline
from jigsawrl.workload.requests import RequestTruth


class SimCluster:
    """Event-driven simulation of a pool of ``num_devices`` devices under a truth cost model.

    Args:
        num_devices: devices of the pool.
        cost: the truth cost model (seeded noise on every duration).
        listener: receives rank progress and finished tasks (:class:`~.listener.SimListener`).
    """

    def __init__(self, num_devices: int, cost: CostModelProtocol, listener: SimListener) -> None:
        self.q = EventQueue()
        self.events: list[Event] = []
        self.contention = BandwidthContention(num_devices, cost)
        slice_s = worker_param(cost, "serial_slice_s")
        self.host = HostLoad(num_devices, cost)
        self.gates = (DeviceGates(self.q, num_devices, slice_s, self.host) if slice_s > 0
                      else None)
        self.streams = StreamRuntime(self.q, cost, self.events, self._works_on, self._idle)
        self.rollouts = RolloutRuntime(self.q, cost, self.contention, self.events, listener,
                                       self.streams, self.gates, self.host)
        self.works = WorkRuntime(self.q, cost, self.contention, self.events, listener,
                                 self.rollouts.step_lens, num_devices, self.streams.streamed,
                                 self.gates, self.rollouts.step_prompts, self.host)

    def _works_on(self, devices: tuple[int, ...]) -> bool:
        """Whether a compute work runs on any of ``devices`` (a stream server yields to it)."""
        devs = set(devices)
        return any(devs.intersection(w.devices) for w in self.works.works.values())

    def _idle(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        """Those of ``devices`` on which neither a compute work nor an undrained rollout rank
        runs (what an in-tail log-prob server may use)."""
        used = {d for w in self.works.works.values() for d in w.devices}
        used.update(d for task in self.rollouts.tasks.values() for rank in task.ranks
                    if rank.redirect is None and rank.inst.unfinished > 0 for d in rank.devices)
        return tuple(d for d in devices if d not in used)

    def _settle(self) -> None:
        """After an action or event: re-time contended decodes and the work of nodes whose
        busy devices changed (:mod:`.hostload`), pause or resume streaming."""
        self.rollouts.refresh()
        nodes = self.host.take_touched()
        if nodes:
            self.works.retime_host(nodes)
            self.rollouts.retime_host(nodes)
        if self.streams.servers:
            self.streams.poll()

    @property
    def now_s(self) -> float:
        return self.q.now_s

    def busy(self) -> bool:
        """True while a rollout or a work runs."""
        return bool(self.rollouts.tasks or self.works.works)

    def drain_events(self) -> list[Event]:
        """Metric records written since the last call."""
        out = list(self.events)
        self.events.clear()
        return out

    # ------------------------------------------------------------------ actions
    def start_rollout(self, tid: str, pipe: ResolvedPipeline, step: int,
                      devices: tuple[int, ...], tp: int, share: float, kv_mem_bytes: float,
                      chunks: list[list[RequestTruth]], *, first_b: bool = False,
                      stream_devices: tuple[int, ...] = (),
                      tail_logprobs: bool = False) -> None:
        """Start a rollout: rank ``r`` runs ``chunks[r]`` on its TP group of ``devices``, with
        ``kv_mem_bytes`` of KV cache per device (``first_b``, ``stream_devices``,
        ``tail_logprobs``: see :meth:`~.rollout_task.RolloutRuntime.start`)."""
        self.works.rollout_tps[pipe.spec.name] = tp
        self.rollouts.start(tid, pipe, step, devices, tp, share, kv_mem_bytes, chunks,
                            first_b=first_b, stream_devices=stream_devices,
                            tail_logprobs=tail_logprobs)
        self._settle()

    def start_work(self, tid: str, pipe: ResolvedPipeline, step: int, stage: str,
                   devices: tuple[int, ...], share: float) -> None:
        """Start a post-rollout stage or a train-state move."""
        self.works.start(tid, pipe, step, stage, devices, share)
        self._settle()

    def set_share(self, tid: str, share: float, rank: int | None = None) -> None:
        """New compute share of a running work, or of a rollout's rank (``None``: all ranks).

        Raises:
            KeyError: when no task ``tid`` runs.
        """
        if tid in self.works.works:
            self.works.rescale(tid, share)
        elif tid in self.rollouts.tasks:
            self.rollouts.set_share(tid, share, rank)
        else:
            raise KeyError(f"set_share: no running task {tid!r}")
        self._settle()

    def migrate(self, tid: str, src_ranks: tuple[int, ...], dst_rank: int) -> None:
        """Move the unfinished requests of ``src_ranks`` onto ``dst_rank`` (re-prefill there)."""
        self.rollouts.migrate(tid, src_ranks, dst_rank)
        self._settle()

    def regroup(self, tid: str, src_ranks: tuple[int, ...], dst_rank: int) -> None:
        """Resume the unfinished requests of ``dst_rank`` and ``src_ranks`` on one TP group of
        all their devices (sim/rollout_regroup.py)."""
        self.rollouts.regroup(tid, src_ranks, dst_rank)
        self._settle()

    def spread(self, tid: str, devices: tuple[int, ...]) -> None:
        """Grow rollout ``tid`` by ranks on ``devices`` and re-deal its unfinished requests
        (sim/rollout_spread.py)."""
        self.rollouts.spread(tid, devices)
        self._settle()

    def interrupt(self, tid: str) -> None:
        """Abort and resume in place every in-flight request of rollout ``tid``."""
        self.rollouts.interrupt(tid)

    # ------------------------------------------------------------------ clock
    def step(self) -> bool:
        """Process the next event (then re-time contended decodes); False when none is left."""
        entry = self.q.pop()
        if entry is None:
            return False
        handler, *args = entry.payload
        handler(*args)
        self._settle()
        return True
