"""StreamRL's in-step streaming: finished groups go through the trainer while the rollout runs.

StreamRL (``reference/peers.md``, "dynamic-batch pipelining") does not wait for the whole batch:
as GRPO groups finish, its training pool computes their old (and reference) log-probs and the
actor's forward-backward, so that when the last sample is generated only the last groups and
the optimizer step remain. A rollout started with ``stream_devices`` gets a
:class:`StreamServer` here, which models it:

- Finished groups queue up; when the server is idle it takes *every* queued group as one
  micro-batch (dynamic batching) and runs its passes in verl's order — old log-prob, reference
  log-prob (with a reference model), actor forward-backward (only with one PPO epoch: more
  epochs need the whole batch) — each pass one call on the stream devices at full share, timed
  by the truth cost model like the stage it stands for.
- The server yields to explicit work: while any compute work runs on one of its devices (the
  training of an earlier step, another pipeline's stage on a shared pool), it pauses and
  resumes when they are idle. So it only uses time the training pool would have been idle.
- When the rollout finishes, the pass in flight is abandoned (its elapsed part is recorded as a
  span but not credited); the post-rollout stages then cost only the sequences not streamed
  (:meth:`StreamRuntime.streamed`): old and reference log-probs over the rest, and the actor
  update over the rest plus its optimizer step.

**In-tail log-probs** (jigsaw's ``tail_logprobs``, issue 11 item 4) reuse the server in *tail*
mode: the trainer is the rollout's own devices, and a pass runs only on those of them nothing
else uses — no compute work and no undrained rollout rank, of any pipeline — so that only ranks
that drained (and were not given to other work) compute the old (and reference) log-probs of the
groups that finished, never the actor's update. A pass runs on the devices idle when it starts;
when one of them gets work it pauses, and resumes on the devices idle then (its remaining
fraction re-priced on their count). Each pass also pays loading the model's weights onto its
devices (the bf16 parameters over the host link, :meth:`~jigsawrl.costmodel.protocol.
CostModelProtocol.host_transfer_time_s`) once per device set and model (actor, reference):
the drained rank's engine holds the rollout's copy, not the trainer's. The old log-probs are
those the post-rollout pass would compute: the weights do not change during the rollout.

Simplifications, each small: the actor's per-group part is priced as the update of those
tokens minus the update of one token (the optimizer step and fixed overhead are charged once,
in the final update stage); a streamed pass reserves no activation memory in the driver's
accounting (it never runs beside other work on its devices, and a training pool is sized to
hold its state plus one micro-batch); it demands no memory bandwidth (training pools run no
decodes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.events import STREAMED_RANK, Event, Span
from jigsawrl.sim.batching import Finished
from jigsawrl.sim.kernel import PRIO_FINISH, Entry, EventQueue
from jigsawrl.stages import Stage
from jigsawrl.workload.experiment import ResolvedPipeline


def streamed_stages(pipe: ResolvedPipeline) -> tuple[Stage, ...]:
    """The passes a group can go through before the batch is complete, in verl's order."""
    out = [Stage.OLD_LOGPROB]
    if pipe.spec.use_ref:
        out.append(Stage.REF_LOGPROB)
    if pipe.spec.train.ppo_epochs == 1:
        out.append(Stage.ACTOR_UPDATE)
    return tuple(out)


def tail_stages(pipe: ResolvedPipeline) -> tuple[Stage, ...]:
    """The passes an in-tail server runs over finished groups: the log-probs only."""
    return tuple(s for s in streamed_stages(pipe) if s != Stage.ACTOR_UPDATE)


def weight_load_s(cost: CostModelProtocol, pipe: ResolvedPipeline, n: int) -> float:
    """Seconds to load one copy of the model's bf16 weights, sharded over ``n`` devices."""
    return cost.host_transfer_time_s(cost.rollout_weight_bytes(pipe.model, 1), max(1, n))


