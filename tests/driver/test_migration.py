"""Migration, interruption, per-rank shares and dispatch through the driver + simulated executor."""

from __future__ import annotations

import pytest
from test_loop import FixedExecutor, experiment

from jigsawrl.driver.loop import Driver
from jigsawrl.driver.state import InvariantError
from jigsawrl.events import SampleFinished, Span, StepFinished
from jigsawrl.scheduler import Decision, Interrupt, Migrate, SetShare, get_policy
from jigsawrl.scheduler.base import PolicyBase, task_id
from jigsawrl.stages import Stage


class MigratingVerl(PolicyBase):
    """verl-split plus one action injected when rank 0 of step 0's rollout drains."""

    name = "test"
    wants_rank_progress = True

    def __init__(self, action_for) -> None:  # noqa: ANN001
        self.inner = get_policy("verl-split")
        self.action_for = action_for
        self.done = False

    def decide(self, view):  # noqa: ANN001, ANN201
        d = self.inner.decide(view)
        for t in view.pipelines[0].running:
            if t.stage == Stage.ROLLOUT and not self.done and t.unfinished_per_rank[:1] == (0,):
                self.done = True
                return Decision(d.actions + (self.action_for(t),))
        return d


def run(policy, lengths, fake_cost, devices=2):  # noqa: ANN001, ANN201
    exp = experiment(devices=devices)
    ex = FixedExecutor(exp, truth_cost=fake_cost, seed=0, lengths=lengths)
    return Driver(exp, policy, ex, fake_cost).run()


def samples(res):  # noqa: ANN001, ANN201
    return sorted(e.sample_id for e in res.events if isinstance(e, SampleFinished))


def test_migration_moves_requests_and_conserves_samples(fake_cost) -> None:  # noqa: ANN001
    # rank 0 has a 3-token request, rank 1 a 20-token one; when rank 0 drains at t=3.1, rank 1's
    # request has 17 left... we move rank 1 onto rank 0 instead (src 1 -> dst 0).
    pol = MigratingVerl(lambda t: Migrate(t.task_id, (1,), 0))
    res = run(pol, {"p0": [3, 20]}, fake_cost)
    assert samples(res) == ["p0/0/0", "p0/0/1"]  # none lost, none duplicated
    spans = [s for s in res.events if isinstance(s, Span) and s.pipeline == "p0"]
    r0 = sorted((s.stage, round(s.start_s, 4), round(s.end_s, 4)) for s in spans if s.rank == 0
                and s.stage in (Stage.PREFILL, Stage.DECODE_SMALL))
    # re-prefill of prompt (10) + 3 generated tokens = 13 tokens = 0.13 s on rank 0, then 17 more
    assert (Stage.PREFILL, 3.1, 3.23) in r0
    assert (Stage.DECODE_SMALL, 3.23, 20.23) in r0
    r1_end = max(s.end_s for s in spans if s.rank == 1 and s.stage == Stage.DECODE_SMALL)
    assert r1_end == pytest.approx(3.1)
    step = next(e for e in res.events if isinstance(e, StepFinished))
    assert step.timings_s["gen"] == pytest.approx(20.23)


def test_interrupt_resumes_in_place(fake_cost) -> None:  # noqa: ANN001
    pol = MigratingVerl(lambda t: Interrupt(t.task_id))
    res = run(pol, {"p0": [3, 20]}, fake_cost)
    assert samples(res) == ["p0/0/0", "p0/0/1"]
    gen = next(e for e in res.events if isinstance(e, StepFinished)).timings_s["gen"]
    assert gen == pytest.approx(20.1 + 0.13)  # rank 1 re-prefills its 13 tokens


def test_per_rank_share_and_released_rank_errors(fake_cost) -> None:  # noqa: ANN001
    pol = MigratingVerl(lambda t: SetShare(t.task_id, 0.5, rank=1))
    res = run(pol, {"p0": [3, 20]}, fake_cost)
    shares = {s.compute_share for s in res.events if isinstance(s, Span) and s.rank == 1
              and s.stage == Stage.DECODE_SMALL}
    assert shares == {1.0, 0.5}
    bad = MigratingVerl(lambda t: Migrate(t.task_id, (1,), 1))
    with pytest.raises(InvariantError, match="bad migration"):
        run(bad, {"p0": [3, 20]}, fake_cost)


def test_skew_aware_dispatch_balances_load(fake_cost) -> None:  # noqa: ANN001
    from jigsawrl.executors.simulated import SimulatedExecutor
    from jigsawrl.workload.requests import RequestTruth, TurnTruth

    exp = experiment()
    ex = SimulatedExecutor(exp, truth_cost=fake_cost, seed=0)
    reqs = [RequestTruth(f"r{i}", 10, (TurnTruth(n),)) for i, n in
            enumerate([1000, 1000, 10, 10, 10, 10, 10, 10])]
    contiguous = ex._dispatch(reqs, 2, "contiguous", 0)
    skew = ex._dispatch(reqs, 2, "skew_aware", 0)
    assert [r.generated_tokens for r in contiguous[0]][:2] == [1000, 1000]
    assert [sum(r.generated_tokens == 1000 for r in c) for c in skew] == [1, 1]  # long ones split
    assert sum(len(c) for c in skew) == 8
    assert task_id("a", 1, Stage.ROLLOUT) == "a/1/rollout"
