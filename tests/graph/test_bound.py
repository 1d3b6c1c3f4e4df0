"""Makespan floor and bound: hand-checked values with exact toy costs, the rollout packing bound
against the simulator's own batching, the decode planes below the cost model, the critical path
of async steps."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jigsawrl.costmodel import CostModel
from jigsawrl.graph.bound import makespan_floor, pareto_front, request_floor_s, rollout_floor_s
from jigsawrl.graph.build import rank_segments, split_ranks
from jigsawrl.graph.decode_planes import decode_planes
from jigsawrl.graph.makespan_bound import critical_path_s, makespan_bound, never_co_resident
from jigsawrl.graph.rollout_bound import request_arrays, rollout_time_lb
from jigsawrl.sim.rollout import RolloutInstance
from jigsawrl.workload.accelerators import ACCELERATORS
from jigsawrl.workload.models import MODELS
from jigsawrl.workload.requests import RequestTruth, TurnTruth

M = MODELS["qwen3-0.6b"]


class BatchCost:
    """tests/conftest.py's FakeCost, but a decode iteration costs 1 s + 0.5 s per sequence."""

    def __init__(self, fake) -> None:  # noqa: ANN001
        self.fake = fake
        self.accel, self.params = fake.accel, fake.params

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.fake, name)

    def decode_iter_time_s(self, model, tp, batch, ctx, share=1.0):  # noqa: ANN001, ANN201
        return 1.0 + 0.5 * batch

    def decode_span_time_s(self, model, tp, batch, ctx, iters, share=1.0):  # noqa: ANN001, ANN201
        return iters * (1.0 + 0.5 * batch)


def pipe(name: str = "p", steps: int = 1, mode: str = "sync", eta: int = 0):  # noqa: ANN201
    spec = SimpleNamespace(name=name, steps=steps, rollout_tp=1, use_ref=True, mode=mode,
                           batch_size=1, max_staleness=eta, start_s=0.0, train=SimpleNamespace(ppo_epochs=1))
    return SimpleNamespace(spec=spec, model=M)


def reqs(*lengths: int, prompt: int = 10) -> list[RequestTruth]:
    return [RequestTruth(f"r{i}", prompt, (TurnTruth(n),)) for i, n in enumerate(lengths)]


def post_s(tokens: int, n: int) -> float:
    """FakeCost's post-rollout chain on n devices: reward, old + ref log-prob, update, sync."""
    return 0.5 + 2 * 0.001 * tokens / n + 0.003 * tokens / n + 1.0


def test_fake_cost_bound_is_the_floor_when_batching_is_free(fake_cost) -> None:  # noqa: ANN001
    """FakeCost decodes at 1 s per iteration whatever the batch: batching costs nothing, so the
    bound's dependency term is per step the longest request alone (prefill 0.1 s + 6
    iterations), then the post-rollout chain on both devices; two steps in sequence. The floor
    keeps after each rollout only its weight sync (1 s): a schedule may stream the rest."""
    p = pipe(steps=2)
    rep = makespan_bound([p], lambda _p, _k: reqs(3, 6), fake_cost, 2)
    expected = 2 * (0.1 + 6.0 + post_s(13 + 16, 2))
    floor = 2 * (0.1 + 6.0 + 1.0)
    assert rep.floor_s == pytest.approx(floor)
    assert rep.bound_s == pytest.approx(expected)
    assert rep.terms["dependency/p"] == pytest.approx(expected)
    assert rep.terms["pool/bandwidth"] == 0.0  # FakeCost's decode holds no share or bandwidth
    assert makespan_floor([p], lambda _p, _k: reqs(3, 6), fake_cost, 2) == pytest.approx(floor)


def test_batching_makes_the_bound_exceed_the_floor(fake_cost) -> None:  # noqa: ANN001
    """Two 4-token requests on one rank at 1 s + 0.5 s × batch per iteration: alone each takes
    0.1 + 4 × 1.5 = 6.1 s (the floor); on one rank they share every iteration: 4 × (1 + 2 × 0.5)
    = 8 s of decode (the bound; the simulator adds the 0.2 s prefill: 8.2 s). On two ranks they
    need not share: the floor is the bound."""
    cost = BatchCost(fake_cost)
    one = makespan_bound([pipe()], lambda _p, _k: reqs(4, 4), cost, 1)
    chain = post_s(28, 1)
    assert one.floor_s == pytest.approx(6.1 + 1.0)  # the rollout, then its weight sync
    assert one.bound_s == pytest.approx(8.0 + chain)
    assert one.binding == "dependency/p" and one.rollout_s["p"] == [pytest.approx(8.0)]
    inst = RolloutInstance("p/0/0", M, 1, cost, kv_budget_tokens=10_000)
    inst.add(reqs(4, 4))
    simulated = rank_segments(inst)[-1][2]
    assert simulated == pytest.approx(8.2) and simulated >= one.rollout_s["p"][0]
    two = makespan_bound([pipe()], lambda _p, _k: reqs(4, 4), cost, 2)
    assert two.rollout_s["p"] == [pytest.approx(6.1)]