def pass_seconds(cost: CostModelProtocol, pipe: ResolvedPipeline, stage: str, n: int,
                 lens: list[int]) -> tuple[float, float]:
    """Truth seconds and FLOPs of one streamed pass of ``stage`` over sequences ``lens``."""
    m = pipe.model
    computed = cost.pass_tokens(lens, n, pipe.spec.train.micro_batch_size)
    call = cost.dispatch_time_s(m, stage, n)
    if stage == Stage.ACTOR_UPDATE:
        body = max(0.0, cost.train_time_s(m, n, computed) - cost.train_time_s(m, n, 1))
        return body + call, cost.train_flops(m, sum(lens))
    return cost.logprob_time_s(m, n, computed) + call, cost.logprob_flops(m, sum(lens))


@dataclass(slots=True, eq=False)
class StreamServer:
    """The streaming trainer of one running rollout (see the module docstring)."""

    pipe: ResolvedPipeline
    step: int
    devices: tuple[int, ...]
    queue: list[list[int]] = field(default_factory=list)  # finished groups' sequence lengths
    batch: list[int] = field(default_factory=list)  # the micro-batch in flight
    todo: list[Stage] = field(default_factory=list)  # its passes still to run
    left_s: float = 0.0  # seconds left of the pass in flight
    pass_s: float = 0.0
    flops: float = 0.0
    since_s: float = 0.0
    entry: Entry | None = None
    credited: dict[Stage, Counter[int]] = field(default_factory=dict)
    tail: bool = False  # in-tail log-probs: passes on the rollout's idle devices only
    active: tuple[int, ...] = ()  # tail: the devices the pass in flight runs on
    load_s: float = 0.0  # tail: the weight load the pass in flight began with
    loaded: set[tuple[Stage, tuple[int, ...]]] = field(default_factory=set)  # tail: weights


