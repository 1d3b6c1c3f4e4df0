"""The post-rollout stages of a real run: reward, the model passes, weight sync.

What: ``reward`` runs on the pipeline's reward worker; ``old_logprob`` / ``ref_logprob`` /
``actor_update`` run on the device holding the pipeline's train state (moved there first when
the scheduler chose other devices: :class:`~jigsawrl.executors.raycluster.residency.Residency`),
data-parallel over the stage's other devices where the stage allows it (or, for a log-prob pass
whose rows were mostly computed in the rollout's tail, :mod:`.tail`, over the rows left on the
holder alone); ``weight_sync``
publishes the actor's weights as a new version (and writes a checkpoint when due) — engines
load a newer version at the start of their next slice.
"""

from __future__ import annotations

import math
from dataclasses import replace

from jigsawrl.driver.protocol import TaskDone
from jigsawrl.executors.raycluster.callclock import Clocks
from jigsawrl.executors.raycluster.messages import (
    MoveResult,
    PublishRequest,
    RewardResult,
    ShardRequest,
    StageRequest,
    StageResult,
    Timed,
)
from jigsawrl.executors.raycluster.records import Call, CallKind, Pipe, Replay, RunState
from jigsawrl.executors.raycluster.residency import Residency
from jigsawrl.executors.raycluster.rollouts import shard_bounds
from jigsawrl.executors.raycluster.tail import TailPasses
from jigsawrl.scheduler.base import StartStage
from jigsawrl.stages import MODEL_PASSES, Stage
from jigsawrl.tasks.base import reward_error_metrics