def test_packing_bound_hand_case() -> None:
    """alpha 1, lengths 10, 10, 2, 2 with mass 4 each, two ranks: a bin with a 10-token head
    spends 10, so the two long requests need a bin each; capacity τ - 10 per bin must hold the
    mass 16 → τ = 18 (and 12 would do with one rank per request: four ranks)."""
    gen = np.array([10.0, 2.0, 10.0, 2.0])
    mass = np.full(4, 4.0)
    assert rollout_time_lb(gen, mass, 1.0, 2) == pytest.approx(18.0, rel=2e-4)
    assert rollout_time_lb(gen, mass, 1.0, 2) <= 18.0
    assert rollout_time_lb(gen, mass, 1.0, 4) == pytest.approx(14.0)  # longest + its mass
    assert rollout_time_lb(gen, mass, 1.0, 1) == pytest.approx(26.0)  # one batch: 10 + 16
    assert rollout_time_lb(gen, mass, 1.0, 2, floor_s=30.0) == 30.0


def _lpt(rs: list[RequestTruth], n: int) -> list[list[RequestTruth]]:
    """Longest-first to the least-loaded rank, by true length (a skew-aware dispatch's best)."""
    out: list[list[RequestTruth]] = [[] for _ in range(n)]
    load = [0] * n
    for r in sorted(rs, key=lambda r: -r.generated_tokens):
        k = min(range(n), key=lambda j: (load[j], len(out[j])))
        out[k].append(r)
        load[k] += r.generated_tokens
    return out


def _rollout_s(cost: CostModel, chunks: list[list[RequestTruth]], tp: int) -> float:
    end = 0.0
    for chunk in chunks:
        inst = RolloutInstance("x", M, tp, cost, kv_budget_tokens=200_000)
        inst.add(chunk)
        segs = rank_segments(inst)
        end = max(end, segs[-1][2] if segs else 0.0)
    return end


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=48),
       prompts=st.lists(st.integers(1, 800), min_size=48, max_size=48),
       ranks=st.sampled_from([1, 2, 3, 4, 8]), tp=st.sampled_from([1, 2]))
def test_packing_bound_is_below_the_simulators_batching(lengths, prompts, ranks, tp) -> None:  # noqa: ANN001
    """The simulator's continuous batching (sim/rollout.py), with verl's contiguous dispatch and
    with longest-first dispatch by true length, never beats the bound on the same ranks."""
    cost = CostModel(ACCELERATORS["h100-80gb"])
    rs = [RequestTruth(f"r{i}", prompts[i], (TurnTruth(n),)) for i, n in enumerate(lengths)]
    planes = decode_planes(cost, M, tp)
    gen, ctx = request_arrays(rs)
    lb = rollout_time_lb(gen, planes.time.beta * gen + planes.time.gamma * ctx,
                         planes.time.alpha, ranks, rollout_floor_s(cost, M, tp, rs))
    assert lb <= _rollout_s(cost, split_ranks(rs, ranks), tp) * (1 + 1e-9)
    assert lb <= _rollout_s(cost, _lpt(rs, ranks), tp) * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(["qwen3-0.6b", "qwen3-4b", "qwen3-32b"]), tp=st.sampled_from([1, 2, 4]),
       batch=st.integers(1, 512), ctx=st.integers(0, 2_000_000),
       share=st.sampled_from([0.05, 0.2, 0.4, 0.7, 1.0]))
def test_decode_planes_stay_below_the_cost_model(model, tp, batch, ctx, share) -> None:  # noqa: ANN001
    cost = CostModel(ACCELERATORS["h100-80gb"])
    m = MODELS[model]
    planes = decode_planes(cost, m, tp)
    t = cost.decode_iter_time_s(m, tp, batch, ctx, share)
    frac = min(1.0, share / cost.params.s_sat)  # bandwidth a decode at ``share`` holds
    assert planes.time.at(batch, ctx) <= cost.decode_iter_time_s(m, tp, batch, ctx, 1.0) * (1 + 1e-9)
    assert planes.compute.at(batch, ctx) <= share * t * (1 + 1e-9)
    assert planes.bandwidth.at(batch, ctx) <= frac * t * (1 + 1e-9)
    assert planes.time.alpha > planes.bandwidth.alpha > 0.0  # weights read once per iteration


