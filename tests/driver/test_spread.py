"""Spread (a running rollout grows onto new ranks) through the driver + simulated executor."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_loop import FixedExecutor, experiment
from test_migration import samples
from test_regroup import run

from jigsawrl.driver.state import InvariantError
from jigsawrl.events import Span, StepFinished
from jigsawrl.scheduler import Decision, get_policy
from jigsawrl.scheduler.base import Migrate, PolicyBase, Spread, StartRollout
from jigsawrl.stages import Stage


class NarrowThenSpread(PolicyBase):
    """verl-split, its rollout started on the first device only; once the rollout reports
    ``trigger`` unfinished requests on its one rank, ``spread_to`` is added (once)."""

    name = "test"
    wants_rank_progress = True

    def __init__(self, trigger: tuple[int, ...], spread_to: tuple[int, ...]) -> None:
        self.inner = get_policy("verl-split")
        self.trigger, self.spread_to = trigger, spread_to
        self.done = False

    def decide(self, view):  # noqa: ANN001, ANN201
        acts = [replace(a, devices=a.devices[:1]) if isinstance(a, StartRollout) else a
                for a in self.inner.decide(view).actions]
        for t in view.pipelines[0].running:
            if t.stage == Stage.ROLLOUT and not self.done and t.unfinished_per_rank == self.trigger:
                self.done = True
                acts.append(Spread(t.task_id, self.spread_to))
        return Decision(tuple(acts))


class NoSpreadExecutor(FixedExecutor):
    """A simulated executor that says it cannot spread."""

    def __init__(self, *a, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*a, **kw)
        self.can_spread = False


def test_spread_moves_the_latest_admitted_request_to_the_new_rank(fake_cost) -> None:  # noqa: ANN001
    # Three requests on one rank (device 0): the 5-token one finishes at 5.3 s (a prefill of 30
    # tokens, 0.3 s, then 5 iterations at 1 s); two are left, 5 tokens generated each.
    # The spread onto device 1 moves the one admitted last (request 2) there: its new engine
    # wakes (a weight sync: 1 s), re-prefills its 15 tokens (0.15 s) and decodes its 15 left.
    res = run(NarrowThenSpread((2,), (1,)), {"p0": [5, 20, 20]}, fake_cost)
    assert samples(res) == ["p0/0/0", "p0/0/1", "p0/0/2"]  # none lost, none duplicated
    spans = [s for s in res.events if isinstance(s, Span) and s.pipeline == "p0"]
    new = sorted(((s.stage, s.devices, round(s.start_s, 4), round(s.end_s, 4))
                  for s in spans if s.rank == 1), key=lambda x: x[2])
    assert new == [(Stage.PREFILL, (1,), 5.3, 6.45), (Stage.DECODE_SMALL, (1,), 6.45, 21.45)]
    old = max(s.end_s for s in spans if s.rank == 0 and s.stage == Stage.DECODE_SMALL)
    assert old == pytest.approx(20.3)  # request 1 alone: 15 more iterations from 5.3 s
    step = next(e for e in res.events if isinstance(e, StepFinished))
    assert step.timings_s["gen"] == pytest.approx(21.45)


class MigrateThenSpread(NarrowThenSpread):
    """verl-split on both devices; rank 1 is migrated onto rank 0 (device 1 released) at the
    first report, then the rollout spreads back onto device 1 at the next one."""

    def decide(self, view):  # noqa: ANN001, ANN201
        acts = list(self.inner.decide(view).actions)
        for t in view.pipelines[0].running:
            if t.stage != Stage.ROLLOUT or not t.unfinished_per_rank:
                continue
            if len(t.rank_shares) == 2 and min(t.rank_shares) > 0:
                acts.append(Migrate(t.task_id, (1,), 0))
            elif len(t.rank_shares) == 2 and not self.done:
                self.done = True
                acts.append(Spread(t.task_id, (1,)))
        return Decision(tuple(acts))


def test_a_rollout_spreads_back_onto_a_device_it_released(fake_cost) -> None:  # noqa: ANN001
    pol = MigrateThenSpread((), ())
    res = run(pol, {"p0": [2, 20, 20, 20]}, fake_cost)
    assert pol.done
    assert samples(res) == ["p0/0/0", "p0/0/1", "p0/0/2", "p0/0/3"]
    ranks = {(s.rank, s.devices) for s in res.events if isinstance(s, Span)
             and s.stage == Stage.DECODE_SMALL}
    assert {(0, (0,)), (2, (1,))} <= ranks  # rank 2: the spread, on device 1 again


def test_spread_is_refused_where_it_cannot_run(fake_cost) -> None:  # noqa: ANN001
    with pytest.raises(InvariantError, match="cannot spread a rollout"):
        run(NarrowThenSpread((2,), (1,)), {"p0": [5, 20, 20]}, fake_cost,
            executor=NoSpreadExecutor)
    with pytest.raises(InvariantError, match="cannot spread onto"):  # a device it holds
        run(NarrowThenSpread((2,), (0,)), {"p0": [5, 20, 20]}, fake_cost)
    with pytest.raises(InvariantError, match="does not exist"):
        run(NarrowThenSpread((2,), (5,)), {"p0": [5, 20, 20]}, fake_cost)


def test_both_executors_say_they_can_spread(fake_cost) -> None:  # noqa: ANN001
    from jigsawrl.executors.raycluster.executor import RayExecutor

    assert RayExecutor.can_spread is True  # tests/executors/test_ray_executor.py runs one
    exp = experiment()
    assert FixedExecutor(exp, truth_cost=fake_cost, seed=0, lengths={}).can_spread is True
