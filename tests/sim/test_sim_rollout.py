"""Exact timelines of one rollout instance (continuous batching, KV preemption, multi-turn)."""

from __future__ import annotations

import heapq
from types import SimpleNamespace

import pytest

from jigsawrl.sim.rollout import RolloutInstance, engine_limits
from jigsawrl.stages import Stage, decode_band
from jigsawrl.workload.models import MODELS
from jigsawrl.workload.requests import RequestTruth, TurnTruth

M = MODELS["qwen3-0.6b"]


def req(sid: str, prompt: int, *turns: int, tool_result: int = 0) -> RequestTruth:
    tt = tuple(TurnTruth(n, 1.0 if i + 1 < len(turns) else 0.0,
                         tool_result if i + 1 < len(turns) else 0) for i, n in enumerate(turns))
    return RequestTruth(sid, prompt, tt)


def run(inst: RolloutInstance) -> list[tuple[str, float, float, int]]:
    """Drive the instance to completion (tool results come back immediately)."""
    t, out = 0.0, []
    while not inst.done:
        seg = inst.next_segment(t, 1.0)
        assert seg is not None
        res = inst.finish_segment(seg)
        out.append((seg.kind, round(t, 6), round(t + seg.duration_s, 6), seg.batch))
        t += seg.duration_s
        for r in res.tool_calls:
            inst.tool_returned(r)
    return out


def test_bands() -> None:
    assert decode_band(2000) == Stage.DECODE_LARGE
    assert decode_band(1024) == Stage.DECODE_LARGE
    assert decode_band(500) == Stage.DECODE_MEDIUM
    assert decode_band(128) == Stage.DECODE_MEDIUM
    assert decode_band(127) == Stage.DECODE_SMALL


def test_continuous_batching_timeline(fake_cost) -> None:  # noqa: ANN001
    inst = RolloutInstance("x", M, 1, fake_cost, kv_budget_tokens=10_000)
    inst.add([req("a", 10, 2), req("b", 10, 5)])
    # prefill 20 tokens (0.2 s), decode both 2 iters, then b alone 3 iters
    assert run(inst) == [(Stage.PREFILL, 0.0, 0.2, 2), (Stage.DECODE_SMALL, 0.2, 2.2, 2),
                         (Stage.DECODE_SMALL, 2.2, 5.2, 1)]
    assert inst.total_ctx == 0 and inst.n_running == 0


def test_max_num_seqs_admits_as_others_finish(fake_cost) -> None:  # noqa: ANN001
    inst = RolloutInstance("x", M, 1, fake_cost, kv_budget_tokens=10_000, max_num_seqs=1)
    inst.add([req("a", 10, 3), req("b", 10, 1)])
    assert run(inst) == [(Stage.PREFILL, 0.0, 0.1, 1), (Stage.DECODE_SMALL, 0.1, 3.1, 1),
                         (Stage.PREFILL, 3.1, 3.2, 1), (Stage.DECODE_SMALL, 3.2, 4.2, 1)]


def test_kv_full_preempts_latest_and_recomputes(fake_cost) -> None:  # noqa: ANN001
    # budget 30 tokens: two prompts of 10 (20) + growth of 2/iter → full after 4 iterations
    inst = RolloutInstance("x", M, 1, fake_cost, kv_budget_tokens=30)
    inst.add([req("a", 10, 8), req("b", 10, 8)])
    tl = run(inst)
    assert tl[0] == (Stage.PREFILL, 0.0, 0.2, 2)
    assert tl[1] == (Stage.DECODE_SMALL, 0.2, 5.2, 2)  # 5 iters → ctx 30 = budget
    assert inst.preemptions >= 1
    # a finishes alone, then b is re-prefilled with its 15 tokens of context and finishes
    assert (Stage.PREFILL, 8.2, 8.35, 1) in tl
    assert tl[-1][0] == Stage.DECODE_SMALL and tl[-1][2] == 11.35


def test_a_preempted_request_generates_all_its_tokens(fake_cost) -> None:  # noqa: ANN001
    # A preempted request left its heap entry behind; once re-admitted, that stale entry ended
    # its turn at the old finish iteration, tokens short of its truth (fixed: entries are
    # checked against the request's current admission).
    inst = RolloutInstance("x", M, 1, fake_cost, kv_budget_tokens=300)
    reqs = [req(f"p/0/{i}/0", 10, 40 + 10 * i) for i in range(8)]
    inst.add(reqs)
    t, ctx = 0.0, {}
    while not inst.done:
        seg = inst.next_segment(t, 1.0)
        t += seg.duration_s
        for r in inst.finish_segment(seg).finished:
            ctx[r.truth.sample_id] = r.ctx
    assert inst.preemptions > 0
    assert ctx == {r.sample_id: r.prompt_tokens + r.response_tokens for r in reqs}


