"""Roofline pieces of the cost model: FLOP counts, efficiencies, and communication times.

Why a roofline: the schedulers need to know which sub-stages are compute-bound (prefill, log-prob,
actor update) and which are memory-bound (small-batch decode), and how each slows down on a share
of the device. A roofline ``time = max(flops / compute rate, bytes / memory rate) + overhead``
gives both from public hardware numbers (``workload/accelerators.py``) and public model shapes
(``workload/models.py``), until ``jigsawrl profile`` measures real tables.

The efficiencies and overheads in :class:`CostParams` are either *assumptions* (each one says so
and why) or **fitted** to the published verl runs of ``reference/gpu-anchors.md`` by ``jigsawrl
bench fidelity`` (each one names the anchors it came from; ``docs/FIDELITY.md`` has the fit and
its leave-one-out error); the hardware peaks they scale come from datasheets.
"""

from __future__ import annotations

from dataclasses import dataclass

from jigsawrl.workload.models import ModelSpec

FP32_BYTES = 4


# Lowest MFU the size curve gives (a guard for tiny models far below the anchors' sizes).
MFU_FLOOR = 0.01


@dataclass(frozen=True, slots=True)
class CostParams:
    """Efficiencies and overheads of the cost model. Every default is a documented assumption or
    a constant fitted to the GPU anchors (``FITTED``, naming its anchors; ``docs/FIDELITY.md``).

    Efficiencies are fractions of the datasheet peak (dense bf16 FLOP/s, HBM bytes/s) that real
    kernels reach. ``jigsawrl profile`` measures them on a CPU; the GPU values are fitted to
    published runs or assumed.
    """

    # Prefill is large GEMMs: well-tuned serving engines reach ~50-60% of dense peak on H100
    # (assumption, in line with published vLLM/SGLang prefill MFU figures).
    prefill_eff: float = 0.55
    # Decode GEMMs at large batch are skinnier and reach less of peak (assumption).
    decode_compute_eff: float = 0.5
    # Achievable fraction of datasheet HBM bandwidth for weight/KV streaming (assumption: memcpy /
    # STREAM-like kernels reach ~80-90% on H100/A100; decode kernels a bit less).
    hbm_bw_eff: float = 0.8
    # Achievable fraction of HBM bandwidth when decode attention streams the KV cache (paged
    # attention over many sequences reaches less of it than weight streaming). FITTED: anchors
    # A, B, D, H, lab (their generation times, jointly with eager_iter_overhead_s_per_layer;
    # H, a long-context run whose decode streams ~25 GB of KV per iteration, weighs most).
    # None: the same as hbm_bw_eff (the CPU-worker parameters and profiles).
    kv_bw_eff: float | None = 0.473
    # Fraction of SMs that already saturates HBM bandwidth (assumption, NOT measured on a GPU:
    # memory-bound kernels reach peak bandwidth with ~35-50% of the SMs; used as bw_frac(s) =
    # min(1, s / s_sat)). It sets how cheap co-location looks: docs/FIDELITY.md gives the range.
    s_sat: float = 0.4
    # Fixed per engine iteration with CUDA graphs: CPU scheduling, sampling, the graph replay.
    # From the inference-server measurement of reference/gpu-anchors.md ("Decode speed"): Qwen3-8B
    # under vLLM on one H100 takes 7.28 ms per output token at concurrency 1; the weights at
    # hbm_bw_eff take 6.11 ms of it, leaving ~1.2 ms (not fitted to the RL anchors).
    iter_overhead_s: float = 1.2e-3
    # Per running sequence per iteration: detokenisation, stop checks, output processing
    # (assumption: ~5 us per sequence in a vLLM-v1-style engine).
    iter_overhead_per_seq_s: float = 5e-6
    # Decode without CUDA graphs (rollout.enforce_eager): each layer's kernels are launched from
    # Python on every iteration; cost per layer per iteration. FITTED: anchors A, B, D (their
    # eager generation times, jointly with kv_bw_eff; docs/FIDELITY.md). verl's own example of
    # 85 s eager vs 62 s with graphs is a ratio of the same kind.
    eager_iter_overhead_s_per_layer: float = 5.04e-4
    # One small all-reduce inside a node (custom / NVLS all-reduce, latency-dominated)
    # (assumption: ~8 us; NCCL small-message all-reduce on NVLink is ~5-20 us).
    allreduce_latency_s: float = 8e-6
    # Per ring step latency of a collective (assumption: ~10 us intra-node, used for FSDP).
    collective_step_latency_s: float = 1e-5
    # Highest MFU a training-side pass reaches: the caps of the size curve below (the makespan
    # bound reads train_eff as the fastest training rate). Assumptions, not fitted: FSDP / ZeRO-3
    # training of dense 1-30B models reaches ~35-45% of peak in verl and Megatron reports (and
    # 0.25-0.37 for 7B-class in verl logs, reference/gpu-anchors.md); forward-only passes, like
    # prefill, ~0.6.
    train_eff: float = 0.4
    logprob_eff: float = 0.6
    # MFU of the actor update (6 FLOPs per parameter per token) as a power law of the model's
    # size: mfu(P) = min(train_eff, at_1b * (P / 1e9) ** exponent). Small models are overhead-
    # and communication-bound (verl logs 0.06-0.07 at 0.5-1B); 7B-class reach 0.25-0.37.
    # FITTED: anchors A, B, D, H, lab (their update, old log-prob and ref times, jointly with the
    # ratio and the offload bandwidth below). None: flat at train_eff (the CPU-worker
    # parameters and profiles). A floor below which the MFU stops falling was tried: the
    # anchors do not constrain it (fitted to ~0.01), so it is not a parameter.
    train_mfu_at_1b: float | None = 0.0772
    train_mfu_exponent: float = 0.709
    # A forward-only log-prob pass (2 FLOPs per parameter per token) reaches this many times the
    # update's MFU, capped at logprob_eff (no backward, no optimizer, larger micro-batches).
    # FITTED with the curve above.
    logprob_mfu_ratio: float = 1.43
    # Fraction of FSDP communication hidden behind compute by prefetching (assumption).
    comm_overlap: float = 0.7
    # Tokens of one training micro-batch per device (verl's ppo_max_token_len_per_gpu default,
    # 16384); FSDP all-gathers the parameters once per micro-batch forward and backward.
    train_micro_batch_tokens: int = 16384
    # Optimizer steps per train_time_s call (mini-batches per update; assumption: one).
    optimizer_steps: int = 1
    # Devices per node: collectives over more devices use the inter-node link
    # (DGX/HGX H100 and A100 have 8; the paper's A100 cluster has 4: set it per cluster).
    devices_per_node: int = 8
    # Fixed cost of one weight sync: engine wake-up, per-tensor bookkeeping, resharding
    # (assumption: ~0.5 s, verl colocated syncs of small models take seconds).
    weight_sync_overhead_s: float = 0.5
    # Fixed cost of one log-prob / update call (Python, per-layer launches), beside the FLOP
    # terms. 0 for the GPU presets (negligible next to their passes); `jigsawrl profile` measures
    # it on a CPU, where a tiny model's small passes are dominated by it.
    logprob_overhead_s: float = 0.0
    train_overhead_s: float = 0.0
    # The trainer pads every micro-batch's rows to its longest sequence and computes over the
    # padding (jigsawrl's CPU trainer: `jigsawrl profile` sets it). False: padding is removed
    # (verl's use_remove_padding; the GPU presets), so passes cost their real tokens.
    train_pads_rows: bool = False
    # Count a pass as jigsawrl's shared-prompt forward computes it (on by default in its
    # trainer): each GRPO group's prompt once, the responses in buckets of similar length.
    # False: every row in full (verl, TRL; the GPU presets), and the CPU profile's default too:
    # counted shared, standalone passes at the demo's shapes are predicted within -10..-24%
    # (padded: +86..+104%), but passes inside real runs take 1.1-1.9x their standalone time
    # for a cause not yet modelled, and the padded count happens to offset it (BENCHMARKS.md,
    # "What a pass computes"). Set it in a profile's params to try the shared count.
    train_shares_prompt: bool = False
    # The rollout engine prefills a GRPO group's prompt once and copies its KV to the group's
    # other fresh rows (jigsawrl's engine, engine/batch.py: one forward computes each distinct
    # fresh prompt of a batch). The simulator then charges a prefill each group's prompt once
    # (sim/rollout.py). True for the CPU workers (cpu_worker_params, and a profile says so);
    # False for the GPU presets, whose fits to published runs charge every row (vLLM's prefix
    # cache would share the prompt too: not modelled there).
    rollout_shares_prompt: bool = False
    # The rollout runs jigsawrl's own engine (engine/admission.py), whose limits the simulator
    # then honours: at most the pipeline's ``rollout.max_num_seqs`` requests decode at once and
    # its ``rollout.max_batch_tokens`` is the KV budget (of running requests and of requests
    # paused for a tool, which keep their cache until the budget needs it: evicted, they
    # re-prefill their whole context when the tool answers). True for the CPU workers
    # (cpu_worker_params, and so every profile); False for the GPU presets, whose engines
    # (vLLM, SGLang) are sized by device memory and keep no cache across a tool call here.
    rollout_engine_limits: bool = False
    # With both flags above: what one more forward call of the shared-prompt forward costs (a
    # response bucket's, or a further micro-batch's prompt call), in positions of the pass's
    # own line — per-call Python and per-layer launches, and the KV rows repeated for the
    # bucket's members. `jigsawrl profile` fits it from a GRPO-shaped pass (groups sharing a
    # prompt, responses of spread lengths); standalone passes at the demo's shapes took 21-32%
    # longer than the positions alone predict (BENCHMARKS.md, "Speed probe, where a pass's
    # time goes, and the shared forward's extra calls"). 0 = not modelled (the GPU presets).
    bucket_overhead_tokens: float = 0.0
    # What running a stage on a pool of worker processes adds beside its compute (the Ray
    # executor on CPU; `jigsawrl profile` measures these through Ray): a driver -> worker ->
    # driver call per stage, and moving the model's fp32 weights (or gradients) between workers
    # through the object store: to the helpers of a data-parallel log-prob or update (and the
    # gradients back) and to the engines at a weight sync. 0 = not modelled (the GPU presets,
    # whose collectives are modelled above and whose call costs fold into the overheads).
    call_overhead_s: float = 0.0
    worker_link_bytes_per_s: float = 0.0
    worker_link_latency_s: float = 0.0
    # Fixed cost of moving a train state onto a worker (onload: building the actor, its
    # optimizer and reference from host tensors) and off it (offload: copying them out), beside
    # the bytes' transfer. 0 = not modelled (the GPU presets); `jigsawrl profile` measures both
    # on the profiled model, through the engine's own export/import (a 1M-parameter state took
    # ~40 ms to onload on this CPU, 6 ms once the onload skipped the random init, where its
    # 16 MB cost ~3 ms by bandwidth alone). Nonzero also
    # makes the simulator move train states where the Ray executor does (sim/residency.py).
    state_onload_s: float = 0.0
    state_offload_s: float = 0.0
    # A device that runs one call at a time (a Ray CPU worker: one process, one call after
    # another) and the time slice its rollout ranks run in (the executor's chunk_s): > 0 makes
    # the simulator queue co-located calls on a device instead of letting them advance at their
    # shares at once (sim/gates.py). 0 = a GPU, whose co-located kernels run at once.
    serial_slice_s: float = 0.0
    # A rollout rank's set-up inside its first slice on a worker: a fresh engine holding the
    # step's weights, and the step's requests built (~20 ms on this CPU at 1M parameters).
    # `jigsawrl profile` measures it through the worker's own slice; 0 = not modelled (the GPU
    # presets, whose engines persist between steps).
    rollout_setup_s: float = 0.0
    # What a worker pool waits between a stage's end and the start of the call it enables,
    # beyond ``call_overhead_s``: the result's return to the driver with its payload, the
    # driver's bookkeeping and decision, the next call's dispatch and argument unpacking on its
    # worker (6-17 ms per stage on this 2-core CPU under load, against a 1-3 ms empty call).
    # `jigsawrl profile` measures it through the Ray executor on a probe run; charged inside
    # every call (a stage; a rollout rank's every slice and resume: sim/rollout_calls.py).
    # 0 = not modelled (GPU).
    stage_gap_s: float = 0.0
    # A worker pool's weight sync, measured whole: from the driver's call to the publish's
    # result back (the trainer's worker clones the actor's weights into the object store; the
    # engines take the new version in with their next slice's arguments, which start as soon
    # after a step's start as any call does). > 0 replaces the trainer -> engine model (gather,
    # load, a worker-link move, the stage gap) with this; 0 = that model (GPU). `jigsawrl
    # profile` times it on its probe run (the median of its 16 syncs), of the profiled model;
    # other model sizes are not rescaled. At 1M parameters on this 2-core CPU: 6.5 ms median
    # (mean ~9) over the demo's 104 syncs, 9.5-25 ms in five probe runs (its short steps keep
    # the driver busier), where the model charged 28-34 ms.
    weight_sync_s: float = 0.0
    # Seconds per KV token attended in one decode iteration, at a whole device (over share x
    # TP, as the FLOPs): > 0 replaces the price of attention's FLOPs at the decode rate. On a
    # CPU attention over the cache is bound by memory and small ops, ~0.28-0.31 us a token at
    # 1M parameters in four profiles of this 2-core VM, where its FLOPs priced the decode line
    # so flat in the context that the profile's own grid missed by up to 28% (+27% at batch 64
    # over 16-token prompts, -22% over 192-token ones). `jigsawrl profile` fits it beside the
    # other decode terms; 0 = the GPU presets (their KV reads are in the memory line).
    decode_ctx_s_per_token: float = 0.0
    # A CPU host shared by its devices' workers and by what else a run keeps busy there (the
    # driver's decisions and Ray waits, Ray's daemons, reward workers): ``host_slots`` is how
    # many devices of one node (``devices_per_node``) compute at full speed at once (its cores
    # over a device's threads), ``host_load_slots`` what the rest takes while workers compute,
    # in the same unit. With k of a node's devices busy each runs max(1, (k + load) / slots)
    # times slower (sim/hostload.py): on this 2-core CPU a pass ran 16-17% slower than
    # predicted while the other device was busy, 1-4% while it idled. `jigsawrl profile`
    # measures both (experiments/hostload.py); 0 = not modelled (GPU hosts have cores to spare).
    host_slots: float = 0.0
    host_load_slots: float = 0.0
    # Fixed cost of one host transfer call: pinned-buffer setup, synchronisation (assumption).
    host_transfer_latency_s: float = 1e-3
    # Effective host <-> device bandwidth of verl's offload (train.param_offload,
    # optimizer_offload, ref_param_offload; costmodel/deploy.py), per device: far below PCIe
    # because verl moves pageable (unpinned) tensors and FSDP's CPU offload copies layer by
    # layer, synchronously. FITTED: anchors D, lab (their offloaded passes, jointly with the
    # MFU curve; the two disagree by ~2x, see docs/FIDELITY.md).
    offload_bytes_per_s: float = 8.29e9
    # Rule-based reward (regex / math-verify) on the controller's CPU: detokenise and score
    # each sample. FITTED: the smallest per-sample step time left outside the published stages
    # over the per-stage anchors (an upper bound of the reward's cost): anchor A, whose 6.5 s
    # step leaves 0.085 s beside its stages for 512 samples (~0.17 ms each; docs/FIDELITY.md).
    # The former 2 ms + 0.05 s charged A's reward ~13x what its step leaves room for.
    reward_s_per_sample: float = 1.66e-4
    reward_overhead_s: float = 0.0
    # Memory not usable for model state: CUDA context, NCCL buffers, allocator fragmentation
    # (assumption: ~3 GB per device).
    mem_reserve_bytes: float = 3e9
    # Logits kept per token and vocabulary entry during training: bf16 logits + fp32 upcast for
    # the log-softmax (verl upcasts logits to fp32; assumption: 6 bytes).
    logits_bytes_per_entry: float = 6.0

    def __post_init__(self) -> None:
        for name in ("prefill_eff", "decode_compute_eff", "hbm_bw_eff", "kv_bw_eff", "s_sat",
                     "train_eff", "logprob_eff"):
            value = getattr(self, name)
            if value is None and name == "kv_bw_eff":
                continue
            if not 0.0 < value <= 1.0:
                raise ValueError(f"CostParams.{name} must be in (0, 1], got {value}")
        if not 0.0 <= self.comm_overlap <= 1.0:
            raise ValueError(f"CostParams.comm_overlap must be in [0, 1], got {self.comm_overlap}")
        if self.devices_per_node < 1 or self.train_micro_batch_tokens < 1:
            raise ValueError("CostParams.devices_per_node and train_micro_batch_tokens must be >= 1")
        for name in ("eager_iter_overhead_s_per_layer", "reward_s_per_sample",
                     "reward_overhead_s", "state_onload_s", "state_offload_s",
                     "serial_slice_s", "rollout_setup_s", "stage_gap_s", "weight_sync_s",
                     "decode_ctx_s_per_token",
                     "bucket_overhead_tokens", "host_slots", "host_load_slots"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"CostParams.{name} must be >= 0, got {getattr(self, name)}")
        if not self.offload_bytes_per_s > 0.0:
            raise ValueError(f"CostParams.offload_bytes_per_s must be > 0, "
                             f"got {self.offload_bytes_per_s}")

        if not self.logprob_mfu_ratio > 0.0:
            raise ValueError(f"CostParams.logprob_mfu_ratio must be > 0, "
                             f"got {self.logprob_mfu_ratio}")

    def train_mfu(self, num_params: float) -> float:
        """MFU of the actor update for a model of ``num_params`` (the size curve, capped)."""
        if self.train_mfu_at_1b is None:
            return self.train_eff
        return min(self.train_eff, self._size_curve(num_params))

    def logprob_mfu(self, num_params: float) -> float:
        """MFU of a forward-only log-prob pass: ``logprob_mfu_ratio`` x the update's size
        curve, capped at ``logprob_eff`` (flat ``logprob_eff`` without a size curve)."""
        if self.train_mfu_at_1b is None:
            return self.logprob_eff
        return min(self.logprob_eff, self.logprob_mfu_ratio * self._size_curve(num_params))

    def _size_curve(self, num_params: float) -> float:
        assert self.train_mfu_at_1b is not None
        value = self.train_mfu_at_1b * (max(num_params, 1.0) / 1e9) ** self.train_mfu_exponent
        return max(MFU_FLOOR, value)


