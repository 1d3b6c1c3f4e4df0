"""Regroup (a rollout's ranks re-formed as one TP group) through the driver + simulated executor."""

from __future__ import annotations

import pytest
from test_loop import FixedExecutor, experiment
from test_migration import MigratingVerl, samples

from jigsawrl.driver.loop import Driver
from jigsawrl.driver.state import InvariantError
from jigsawrl.events import Span, StepFinished
from jigsawrl.scheduler import Regroup
from jigsawrl.stages import Stage


class NoRegroupExecutor(FixedExecutor):
    """A simulated executor that says it cannot regroup (as the Ray executor does)."""

    def __init__(self, *a, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*a, **kw)
        self.can_regroup = False


def run(policy, lengths, fake_cost, executor=FixedExecutor, devices=2):  # noqa: ANN001, ANN201
    exp = experiment(devices=devices)
    ex = executor(exp, truth_cost=fake_cost, seed=0, lengths=lengths)
    return Driver(exp, policy, ex, fake_cost).run()


def test_regroup_resumes_the_tail_on_all_devices(fake_cost) -> None:  # noqa: ANN001
    # rank 0 drains at t=3.1 (a 3-token request); rank 1's request has 17 tokens left and 13
    # in context. Regrouped onto rank 0 over devices (0, 1): the new engine wakes (a weight
    # sync: 1 s) and re-prefills 13 tokens (0.13 s) before decoding the 17 left.
    pol = MigratingVerl(lambda t: Regroup(t.task_id, (1,), 0))
    res = run(pol, {"p0": [3, 20]}, fake_cost)
    assert samples(res) == ["p0/0/0", "p0/0/1"]  # none lost, none duplicated
    spans = [s for s in res.events if isinstance(s, Span) and s.pipeline == "p0"]
    after = sorted((s.stage, s.devices, round(s.start_s, 4), round(s.end_s, 4))
                   for s in spans if s.rank == 0 and s.start_s >= 3.1)
    assert (Stage.PREFILL, (0, 1), 3.1, 4.23) in after
    assert (Stage.DECODE_SMALL, (0, 1), 4.23, 21.23) in after
    assert max(s.end_s for s in spans if s.rank == 1) == pytest.approx(3.1)
    step = next(e for e in res.events if isinstance(e, StepFinished))
    assert step.timings_s["gen"] == pytest.approx(21.23)


def test_regroup_is_refused_where_it_cannot_run(fake_cost) -> None:  # noqa: ANN001
    with pytest.raises(InvariantError, match="cannot regroup"):
        run(MigratingVerl(lambda t: Regroup(t.task_id, (1,), 0)), {"p0": [3, 20]}, fake_cost,
            executor=NoRegroupExecutor)
    with pytest.raises(InvariantError, match="bad regroup"):
        run(MigratingVerl(lambda t: Regroup(t.task_id, (0,), 0)), {"p0": [3, 20]}, fake_cost)
    # three devices of qwen3-0.6b (16 heads) are no TP group
    with pytest.raises(InvariantError, match="cannot form one TP group"):
        run(MigratingVerl(lambda t: Regroup(t.task_id, (1, 2), 0)), {"p0": [3, 20, 20]},
            fake_cost, devices=3)


def test_the_ray_executor_cannot_regroup_by_default() -> None:
    """Only one built with ``regroup=True`` says it can (tests/executors/test_ray_executor.py
    runs one)."""
    from jigsawrl.executors.raycluster.executor import RayExecutor

    assert RayExecutor.can_regroup is False