def test_export_some_takes_queued_then_latest_running(fake_cost) -> None:  # noqa: ANN001
    inst = RolloutInstance("x", M, 1, fake_cost, kv_budget_tokens=10_000, max_num_seqs=2)
    inst.add([req("a", 10, 5), req("b", 10, 6), req("c", 10, 7), req("d", 10, 8)])
    inst.finish_segment(inst.next_segment(0.0, 1.0))  # a and b admitted and prefilled
    assert [r.truth.sample_id for r in inst.export_some(1, queued_only=True)] == ["d"]
    out = inst.export_some(2)
    assert [r.truth.sample_id for r in out] == ["c", "b"]  # the queue, then the latest admitted
    assert all(r.prefill_tokens == r.ctx and not r.running for r in out)
    assert inst.n_running == 1 and inst.total_ctx == 10 and not inst.queue
    # the request left behind runs to its end; the taken one's stale entry ends nothing
    seg = inst.next_segment(0.1, 1.0)
    assert seg.iters == 5 and seg.batch == 1
    assert [r.truth.sample_id for r in inst.finish_segment(seg).finished] == ["a"]
    assert inst.done


def test_multi_turn_prefills_only_tool_result(fake_cost) -> None:  # noqa: ANN001
    inst = RolloutInstance("x", M, 1, fake_cost, kv_budget_tokens=10_000)
    inst.add([req("a", 10, 2, 3, tool_result=5)])
    assert run(inst) == [(Stage.PREFILL, 0.0, 0.1, 1), (Stage.DECODE_SMALL, 0.1, 2.1, 1),
                         (Stage.PREFILL, 2.1, 2.15, 1), (Stage.DECODE_SMALL, 2.15, 5.15, 1)]


def test_interrupt_keeps_progress(fake_cost) -> None:  # noqa: ANN001
    inst = RolloutInstance("x", M, 1, fake_cost, kv_budget_tokens=10_000)
    inst.add([req("a", 10, 10)])
    pre = inst.next_segment(0.0, 1.0)
    inst.finish_segment(pre)
    seg = inst.next_segment(pre.duration_s, 1.0)
    assert seg.iters == 10
    res, ran = inst.interrupt(seg, seg.start_s + 4.5)
    assert ran.iters == 4 and not res.finished
    rest = inst.next_segment(seg.start_s + 4.5, 1.0)
    assert rest.iters == 6
    assert inst.finish_segment(rest).finished


def test_shared_prompt_prefills_each_group_once(fake_cost) -> None:  # noqa: ANN001
    class Shared(type(fake_cost)):
        class params(type(fake_cost).params):  # noqa: N801
            rollout_shares_prompt = True

    reqs = [req("p/0/0/0", 10, 2), req("p/0/0/1", 10, 2), req("p/0/1/0", 20, 2),
            req("p/0/1/1", 20, 2), req("p/0/pred/0", 10, 2), req("p/0/pred/1", 10, 2)]
    shared = RolloutInstance("x", M, 1, Shared(), kv_budget_tokens=10_000)
    shared.add(reqs)
    seg = shared.next_segment(0.0, 1.0)
    # groups 0 and 1 once each (10 + 20), predicted requests carry no group (10 + 10)
    assert seg is not None and seg.tokens == 50 and seg.batch == 6  # all six admitted
    assert abs(seg.duration_s - 0.5) < 1e-12
    full = RolloutInstance("x", M, 1, fake_cost, kv_budget_tokens=10_000)
    full.add(reqs)
    seg = full.next_segment(0.0, 1.0)
    assert seg is not None and seg.tokens == 80 and abs(seg.duration_s - 0.8) < 1e-12


def test_shared_prompt_not_after_migration_or_tool_turn(fake_cost) -> None:  # noqa: ANN001
    class Shared(type(fake_cost)):
        class params(type(fake_cost).params):  # noqa: N801
            rollout_shares_prompt = True

    inst = RolloutInstance("x", M, 1, Shared(), kv_budget_tokens=10_000)
    inst.add([req("p/0/0/0", 10, 3), req("p/0/0/1", 10, 3)])
    seg = inst.next_segment(0.0, 1.0)
    assert seg is not None and seg.tokens == 10
    inst.finish_segment(seg)
    dec = inst.next_segment(0.1, 1.0)
    assert dec is not None
    inst.interrupt(dec, 1.1)  # one token each
    _, runs = inst.export_unfinished(None, 1.1)  # a migration: prompt + generated re-prefill
    other = RolloutInstance("y", M, 1, Shared(), kv_budget_tokens=10_000)
    other.add_runs(runs)
    seg = other.next_segment(0.0, 1.0)
    assert seg is not None and seg.tokens == 22
    # a tool result's prefill is each request's own
    inst = RolloutInstance("z", M, 1, Shared(), kv_budget_tokens=10_000)
    inst.add([req("p/0/0/0", 10, 1, 1, tool_result=5), req("p/0/0/1", 10, 1, 1, tool_result=5)])
    prefills = [seg for seg in run(inst) if seg[0] == Stage.PREFILL]
    assert [round(b - a, 6) for _, a, b, _ in prefills] == [0.1, 0.1]  # 10 once, then 5 + 5


# ----------------------------------------------------------------- jigsawrl's engine's limits

