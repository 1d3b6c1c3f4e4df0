"""A lower bound on the makespan of an experiment, from the cost model (``efficiency``).

No policy can finish sooner, because the bound relaxes everything a policy controls:

- *per pipeline* (dependency bound): every step's rollout lasts at least as long as its single
  longest request decoded alone (batch 1, whole device, no contention: the fastest an iteration
  can be in the cost model) plus its prefills and tool waits; the post-rollout stages then run at
  full share on *all* devices. Steps are sequential for sync pipelines. For async pipelines only
  training is sequential, so the bound is the first rollout plus the sum of training stages.
- *whole pool* (work bound): the compute-bound FLOPs of every log-prob and update pass, spread
  over all devices at the cost model's training efficiency.

``lower_bound_s`` is the larger of the two; ``efficiency = lower_bound_s / makespan_s``. The bound
uses the noise-free cost model, so a run with truth noise can land a few percent under it by
luck; tests check it with noise off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jigsawrl.costmodel.protocol import CostModelProtocol
from jigsawrl.workload.models import ModelSpec
from jigsawrl.workload.requests import RequestTruth


def request_floor_s(cost: CostModelProtocol, model: ModelSpec, tp: int,
                    req: RequestTruth) -> float:
    """The fastest one request can complete: alone, whole devices, no contention."""
    t = cost.prefill_time_s(model, tp, req.prompt_tokens, 0, 1.0)
    ctx = req.prompt_tokens
    for turn in req.turns:
        t += cost.decode_span_time_s(model, tp, 1, ctx, turn.response_tokens, 1.0)
        ctx += turn.response_tokens
        if turn.tool_result_tokens:
            t += turn.tool_latency_s
            t += cost.prefill_time_s(model, tp, turn.tool_result_tokens, ctx, 1.0)
            ctx += turn.tool_result_tokens
    return t


def _train_chain_s(cost: CostModelProtocol, model: ModelSpec, n: int, tokens: int, samples: int,
                   use_ref: bool, epochs: int, tp: int) -> float:
    """Post-rollout stages, each on its fastest device count in 1..n (communication makes
    more devices not always faster, so the minimum over counts is what bounds every policy)."""
    counts = sorted({n, *(2 ** i for i in range(n.bit_length()) if 2 ** i <= n)})

    def best(fn: Callable[[int], float]) -> float:
        return min(fn(k) for k in counts)

    t = cost.reward_time_s(samples) + best(lambda k: cost.logprob_time_s(model, k, tokens))
    if use_ref:
        t += best(lambda k: cost.logprob_time_s(model, k, tokens))
    t += epochs * best(lambda k: cost.train_time_s(model, k, tokens))
    return t + best(lambda k: cost.weight_sync_time_s(model, k, tp))


def makespan_lower_bound(pipes: Sequence, steps_requests: Callable[[object, int], list],  # noqa: ANN001
                         cost: CostModelProtocol, num_devices: int) -> float:
    """max(dependency bound over pipelines, work bound over the pool); see the module doc.

    Args:
        pipes: resolved pipelines (``.spec``, ``.model``).
        steps_requests: ``(pipe, step) -> list[RequestTruth]`` — the true requests.
        cost: a noise-free cost model.
        num_devices: devices in the pool.
    """
    dep = 0.0
    work_flops = 0.0
    for p in pipes:
        spec, m = p.spec, p.model
        rolls, trains = [], []
        for k in range(spec.steps):
            reqs = steps_requests(p, k)
            rolls.append(max((request_floor_s(cost, m, spec.rollout_tp, r) for r in reqs),
                             default=0.0))
            tokens = sum(r.total_tokens for r in reqs)
            trains.append(_train_chain_s(cost, m, num_devices, tokens, len(reqs), spec.use_ref,
                                         spec.train.ppo_epochs, spec.rollout_tp))
            passes = 2 if spec.use_ref else 1
            work_flops += passes * cost.logprob_flops(m, tokens) + \
                spec.train.ppo_epochs * cost.train_flops(m, tokens)
        if spec.mode == "async" and spec.max_staleness > 0:
            chain = rolls[0] + sum(trains)
        else:
            chain = sum(rolls) + sum(trains)
        dep = max(dep, spec.start_s + chain)
    rate = cost.accel.peak_flops * cost.params.train_eff * num_devices
    return max(dep, work_flops / rate)