def test_async_critical_path() -> None:
    # sync: rollouts and chains in sequence
    assert critical_path_s([3, 3, 3], [1, 1, 1], 0) == 12
    # staleness 1: rollout k after the sync of k-2: r0 ‖ r1 → c0 (3..4), c1 (4..5);
    # r2 after c0 (4..7) → c2 (7..8)
    assert critical_path_s([3, 3, 3], [1, 1, 1], 1) == 8
    assert critical_path_s([3, 3, 3], [1, 1, 1], 1, start_s=2.0) == 10
    assert critical_path_s([], [], 0, start_s=1.0) == 1.0


def test_async_pipeline_bound_uses_the_staleness(fake_cost) -> None:  # noqa: ANN001
    sync = makespan_bound([pipe(steps=3)], lambda _p, _k: reqs(6), fake_cost, 1)
    asyn = makespan_bound([pipe(steps=3, mode="async", eta=1)], lambda _p, _k: reqs(6),
                          fake_cost, 1)
    roll, post = 0.1 + 6.0, post_s(16, 1)
    assert sync.bound_s == pytest.approx(3 * (roll + post))
    assert asyn.bound_s == pytest.approx(critical_path_s([roll] * 3, [post] * 3, 1))
    assert asyn.floor_s <= asyn.bound_s < sync.bound_s


def test_rollout_floor_prunes_to_the_pareto_front() -> None:
    cost = CostModel(ACCELERATORS["h100-80gb"])
    rng = np.random.default_rng(0)
    rs = [RequestTruth(f"r{i}", int(p), (TurnTruth(int(n)),))
          for i, (p, n) in enumerate(zip(rng.integers(1, 2000, 300), rng.integers(1, 8000, 300),
                                         strict=True))]
    rs.append(RequestTruth("multi", 50, (TurnTruth(100, 30.0, 20), TurnTruth(100))))
    brute = max(request_floor_s(cost, M, 1, r) for r in rs)
    assert rollout_floor_s(cost, M, 1, rs) == brute
    front = pareto_front([r for r in rs if len(r.turns) == 1])
    assert 0 < len(front) < 30


def test_memory_serialises_only_when_nothing_fits(fake_cost) -> None:  # noqa: ANN001
    a, b = pipe("a"), pipe("b")
    assert not never_co_resident(fake_cost, [a, b], 8)  # FakeCost: weights weigh nothing
    assert never_co_resident(fake_cost, [a], 8)  # a sync pipeline never overlaps itself

    class Heavy(BatchCost):
        def rollout_weight_bytes(self, model, tp):  # noqa: ANN001, ANN202
            return 0.6 * ACCELERATORS["h100-80gb"].hbm_bytes

    heavy = Heavy(fake_cost)
    assert never_co_resident(heavy, [a, b], 1)
    rep = makespan_bound([a, b], lambda _p, _k: reqs(4, 4), heavy, 1)
    assert "pool/serial" in rep.terms


def test_the_bound_holds_at_every_rollout_tp_a_schedule_may_run() -> None:
    """The policies run other rollout TPs than the config's (jigsaw's TP search, the baselines'
    TP variants, a tail regroup), so the bound takes each term at its fastest TP: it is at most
    the bound computed at any single one of them, and a pipeline configured at TP 1 gets the
    dependency term of its fastest TP (a wider one: the long tail decodes faster). Before,
    the bound at the config's TP alone was above runs at a searched TP (efficiency up to 1.6
    on configs/scale-64.yaml; docs/BENCHMARKS.md, "The bound at every rollout TP")."""
    from jigsawrl.graph.bound import rollout_tps

    cost = CostModel(ACCELERATORS["h100-80gb"])
    steps = [reqs(200, 900, 3_000, 60, prompt=120), reqs(50, 2_500, 400, prompt=120)]
    p = pipe(steps=2)
    p.spec.batch_size = 4
    tps = rollout_tps(1, M.num_heads, 8)
    assert tps == (1, 2, 4, 8)
    every = makespan_bound([p], lambda _p, k: steps[k], cost, 8)
    at = {tp: makespan_bound([p], lambda _p, k: steps[k], cost, 8, tps_of=lambda _p, t=tp: (t,))
          for tp in tps}
    assert every.bound_s <= min(b.bound_s for b in at.values()) + 1e-9
    assert every.terms["dependency/p"] == pytest.approx(
        min(b.terms["dependency/p"] for b in at.values()))
    assert every.terms["dependency/p"] < at[1].terms["dependency/p"]  # a wider TP is faster
    for term in ("pool/bandwidth", "pool/compute"):
        assert every.terms[term] == pytest.approx(min(b.terms[term] for b in at.values()))