class StreamRuntime:
    """Runs stream servers on the event queue.

    Args:
        q: the event queue.
        cost: the truth cost model.
        events: where spans go.
        busy: whether a compute work runs on any of the given devices.
        idle: the given devices on which neither a compute work nor an undrained rollout rank
            runs (what a tail server may use; None: no tail servers).
    """

    def __init__(self, q: EventQueue, cost: CostModelProtocol, events: list[Event],
                 busy: Callable[[tuple[int, ...]], bool],
                 idle: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None) -> None:
        self.q = q
        self.cost = cost
        self.events = events
        self.busy = busy
        self.idle = idle
        self.servers: dict[str, StreamServer] = {}
        # (pipeline, step, stage) -> the sequence lengths already computed by streaming
        self._streamed: dict[tuple[str, int, str], Counter[int]] = {}

    def open(self, tid: str, pipe: ResolvedPipeline, step: int, devices: tuple[int, ...],
             *, tail: bool = False) -> None:
        """Stream the finished groups of rollout ``tid`` into a trainer on ``devices``
        (``tail``: the rollout's own devices, log-probs only, on those idle: module docstring).

        Raises:
            ValueError: ``tail`` without the ``idle`` query.
        """
        if tail and self.idle is None:
            raise ValueError("a tail server needs the runtime's idle-devices query")
        self.servers[tid] = StreamServer(pipe, step, devices, tail=tail)

    def group_finished(self, tid: str, group: list[Finished]) -> None:
        """A group of rollout ``tid`` finished: queue it (and start a pass if idle)."""
        srv = self.servers.get(tid)
        if srv is None:
            return
        srv.queue.append([f.truth.total_tokens for f in group])
        if not srv.tail:  # a tail server starts in poll(), once the rank's state is settled
            self._kick(srv)

    def close(self, tid: str) -> None:
        """Rollout ``tid`` finished: abandon the pass in flight, keep what was computed."""
        srv = self.servers.pop(tid, None)
        if srv is None:
            return
        if srv.entry is not None:
            self.q.cancel(srv.entry)
            srv.entry = None
            self._emit(srv)
        for stage, lens in srv.credited.items():
            self._streamed[(srv.pipe.spec.name, srv.step, stage)] = lens

    def streamed(self, pipeline: str, step: int, stage: str) -> Counter[int]:
        """The sequence lengths of ``pipeline``'s ``step`` already through ``stage``."""
        return self._streamed.get((pipeline, step, stage), Counter())

    def poll(self) -> None:
        """Pause servers whose devices got work, resume those whose devices are free again."""
        for srv in self.servers.values():
            blocked = self._blocked(srv)
            if blocked and srv.entry is not None:
                self.q.cancel(srv.entry)
                srv.entry = None
                srv.left_s -= self.q.now_s - srv.since_s
                self._emit(srv)
            elif not blocked:
                self._kick(srv)

    # ------------------------------------------------------------------ internals
    def _blocked(self, srv: StreamServer) -> bool:
        """A plain server: work on any of its devices. A tail server's pass in flight: one of
        its devices is no longer idle (one without a pass: no device of its rollout is free)."""
        if not srv.tail:
            return self.busy(srv.devices)
        if srv.entry is not None:
            return len(self._free(srv, srv.active)) < len(srv.active)
        return not self._free(srv, srv.devices)

    def _free(self, srv: StreamServer, devices: tuple[int, ...]) -> tuple[int, ...]:
        """Those of ``devices`` idle (``idle``) and not under another server's pass in flight.

        Why the second: the cluster does not see the stream's passes, so two rollouts whose
        drained ranks shared a device — one pipeline's rank drained there, another's rollout
        ran there since and just ended — both found it idle at the same instant and each put a
        pass on it (device over its compute: tests/test_invariants.py, seed 177)."""
        assert self.idle is not None
        taken = {d for other in self.servers.values() if other is not srv
                 and other.entry is not None
                 for d in (other.active if other.tail else other.devices)}
        return tuple(d for d in self.idle(devices) if d not in taken)

    def _kick(self, srv: StreamServer) -> None:
        if srv.entry is not None or self._blocked(srv):
            return
        if not srv.todo:
            if not srv.queue:
                return
            srv.batch = [n for g in srv.queue for n in g]
            srv.queue.clear()
            srv.todo = list(tail_stages(srv.pipe) if srv.tail else streamed_stages(srv.pipe))
            srv.left_s = -1.0
        if srv.tail:
            self._place_tail(srv)
        elif srv.left_s < 0:  # a new pass: price it
            srv.pass_s, srv.flops = pass_seconds(self.cost, srv.pipe, srv.todo[0],
                                                 len(srv.devices), srv.batch)
            srv.left_s = srv.pass_s
        srv.since_s = self.q.now_s
        srv.entry = self.q.schedule(self.q.now_s + srv.left_s, (self._on_pass_end, srv),
                                    PRIO_FINISH)

    def _place_tail(self, srv: StreamServer) -> None:
        """A tail server's pass on the devices idle now: a new pass priced on them (with the
        weight load if they do not hold this model yet), a paused one re-priced by the
        fraction left."""
        assert self.idle is not None
        frac = 1.0  # of the pass's body still to run
        if srv.left_s >= 0:  # paused: its body's part left (a load cut short is lost)
            body = srv.pass_s - srv.load_s
            if srv.left_s > body:
                srv.loaded.discard((srv.todo[0], srv.active))
            frac = min(srv.left_s, body) / body if body > 0 else 0.0
        devices = self._free(srv, srv.devices)
        n, stage = len(devices), srv.todo[0]
        body_s, srv.flops = pass_seconds(self.cost, srv.pipe, stage, n, srv.batch)
        srv.load_s = (0.0 if (stage, devices) in srv.loaded
                      else weight_load_s(self.cost, srv.pipe, n))
        srv.loaded.add((stage, devices))
        srv.active = devices
        srv.pass_s = body_s + srv.load_s
        srv.left_s = frac * body_s + srv.load_s

    def _on_pass_end(self, srv: StreamServer) -> None:
        srv.entry = None
        srv.left_s = 0.0
        self._emit(srv)
        stage = srv.todo.pop(0)
        srv.credited.setdefault(stage, Counter()).update(srv.batch)
        srv.left_s = -1.0
        self._kick(srv)

    def _emit(self, srv: StreamServer) -> None:
        """The span of the pass in flight since it last (re)started (its part of the pass's
        FLOPs and tokens)."""
        now = self.q.now_s
        if now <= srv.since_s or not srv.todo:
            return
        frac = (now - srv.since_s) / srv.pass_s if srv.pass_s > 0 else 1.0
        tokens = round(sum(srv.batch) * frac)
        self.events.append(Span(srv.pipe.spec.name, srv.step, srv.todo[0], STREAMED_RANK,
                                srv.active if srv.tail else srv.devices, srv.since_s, now, 1.0,
                                srv.flops * frac, tokens))