class Training:
    """Reward, model passes and weight sync of every pipeline (see the module docstring)."""

    def __init__(self, state: RunState, residency: Residency,
                 tail: TailPasses | None = None) -> None:
        self.state = state
        self.residency = residency
        self.tail = tail  # in-tail log-probs of sync rollouts (tail.py)
        self.clocks = Clocks()  # where each model pass's wall time went (callclock.py)

    # ------------------------------------------------------------------ launches
    def launch_reward(self, pipe: Pipe, a: StartStage, tid: str) -> None:
        ref = pipe.reward.score.remote(a.step, pipe.trajs[a.step])
        pipe.rewards[a.step] = ref
        self.state.track(ref, Call(CallKind.STAGE, pipe.name, a.step, a.stage, (), 0.0, tid))

    def launch_pass(self, pipe: Pipe, a: StartStage, tid: str) -> None:
        """A model pass: on the train-state holder, data-parallel over the stage's other
        devices when the stage allows it (:meth:`helper_devices`)."""
        target = pipe.loc if pipe.loc in a.devices else (a.devices[0] if a.devices else 0)
        host = self.residency.move_to(pipe, target)
        actor = self.state.devs[target].actor
        trajs, rewards = pipe.trajs[a.step], pipe.rewards[a.step]
        others = self.helper_devices(pipe, a.stage, a.devices, target)
        tail = self.tail.take(pipe.name, a.step, a.stage) if self.tail is not None else None
        if tail is not None and others:
            rows = pipe.spec.batch_size * pipe.spec.group_size
            if rows - tail.rows() > math.ceil(rows / (1 + len(others))):
                tail = None  # more rows left than the holder's share: data-parallel is sooner
            else:
                others = ()
        threads = self.state.settings.threads_for(a.share, 1 if others else max(1, len(a.devices)))
        req = StageRequest(pipe.name, a.stage, a.step, threads)
        helpers = None
        if others:
            bounds = shard_bounds(pipe.spec.batch_size * pipe.spec.group_size, 1 + len(others))
            req = replace(req, bounds=tuple(bounds))
            _, payload = actor.dp_export.options(num_returns=2).remote(req, host, trajs, rewards)
            host = None  # dp_export onloaded it
            helpers = [[self.state.devs[d].actor.dp_shard.remote(
                ShardRequest(pipe.name, a.stage, lo, hi, threads), payload)
                for d, (lo, hi) in zip(others, bounds[1:], strict=True)],
                [self.state.devs[d].actor for d in others]]  # for the later PPO epochs
        ref = actor.train_stage.remote(req, host, trajs, rewards, helpers,
                                       [r for r, _ in tail.calls] if tail is not None else None)
        entry = Replay(a.step, a.stage, trajs, rewards)
        pipe.replay.append(entry)
        self.state.track(ref, Call(CallKind.STAGE, pipe.name, a.step, a.stage, (target,),
                                   a.share, tid, helpers=others, worker=target, replay=entry))

    def helper_devices(self, pipe: Pipe, stage: str, devices: tuple[int, ...],
                       target: int) -> tuple[int, ...]:
        """The helpers of a data-parallel stage: the stage's devices other than ``target`` (at
        most one shard per request row), or () where data parallelism does not apply: old
        log-probs skipped by the on-policy shortcut, reference log-probs without a reference
        (those run on the holder alone). An update of several PPO epochs is data-parallel too,
        one round per epoch (``worker_shards.UpdateRounds``), as the simulator costs it."""
        tr = pipe.spec.train
        if len(devices) < 2 or not self.state.settings.data_parallel:
            return ()
        if stage == Stage.OLD_LOGPROB and not tr.recompute_old_logprobs and tr.ppo_epochs == 1:
            return ()
        if stage == Stage.REF_LOGPROB and tr.kl_coef <= 0:
            return ()
        rows = pipe.spec.batch_size * pipe.spec.group_size
        return tuple(d for d in devices if d != target)[:max(0, rows - 1)]

    def launch_sync(self, pipe: Pipe, a: StartStage, tid: str) -> None:
        """Publish the actor's weights (from the device holding the train state, or from its
        host copy without onloading it), beside whatever else runs on that worker."""
        ckpt_dir = self.state.settings.ckpt_dir
        done = pipe.offset + a.step + 1
        every = pipe.spec.train.checkpoint_every
        due = ckpt_dir is not None and (done == pipe.offset + pipe.spec.steps or
                                        bool(every and done % every == 0))
        meta = {"history": [m for _, m in sorted(pipe.metrics.items())]}
        where = pipe.loc if pipe.loc is not None else 0
        host = None if pipe.loc is not None else pipe.host_ref
        req = PublishRequest(pipe.name, done, str(ckpt_dir / pipe.name) if due and ckpt_dir
                             else None, due, meta)
        # beside another pipeline's call, but behind a rebuild of this one's state there
        group = None if self.residency.busy_on(pipe.name, where) else "control"
        info, weights = self.state.devs[where].actor.publish.options(
            num_returns=2, concurrency_group=group).remote(req, host)
        self.state.track(info, Call(CallKind.STAGE, pipe.name, a.step, a.stage, (), 0.0, tid,
                                    weights=weights, worker=where))

    # ------------------------------------------------------------------ results
    def stage_done(self, call: Call, res: Timed) -> None:
        """A task's call returned: its spans, what it produced, and its TaskDone."""
        pipe = self.state.pipes[call.pipeline]
        self.state.span(call, call.stage, res)
        if call.replay is not None:
            call.replay.done = True
        absolute = pipe.offset + call.step
        if isinstance(res, StageResult) and call.stage in MODEL_PASSES:
            self.clocks.add(call.pipeline, call.stage, res.seconds, res.clock)
            # data-parallel helpers: a span on each one's device (one per PPO-epoch round)
            for rank, (dev, helper) in enumerate(zip(call.helpers, res.helpers, strict=False),
                                                 start=1):
                for piece in helper if isinstance(helper, tuple) else (helper,):
                    self.state.span(replace(call, devices=(dev,)), call.stage, piece, rank)
            if call.stage == Stage.ACTOR_UPDATE or res.metrics:  # (a log-prob pass: tail rows)
                pipe.metrics.setdefault(absolute, {}).update(res.metrics)
        elif isinstance(res, RewardResult):
            scores = res.rewards
            pipe.metrics.setdefault(absolute, {}).update(
                {"critic/score/mean": sum(scores) / max(1, len(scores)),
                 **reward_error_metrics(res.infos)})
        elif call.stage == Stage.WEIGHT_SYNC:
            pipe.weights_ref, pipe.version = call.weights, pipe.offset + call.step + 1
            pipe.trajs.pop(call.step, None)
            pipe.rewards.pop(call.step, None)
            if self.tail is not None:
                self.tail.forget(pipe.name, call.step)
        elif isinstance(res, MoveResult):  # the scheduler's offload / onload
            self.residency.record(call, res)
        assert call.tid is not None
        self.state.notes.append(TaskDone(call.tid, call.pipeline, call.step, call.stage,
                                         self.state.now_s))
