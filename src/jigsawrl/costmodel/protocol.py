"""What the rest of the package asks of a cost model: :class:`CostModelProtocol`.

The schedulers (through ``View.cost``, the belief), the sub-stage graph builder and bound, the
simulator (the truth) and the driver call a cost model only through these members, so that
anything with them — :class:`~jigsawrl.costmodel.model.CostModel`, a profiled table, a test's
exact toy costs — can stand in. Type against the protocol, not the concrete class.

Members, by who calls them:

- rollout (``sim``, the look-ahead, the tail planner, the bound): :meth:`prefill_time_s`,
  :meth:`decode_iter_time_s`, :meth:`decode_span_time_s`, :meth:`prefill_flops`,
  :meth:`decode_flops`;
- training side (``sim``, ``graph``): :meth:`pass_tokens`, :meth:`logprob_time_s`,
  :meth:`train_time_s`, :meth:`weight_sync_time_s`, :meth:`host_transfer_time_s`,
  :meth:`reward_time_s`, :meth:`dispatch_time_s`, :meth:`logprob_flops`, :meth:`train_flops`;
- memory (schedulers, driver, ``sim``): :meth:`rollout_weight_bytes`, :meth:`kv_bytes`,
  :meth:`kv_budget_tokens`, :meth:`train_state_bytes`, :meth:`activation_bytes`;
- co-location: :meth:`slowdown`;
- data: :attr:`params` (``s_sat`` for bandwidth contention in ``sim``, ``train_eff`` — the cap
  of the training MFU size curve, so the fastest training rate — for the bound) and
  :attr:`accel` (peak FLOP/s for the bound).

Time methods here take no ``noise`` argument: callers through the protocol get the model's own
behaviour (deterministic for a belief, seeded noise for a truth); the noise knobs are
:class:`~jigsawrl.costmodel.model.CostModel`'s own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from jigsawrl.costmodel.roofline import CostParams
from jigsawrl.workload.accelerators import AcceleratorSpec
from jigsawrl.workload.models import ModelSpec


@runtime_checkable
class CostModelProtocol(Protocol):
    """The cost-model members the scheduler, graph, simulator and driver use (module docstring).

    Units: every ``*_time_s`` is seconds, ``*_bytes`` bytes per device, ``*_flops`` FLOPs;
    ``share`` is a compute share in (0, 1]; ``tp`` / ``n_devices`` count devices.
    """

    @property
    def params(self) -> CostParams:
        """Efficiencies and overheads (read: ``s_sat``, ``train_eff``)."""
        ...

    @property
    def accel(self) -> AcceleratorSpec:
        """The accelerator whose peaks the model scales (read: ``peak_flops``)."""
        ...

    # ---------------------------------------------------------------- rollout
    def prefill_time_s(self, model: ModelSpec, tp: int, new_tokens: int, ctx_tokens: int = 0,
                       share: float = 1.0, *, num_seqs: int = 1) -> float:
        """One engine iteration prefilling ``new_tokens`` over ``ctx_tokens`` cached tokens."""
        ...

    def decode_iter_time_s(self, model: ModelSpec, tp: int, batch: int, ctx_tokens: int,
                           share: float = 1.0) -> float:
        """One decode iteration of ``batch`` sequences holding ``ctx_tokens`` KV tokens."""
        ...

    def decode_span_time_s(self, model: ModelSpec, tp: int, batch: int, ctx_tokens: int,
                           iters: int, share: float = 1.0) -> float:
        """``iters`` decode iterations at a constant batch, the context growing by ``batch``."""
        ...

    def prefill_flops(self, model: ModelSpec, new_tokens: int, ctx_tokens: int = 0, *,
                      num_seqs: int = 1) -> float: ...

    def decode_flops(self, model: ModelSpec, batch: int, ctx_tokens: int,
                     iters: int = 1) -> float: ...

    # ---------------------------------------------------------------- training side
    def pass_tokens(self, seq_lens: Sequence[int], n_devices: int, micro_batch_rows: int,
                    prompt_lens: Sequence[int] | None = None, group_size: int = 1) -> int:
        """Tokens a log-prob / update pass over ``seq_lens`` computes (padding included; each
        group's prompt once where the trainer shares prompts and ``prompt_lens`` are given)."""
        ...

    def logprob_time_s(self, model: ModelSpec, n_devices: int, tokens: int,
                       share: float = 1.0) -> float: ...

    def train_time_s(self, model: ModelSpec, n_devices: int, tokens: int,
                     share: float = 1.0) -> float: ...

    def weight_sync_time_s(self, model: ModelSpec, n_devices: int, tp: int = 1) -> float: ...

    def host_transfer_time_s(self, nbytes: float, n_devices: int = 1) -> float: ...

    def reward_time_s(self, num_samples: int) -> float: ...

    def dispatch_time_s(self, model: ModelSpec, stage: str, n_devices: int,
                        rounds: int = 1) -> float:
        """What a worker pool adds to ``stage`` beside its compute (0 unless profiled), its
        pool part paid ``rounds`` times (one per epoch of a data-parallel update)."""
        ...

    def logprob_flops(self, model: ModelSpec, tokens: int) -> float: ...

    def train_flops(self, model: ModelSpec, tokens: int) -> float: ...

    # ---------------------------------------------------------------- memory (bytes per device)
    def rollout_weight_bytes(self, model: ModelSpec, tp: int) -> float: ...

    def kv_bytes(self, model: ModelSpec, tokens: int, tp: int) -> float: ...

    def kv_budget_tokens(self, model: ModelSpec, tp: int, mem_bytes: float) -> int: ...

    def train_state_bytes(self, model: ModelSpec, n_devices: int) -> float: ...

    def activation_bytes(self, model: ModelSpec, micro_batch_tokens: int,
                         n_devices: int) -> float: ...

    # ---------------------------------------------------------------- co-location
    def slowdown(self, stage: str, share: float, *, model: ModelSpec | None = None, tp: int = 1,
                 batch: int | None = None, ctx_tokens: int | None = None) -> float:
        """Time at ``share`` over time at the whole device, >= 1."""
        ...
