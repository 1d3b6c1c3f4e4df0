"""In-tail log-probs on real workers (jigsaw's ``tail_logprobs``; issue 11 item 4, issue 14
item 2): while a sync rollout's tail still runs, the old (and reference) log-probs of its
finished GRPO groups are computed on the devices of its ranks that drained.

What the executor does (the simulator's counterpart is ``sim/stream.py``'s tail mode):

- a rollout started with ``tail_logprobs`` (sync pipelines only) opens here, with the passes
  that apply: old log-probs unless the trainer's on-policy shortcut skips them, reference
  log-probs when the pipeline has a reference (``kl_coef > 0``); with neither, nothing runs;
- after each of its slices, the groups whose every sample finished and were not sent yet go to
  the drained ranks' devices that nothing else uses (no call in flight there, no undrained rank
  of any rollout), one ``tail_pass`` call per device at a time, at most a quarter of the batch
  per call, so that a stage the scheduler starts there later waits at most one short call (the
  simulator's tail server pauses instead: a real call cannot);
- the post-rollout pass of that stage takes the calls' results (``worker_train.py``) and
  computes only the rows left — on the holder alone: where the stage has data-parallel helpers,
  the results are used only if the rows left are no more than the holder's own share of a
  data-parallel pass, otherwise the pass runs data-parallel over every row as before.

A call that fails (its worker died, or it held other weights) costs nothing but its rows, which
the post-rollout pass computes; a dead worker is then replaced as after any call.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from jigsawrl.events import STREAMED_RANK
from jigsawrl.executors.raycluster.messages import TailRequest, TailResult
from jigsawrl.executors.raycluster.records import Call, CallKind, RunState
from jigsawrl.executors.raycluster.rollouts import RolloutRT
from jigsawrl.stages import Stage

log = logging.getLogger(__name__)

CALL_SHARE = 0.25  # at most this fraction of a batch's groups in one call


@dataclass(eq=False)
class StepTail:
    """One step's tail: which passes it computes, the groups sent, and the calls' result refs
    with the rows each covers (kept after the rollout, for its post-rollout passes)."""

    pipeline: str
    old: bool
    ref: bool
    sent: set[int] = field(default_factory=set)  # groups sent
    calls: list[tuple[Any, tuple[int, ...]]] = field(default_factory=list)

    def rows(self) -> int:
        return sum(len(r) for _, r in self.calls)


def group_rows(k: int, g: int, n: int) -> range:
    """The batch rows of GRPO group ``k`` (``g`` rows a group, ``n`` rows in all)."""
    return range(k * g, min(n, (k + 1) * g))


class TailPasses:
    """The in-tail passes of a real run (see the module docstring).

    Args:
        state: the executor's shared state.
        active: the running rollouts (``Rollouts.active``), whose undrained ranks' devices a
            call must not use.
    """

    def __init__(self, state: RunState, active: dict[str, RolloutRT]) -> None:
        self.state = state
        self.active = active
        self.plans: dict[str, StepTail] = {}  # rollout task id -> its step's tail, while it runs
        self.steps: dict[tuple[str, int], StepTail] = {}
        # pipeline -> the workers that built its reference model (a replaced worker is not one)
        self.ref_sent: dict[str, list[Any]] = {}

    def open(self, ro: RolloutRT) -> None:
        """A rollout started with ``tail_logprobs``: plan its passes (none for an async
        pipeline, whose next step's weights may arrive mid-rollout)."""
        spec = self.state.pipes[ro.pipeline].spec
        tr = spec.train
        old = bool(tr.recompute_old_logprobs or tr.ppo_epochs > 1)
        ref = tr.kl_coef > 0
        if spec.mode != "sync" or not (old or ref):
            return
        self.plans[ro.tid] = self.steps[(ro.pipeline, ro.step)] = StepTail(ro.pipeline, old, ref)

    def pump(self, ro: RolloutRT) -> None:
        """Send the finished groups not sent yet to the rollout's idle drained devices."""
        plan = self.plans.get(ro.tid)
        if plan is None:
            return
        if ro.complete or self.active.get(ro.tid) is not ro:
            del self.plans[ro.tid]  # the post-rollout pass computes what was not sent
            return
        g = self.state.pipes[ro.pipeline].spec.group_size
        groups = math.ceil(ro.num_requests / g)
        ready = [k for k in range(groups) if k not in plan.sent and
                 all(i in ro.results for i in group_rows(k, g, ro.num_requests))]
        devices = self._idle(ro)
        if not ready or not devices:
            return
        per = max(1, min(math.ceil(len(ready) / len(devices)), math.ceil(groups * CALL_SHARE)))
        for d in devices:
            take, ready = ready[:per], ready[per:]
            if not take:
                break
            self._send(ro, plan, d, take, g)

    def _idle(self, ro: RolloutRT) -> list[int]:
        """The devices of ``ro``'s drained ranks on which nothing runs (a tail call in flight
        included: one at a time per device)."""
        used: set[int] = set()
        for c in self.state.calls.values():
            used.update(c.devices)
            used.update(c.helpers)
            if c.worker is not None:
                used.add(c.worker)
        for other in self.active.values():
            for r in other.ranks:
                if not r.done:
                    used.update(r.devices)
        out = [d for r in ro.ranks if r.done for d in r.devices]
        return [d for d in dict.fromkeys(out) if d not in used]

    def _send(self, ro: RolloutRT, plan: StepTail, device: int, groups: list[int],
              g: int) -> None:
        pipe = self.state.pipes[ro.pipeline]
        rows = tuple(i for k in groups for i in group_rows(k, g, ro.num_requests))
        seqs = tuple((list(t.prompt_ids), list(t.response_ids), list(t.response_mask))
                     for t in (ro.results[i][0] for i in rows))
        actor = self.state.devs[device].actor
        built = self.ref_sent.setdefault(ro.pipeline, [])
        need_ref = plan.ref and not any(a is actor for a in built)
        req = TailRequest(ro.pipeline, ro.step, pipe.version,
                          self.state.settings.threads_for(1.0, 1), rows, seqs, plan.old, plan.ref)
        ref = actor.tail_pass.remote(req, pipe.restore_ref if need_ref else None)
        if need_ref:
            built.append(actor)
        plan.sent.update(groups)
        plan.calls.append((ref, rows))
        stage = Stage.OLD_LOGPROB if plan.old else Stage.REF_LOGPROB
        self.state.track(ref, Call(CallKind.TAIL, ro.pipeline, ro.step, stage, (device,), 1.0,
                                   rollout=ro, worker=device))
        log.debug("%s: in-tail log-probs of %d groups on device %d", ro.tid, len(groups),
                  device)

    def done(self, call: Call, res: TailResult) -> None:
        """A call returned (no longer tracked: its device is free): its spans (old, then
        reference), then the next groups."""
        from dataclasses import replace

        tokens = res.tokens // max(1, (res.old is not None) + (res.ref is not None))
        if res.old is not None:
            self.state.span(call, Stage.OLD_LOGPROB, replace(res, t_end=res.t_mid, tokens=tokens),
                            STREAMED_RANK)
        if res.ref is not None:
            self.state.span(replace(call, stage=Stage.REF_LOGPROB), Stage.REF_LOGPROB,
                            replace(res, t_start=res.t_mid, tokens=tokens), STREAMED_RANK)
        if call.rollout is not None:
            self.pump(call.rollout)

    def lost(self, call: Call) -> None:
        """A call failed: its rows are computed after the rollout (the holder skips it)."""
        if call.worker is not None:  # whether it built the reference there is unknown
            actor = self.state.devs[call.worker].actor
            self.ref_sent[call.pipeline] = [a for a in self.ref_sent.get(call.pipeline, [])
                                            if a is not actor]

    def take(self, pipeline: str, step: int, stage: str) -> StepTail | None:
        """The step's tail calls if they computed ``stage``'s log-probs (None otherwise)."""
        st = self.steps.get((pipeline, step))
        if st is None or not st.calls:
            return None
        wanted = st.old if stage == Stage.OLD_LOGPROB else st.ref
        return st if wanted else None

    def forget(self, pipeline: str, step: int | None = None) -> None:
        """Drop a step's results (after its weight sync), or every step of a failed pipeline."""
        for key in [k for k in self.steps if k[0] == pipeline and step in (None, k[1])]:
            del self.steps[key]
        if step is None:
            for tid in [t for t, p in self.plans.items() if p.pipeline == pipeline]:
                del self.plans[tid]
