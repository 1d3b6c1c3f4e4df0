"""Training side of the cost model: log-prob and update passes, weight sync, host moves, reward.

The passes are FSDP / ZeRO-3 over ``n_devices`` data-parallel devices: compute at the MFU of the
model's size (``CostParams.train_mfu`` / ``logprob_mfu``, fitted to the GPU anchors), parameter
all-gathers and gradient reduce-scatters per micro-batch (partly hidden behind compute), a
memory-bound Adam step. The deployment (:mod:`.deploy`) adds PPO's critic to the update
(:meth:`TrainCosts.critic_time_s`) and verl's host offload transfers to each call
(:meth:`TrainCosts.offload_time_s`); :meth:`TrainCosts.dispatch_time_s` charges those transfers
and what a pool of worker processes costs beside compute (0 unless ``jigsawrl profile`` measured
it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jigsawrl.costmodel.core import CostCore, check_share
from jigsawrl.costmodel.deploy import ACTOR_PARAM_BYTES, ADAM_STATE_BYTES, REF_PARAM_BYTES
from jigsawrl.costmodel.roofline import (
    FP32_BYTES,
    logprob_flops,
    overlap_comm,
    ring_collective_s,
    train_flops,
)
from jigsawrl.stages import Stage
from jigsawrl.workload.buckets import length_buckets
from jigsawrl.workload.models import ModelSpec

# Adam step per parameter: read fp32 master, m, v, fp32 grad (16 B); write master, m, v (12 B)
# and the bf16 working copy (2 B).
ADAM_BYTES_PER_PARAM = 30.0
# FSDP gradient reduce-scatter in fp32 (verl's default reduce_dtype), params gathered in bf16.
GRAD_REDUCE_BYTES_PER_PARAM = 4.0
# Stages whose call to the worker is already in their own cost (reward: ``reward_overhead_s``;
# host moves: ``host_transfer_latency_s``), so dispatch adds nothing to them.
CALL_IN_OWN_COST: frozenset[Stage] = frozenset({Stage.REWARD, Stage.OFFLOAD, Stage.ONLOAD})
# fp32 weight (or gradient) moves between data-parallel worker processes per pass.
DP_WEIGHT_MOVES: dict[Stage, int] = {Stage.OLD_LOGPROB: 1, Stage.REF_LOGPROB: 1,
                                     Stage.ACTOR_UPDATE: 2}


class TrainCosts(CostCore):
    """Log-prob, update, weight sync, host transfer, reward and dispatch times (and FLOPs)."""

    def _micro_batches(self, n_devices: int, tokens: float) -> int:
        per = n_devices * self.params.train_micro_batch_tokens
        return max(1, math.ceil(tokens / per))

    def pass_tokens(self, seq_lens: Sequence[int], n_devices: int, micro_batch_rows: int,
                    prompt_lens: Sequence[int] | None = None, group_size: int = 1) -> int:
        """The tokens a log-prob or update pass over sequences of ``seq_lens`` computes.

        The real tokens, unless ``train_pads_rows``: then the rows are split into ``n_devices``
        contiguous data-parallel shards (as the Ray executor does), each shard into micro-batches
        of ``micro_batch_rows`` padded to their longest row, and the pass costs ``n_devices``
        times the largest shard's padded tokens (the shards run in parallel; the slowest ends
        the stage), so that ``logprob_time_s(model, n_devices, tokens)`` is that shard's time.

        With ``train_shares_prompt`` and the rows' ``prompt_lens`` (rows in GRPO groups of
        ``group_size`` consecutive rows), a micro-batch computes its distinct prompts (padded
        to its longest prompt) and its responses in the engine's length buckets
        (:func:`~jigsawrl.workload.buckets.length_buckets`), as the shared-prompt forward does.
        """
        if not seq_lens:
            return 0
        rows = len(seq_lens)
        prompts = prompt_lens if self.params.train_shares_prompt else None
        if prompts is not None and len(prompts) != rows:
            raise ValueError(f"{len(prompts)} prompt lengths for {rows} rows")
        if not self.params.train_pads_rows:
            if prompts is None:
                return int(sum(seq_lens))
            # every group's prompt once, every response
            return int(sum(prompts[::max(1, group_size)]) + sum(seq_lens) - sum(prompts))
        shards = max(1, min(n_devices, rows))
        base, extra = divmod(rows, shards)
        step = max(1, micro_batch_rows)
        start, widest = 0, 0
        for i in range(shards):
            stop = start + base + (1 if i < extra else 0)
            cut = [(lo, min(lo + step, stop)) for lo in range(start, stop, step)]
            if prompts is None:
                part = sum((hi - lo) * max(seq_lens[lo:hi]) for lo, hi in cut)
            else:
                shared = [shared_prompt_positions(seq_lens, prompts, lo, hi, group_size)
                          for lo, hi in cut]
                # forward calls beyond a profiled pass's two (its prompts, one bucket)
                calls = sum(1 + buckets for _, buckets in shared) - 2
                part = int(sum(pos for pos, _ in shared)
                           + max(0, calls) * self.params.bucket_overhead_tokens)
            widest = max(widest, part)
            start = stop
        return widest * n_devices

    def logprob_time_s(self, model: ModelSpec, n_devices: int, tokens: int, share: float = 1.0,
                       *, noise: float | None = None) -> float:
        """Forward-only log-prob pass over ``tokens`` tokens, FSDP-sharded over ``n_devices``.

        Compute at ``CostParams.logprob_mfu`` of peak for the model's size, plus one bf16
        parameter all-gather per micro-batch (partly hidden behind compute, ``comm_overlap``).
        """
        check_share(share)
        if tokens <= 0:
            return 0.0
        return self._out(self._logprob_s(model, n_devices, tokens, share), noise)

    def _logprob_s(self, model: ModelSpec, n_devices: int, tokens: float, share: float) -> float:
        compute = logprob_flops(model, tokens) / (self.logprob_rate(model) * share * n_devices)
        gather = ring_collective_s(model.weight_bytes(), n_devices, self._link_bw(n_devices),
                                   self.params.collective_step_latency_s)
        comm = self._micro_batches(n_devices, tokens) * gather
        return overlap_comm(compute, comm, self.params.comm_overlap) + self.params.logprob_overhead_s

    def train_time_s(self, model: ModelSpec, n_devices: int, tokens: int, share: float = 1.0,
                     *, noise: float | None = None) -> float:
        """Forward + backward + optimizer step(s) over ``tokens`` tokens on ``n_devices``.

        ZeRO-3/FSDP: compute at ``CostParams.train_mfu`` of peak for the model's size; per
        micro-batch two bf16 parameter all-gathers (forward, backward) and one fp32 gradient
        reduce-scatter, over NVLink inside a node and the NIC across nodes; then
        ``optimizer_steps`` memory-bound Adam steps over the local shard. With a critic in the
        deployment, its values pass and update are added (:meth:`critic_time_s`).
        """
        check_share(share)
        if tokens <= 0:
            return 0.0
        t = self._update_s(model, n_devices, tokens, share)
        if self.deployment.critic:
            t += sum(self.critic_time_s(model, n_devices, tokens, share))
        return self._out(t, noise)

    def _update_s(self, model: ModelSpec, n_devices: int, tokens: float, share: float) -> float:
        p = self.params
        compute = train_flops(model, tokens) / (self.train_rate(model) * share * n_devices)
        link = self._link_bw(n_devices)
        lat = p.collective_step_latency_s
        per_micro = (2.0 * ring_collective_s(model.weight_bytes(), n_devices, link, lat)
                     + ring_collective_s(GRAD_REDUCE_BYTES_PER_PARAM * model.num_params,
                                         n_devices, link, lat))
        comm = self._micro_batches(n_devices, tokens) * per_micro
        adam = ADAM_BYTES_PER_PARAM * model.num_params / n_devices / self._bw(share)
        t = overlap_comm(compute, comm, p.comm_overlap) + p.optimizer_steps * adam
        return t + p.train_overhead_s

    def critic_time_s(self, model: ModelSpec, n_devices: int, tokens: int,
                      share: float = 1.0) -> tuple[float, float]:
        """PPO's critic: (values forward, critic update) over ``tokens`` tokens, no noise.

        The critic has the actor's shape (verl's PPO examples start it from the actor's model)
        and is priced like it: a forward pass and an update at the same size curves. What
        :meth:`train_time_s` adds when the deployment has a critic (the scheduler has no critic
        stages, so both run inside the actor-update stage: a simplification of the timeline,
        not of the step time).
        """
        check_share(share)
        if tokens <= 0:
            return 0.0, 0.0
        return (self._logprob_s(model, n_devices, tokens, share),
                self._update_s(model, n_devices, tokens, share))

    def weight_sync_time_s(self, model: ModelSpec, n_devices: int, tp: int = 1, *,
                           noise: float | None = None) -> float:
        """Trainer (FSDP over ``n_devices``) -> colocated rollout engines of TP size ``tp``.

        Each device all-gathers the full bf16 weights layer by layer, keeps its TP slice and
        copies it into the engine (read + write at HBM speed), plus a fixed overhead. A worker
        pool whose weight sync was measured whole (``CostParams.weight_sync_s``): that.
        """
        if self.params.weight_sync_s > 0.0:
            return self._out(self.params.weight_sync_s, noise)
        w = model.weight_bytes()
        gather = ring_collective_s(w, n_devices, self._link_bw(n_devices),
                                   self.params.collective_step_latency_s)
        load = 2.0 * w / tp / self._hbm_rate
        return self._out(gather + load + self.params.weight_sync_overhead_s, noise)

    def host_transfer_time_s(self, nbytes: float, n_devices: int = 1, *,
                             noise: float | None = None) -> float:
        """Offload or onload of ``nbytes`` over the host link, ``nbytes / n_devices`` per device."""
        if nbytes <= 0:
            return 0.0
        per_device = nbytes / max(1, n_devices)
        t = per_device / self.accel.host_link_bytes_per_s + self.params.host_transfer_latency_s
        return self._out(t, noise)

    def dispatch_time_s(self, model: ModelSpec, stage: str, n_devices: int,
                        rounds: int = 1) -> float:
        """What ``stage`` costs beside its compute: the deployment's host offload transfers
        (:meth:`offload_time_s`), and what a worker pool adds — the call to the worker, and
        the fp32 weights moved to data-parallel helpers (update: and the gradients back) or to
        the rollout engines (weight sync); see ``CostParams.call_overhead_s``, 0 by default.
        ``rounds``: the pool's part is paid that many times (a data-parallel update of several
        PPO epochs calls its helpers once per epoch with that epoch's weights). Reward
        (``reward_overhead_s``) and host moves (``host_transfer_latency_s``) have their call in
        their own cost already."""
        if stage in CALL_IN_OWN_COST:
            return 0.0
        offload = self.offload_time_s(model, stage, n_devices)
        return offload + max(1, rounds) * self._pool_time_s(model, stage, n_devices)

    def _pool_time_s(self, model: ModelSpec, stage: str, n_devices: int) -> float:
        p = self.params
        if stage == Stage.WEIGHT_SYNC and p.weight_sync_s > 0.0:
            return 0.0  # the call and the move are in the measured weight sync
        if stage == Stage.WEIGHT_SYNC:
            moves = 1
        elif n_devices >= 2:
            moves = DP_WEIGHT_MOVES.get(stage, 0)
        else:
            moves = 0
        if moves == 0 or p.worker_link_bytes_per_s <= 0:
            return p.call_overhead_s
        per_move = (p.worker_link_latency_s
                    + model.weight_bytes(FP32_BYTES) / p.worker_link_bytes_per_s)
        return p.call_overhead_s + moves * per_move

    def offload_time_s(self, model: ModelSpec, stage: str, n_devices: int) -> float:
        """Host <-> device transfers the deployment's offload adds to one call of ``stage``.

        Per device, at ``CostParams.offload_bytes_per_s`` (plus ``host_transfer_latency_s`` per
        transfer): with ``param_offload`` the actor's fp32 shard is loaded and offloaded around
        the old log-prob, the update and the weight sync; with ``optimizer_offload`` Adam's fp32
        m and v around the update; with ``ref_param_offload`` the reference's bf16 shard is
        copied in once per micro-batch of the ref pass (FSDP CPU offload; nothing to copy back).
        No noise: :meth:`dispatch_time_s` is deterministic.
        """
        dep, p = self.deployment, self.params
        n = max(1, n_devices)
        moves: list[float] = []  # bytes per device of each transfer
        if dep.param_offload and stage in (Stage.OLD_LOGPROB, Stage.ACTOR_UPDATE,
                                           Stage.WEIGHT_SYNC):
            moves += [ACTOR_PARAM_BYTES * model.num_params / n] * 2
        if dep.optimizer_offload and stage == Stage.ACTOR_UPDATE:
            moves += [ADAM_STATE_BYTES * model.num_params / n] * 2
        if dep.ref_param_offload and stage == Stage.REF_LOGPROB:
            moves += [REF_PARAM_BYTES * model.num_params / n] * dep.ref_micro_batches(n)
        return sum(moves) / p.offload_bytes_per_s + len(moves) * p.host_transfer_latency_s

    def reward_time_s(self, num_samples: int, *, noise: float | None = None) -> float:
        """Rule-based reward on CPU: a fixed overhead plus a constant per sample."""
        if num_samples <= 0:
            return 0.0
        p = self.params
        return self._out(p.reward_overhead_s + p.reward_s_per_sample * num_samples, noise)

    # ---------------------------------------------------------------- FLOPs (for MFU)

    def logprob_flops(self, model: ModelSpec, tokens: int) -> float:
        return logprob_flops(model, tokens)

    def train_flops(self, model: ModelSpec, tokens: int) -> float:
        return train_flops(model, tokens)


def shared_prompt_positions(seq_lens: Sequence[int], prompt_lens: Sequence[int], lo: int,
                            hi: int, group_size: int) -> tuple[int, int]:
    """``(positions, buckets)`` of the shared-prompt forward over rows ``lo:hi`` (one
    micro-batch): each group's prompt once (padded to the longest prompt), then the responses in
    length buckets, one forward call each after the prompts' call."""
    g = max(1, group_size)
    heads = len({i // g for i in range(lo, hi)})
    prompts = heads * max(prompt_lens[lo:hi])
    resp = [max(1, seq_lens[i] - prompt_lens[i]) for i in range(lo, hi)]
    groups = length_buckets(resp)
    return prompts + sum(len(b) * max(resp[j] for j in b) for b in groups), len(groups)