# ---------------------------------------------------------------- FLOPs (useful model FLOPs only)


def attention_pairs(new_tokens: float, ctx_tokens: float, num_seqs: int = 1) -> float:
    """(query, key) pairs attended by a prefill of ``new_tokens`` over ``ctx_tokens`` cached ones.

    ``new_tokens`` and ``ctx_tokens`` are summed over ``num_seqs`` sequences of equal length
    (a simplification when their lengths differ). Causal: each new token sees the cached context
    of its sequence, the earlier new tokens of its sequence, and itself.
    """
    k = max(1, num_seqs)
    return (new_tokens * ctx_tokens + 0.5 * new_tokens * new_tokens) / k + 0.5 * new_tokens


def prefill_flops(model: ModelSpec, new_tokens: float, ctx_tokens: float = 0,
                  num_seqs: int = 1) -> float:
    """Dense matmul FLOPs (2 per parameter per token) plus causal attention FLOPs."""
    pairs = attention_pairs(new_tokens, ctx_tokens, num_seqs)
    return 2.0 * model.num_params * new_tokens + model.attn_flops_per_token_per_ctx() * pairs


def decode_flops(model: ModelSpec, batch: int, ctx_tokens: float, iters: int = 1) -> float:
    """FLOPs of ``iters`` decode iterations of ``batch`` tokens, KV context growing by ``batch``.

    ``ctx_tokens`` is the KV context summed over the batch at the first iteration.
    """
    n = iters
    ctx_sum = n * ctx_tokens + batch * n * (n - 1) / 2.0
    return 2.0 * model.num_params * batch * n + model.attn_flops_per_token_per_ctx() * ctx_sum