def run_with_tools(inst: RolloutInstance, tool_s: float) -> list[tuple[str, float, int]]:
    """Drive the instance with tool results due ``tool_s`` after each call (no interrupts);
    returns (kind, start, tokens) per segment."""
    t, out, due = 0.0, [], []
    while not inst.done:
        while due and due[0][0] <= t + 1e-9:
            inst.tool_returned(heapq.heappop(due)[2])
        seg = inst.next_segment(t, 1.0)
        if seg is None:
            t = due[0][0]
            continue
        res = inst.finish_segment(seg)
        out.append((seg.kind, round(t, 6), seg.tokens))
        t += seg.duration_s
        for r in res.tool_calls:
            heapq.heappush(due, (t + tool_s, id(r), r))
    return out


@pytest.fixture
def engine_cost(fake_cost):  # noqa: ANN001, ANN201
    class Engine(type(fake_cost)):
        class params(type(fake_cost).params):  # noqa: N801
            rollout_engine_limits = True
    return Engine()


def prefills(timeline: list[tuple[str, float, int]]) -> list[int]:
    return [tokens for kind, _, tokens in timeline if kind == Stage.PREFILL]


def test_engine_limits_size_an_instance_from_the_spec(fake_cost, engine_cost) -> None:  # noqa: ANN001
    spec = SimpleNamespace(rollout=SimpleNamespace(max_batch_tokens=4096, max_num_seqs=128))
    assert engine_limits(fake_cost, spec, 10**6) == {"kv_budget_tokens": 10**6}
    assert engine_limits(engine_cost, spec, 10**6) == {"kv_budget_tokens": 4096,
                                                        "max_num_seqs": 128}
    assert engine_limits(engine_cost, spec, 100)["kv_budget_tokens"] == 100  # memory binds


def test_engine_keeps_a_paused_cache_while_there_is_room(engine_cost) -> None:  # noqa: ANN001
    inst = RolloutInstance("x", M, 1, engine_cost, kv_budget_tokens=10_000)
    inst.add([req("a", 10, 2, 3, tool_result=5)])
    seen = []
    t = 0.0
    while not inst.done:
        seg = inst.next_segment(t, 1.0)
        res = inst.finish_segment(seg)
        t += seg.duration_s
        seen.append((seg.tokens if seg.kind == Stage.PREFILL else None, inst.paused_ctx))
        for r in res.tool_calls:
            inst.tool_returned(r)
    # held 12 tokens (prompt + 2 generated) while paused; the result alone is prefilled after
    assert [p for p, _ in seen if p is not None] == [10, 5]
    assert inst.paused_ctx == 0


def test_engine_evicts_a_paused_cache_when_decode_needs_it(engine_cost) -> None:  # noqa: ANN001
    # budget 30: "a" pauses holding 11 tokens; "b" grows to 19 + 11 = 30, then needs a's room
    inst = RolloutInstance("x", M, 1, engine_cost, kv_budget_tokens=30)
    inst.add([req("a", 10, 1, 1, tool_result=5), req("b", 10, 20)])
    # evicted: a re-prefills prompt + generated + tool result (16), not the result alone (5)
    assert prefills(run_with_tools(inst, tool_s=100.0)) == [20, 16]
    # the same without the engine's limits: a tool turn frees the cache, the result is prefilled
    inst = RolloutInstance("x", M, 1, type(engine_cost).__mro__[1](), kv_budget_tokens=30)
    inst.add([req("a", 10, 1, 1, tool_result=5), req("b", 10, 20)])
    assert prefills(run_with_tools(inst, tool_s=100.0)) == [20, 5]


def test_engine_preempts_a_returning_request_without_room(engine_cost) -> None:  # noqa: ANN001
    # "a" returns while "b" holds 19 of 30 tokens: a's 16 do not fit, so the engine preempts it
    # (its cache freed) and it re-prefills in full once b is done
    inst = RolloutInstance("x", M, 1, engine_cost, kv_budget_tokens=30)
    inst.add([req("a", 10, 1, 1, tool_result=5), req("b", 10, 12)])
    assert prefills(run_with_tools(inst, tool_s=1.0)) == [20, 16]


def test_engine_drops_paused_caches_on_export(engine_cost) -> None:  # noqa: ANN001
    inst = RolloutInstance("x", M, 1, engine_cost, kv_budget_tokens=10_000)
    inst.add([req("a", 10, 1, 1, tool_result=5), req("b", 10, 20)])
    inst.finish_segment(inst.next_segment(0.0, 1.0))
    res = inst.finish_segment(inst.next_segment(0.2, 1.0))
    (a,) = res.tool_calls
    assert inst.paused_ctx == 11
    _, runs = inst.export_unfinished(None, 1.2)  # migrated: b goes, a's cache is dropped
    assert inst.paused_ctx == 0 and [r.truth.sample_id for r in runs] == ["b"]
    other = RolloutInstance("y", M, 1, engine_cost, kv_budget_tokens=10_000)
    other.tool_waiting = 1  # moved with the rank's requests, as a migration does
    other.tool_returned(a)  # its tool answers on the rank it moved to
    assert a.prefill_tokens == 16