def logprob_flops(model: ModelSpec, tokens: float) -> float:
    """Forward pass only: 2 FLOPs per parameter per token (attention omitted: no lengths known)."""
    return 2.0 * model.num_params * tokens


def train_flops(model: ModelSpec, tokens: float) -> float:
    """Forward + backward: 6 FLOPs per parameter per token (activation recompute not counted)."""
    return 6.0 * model.num_params * tokens


# ---------------------------------------------------------------- bandwidth and communication


def bw_fraction(share: float, s_sat: float) -> float:
    """Fraction of HBM bandwidth reachable with a ``share`` of the SMs (assumed saturating)."""
    return share / s_sat if share < s_sat else 1.0


def kv_bytes_per_token_per_device(model: ModelSpec, tp: int) -> float:
    """KV bytes of one token on one device of a TP group.

    KV heads are split over ``tp``; when ``tp`` exceeds the number of KV heads, each device holds
    (at least) one replicated head, as vLLM does.
    """
    heads_per_device = model.num_kv_heads / tp
    if heads_per_device < 1.0:
        heads_per_device = 1.0
    return model.kv_bytes_per_token() * heads_per_device / model.num_kv_heads


def ring_collective_s(nbytes: float, n: int, link_bytes_per_s: float,
                      step_latency_s: float) -> float:
    """Ring all-gather or reduce-scatter of a buffer of ``nbytes`` (full size) over ``n`` devices.

    Each device sends and receives ``(n-1)/n * nbytes``; an all-reduce is two of these.
    """
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / link_bytes_per_s + (n - 1) * step_latency_s


def tp_allreduce_s(model: ModelSpec, tokens: float, tp: int, link_bytes_per_s: float,
                   latency_s: float) -> float:
    """Tensor-parallel all-reduces of one forward pass over ``tokens`` tokens.

    Megatron-style TP all-reduces the hidden state twice per layer (after attention and after
    the MLP): latency-dominated for decode, bandwidth-dominated for large prefills.
    """
    if tp <= 1:
        return 0.0
    nbytes = tokens * model.hidden_size * 2.0  # bf16 activations
    one = 2.0 * (tp - 1) / tp * nbytes / link_bytes_per_s + latency_s
    return 2.0 * model.num_layers * one


def overlap_comm(compute_s: float, comm_s: float, overlap: float) -> float:
    """Time of compute and communication of which a fraction ``overlap`` can run concurrently."""
    hi, lo = (compute_s, comm_s) if compute_s >= comm_s else (comm_s, compute_s)
    return hi + (1.0 - overlap) * lo
