"""Exact timeline of verl on a toy workload, through the real driver and simulated executor."""

from __future__ import annotations

import pytest

from jigsawrl.config import validate_config
from jigsawrl.driver.loop import MAX_BACKGROUND_ROUNDS, Driver, SchedulerStalled
from jigsawrl.driver.state import InvariantError
from jigsawrl.events import SampleFinished, Span, StepFinished
from jigsawrl.executors.simulated import SimulatedExecutor
from jigsawrl.experiments.resolve import resolve
from jigsawrl.scheduler import Decision, StartStage, get_policy
from jigsawrl.scheduler.base import PolicyBase
from jigsawrl.stages import Stage
from jigsawrl.workload.requests import RequestTruth, TurnTruth


class FixedExecutor(SimulatedExecutor):
    """Simulated executor whose step requests are given, not sampled."""

    def __init__(self, *a, lengths: dict[str, list[int]], **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*a, **kw)
        self.lengths = lengths

    def step_requests(self, pipe, step):  # noqa: ANN001
        return [RequestTruth(f"{pipe.spec.name}/{step}/{i}", 10, (TurnTruth(n),))
                for i, n in enumerate(self.lengths[pipe.spec.name])]


def experiment(n_pipes: int = 1, steps: int = 1, devices: int = 2):  # noqa: ANN201
    cfg = validate_config({
        "cluster": {"accelerator": "h100-80gb", "num_nodes": 1, "accelerators_per_node": devices},
        "pipelines": [{"name": f"p{i}", "model": "qwen3-0.6b", "task": "gsm8k", "batch_size": 2,
                       "group_size": 1, "steps": steps, "max_response_tokens": 1024}
                      for i in range(n_pipes)],
    })
    return resolve(cfg)


def run(exp, policy: str, lengths, fake_cost):  # noqa: ANN001, ANN201
    ex = FixedExecutor(exp, truth_cost=fake_cost, seed=0, lengths=lengths)
    return Driver(exp, get_policy(policy), ex, fake_cost).run()


def test_verl_single_step_exact_timeline(fake_cost) -> None:  # noqa: ANN001
    exp = experiment()
    res = run(exp, "verl-split", {"p0": [3, 6]}, fake_cost)
    spans = sorted((s.stage, s.rank, round(s.start_s, 6), round(s.end_s, 6))
                   for s in res.events if isinstance(s, Span))
    tokens = 10 + 3 + 10 + 6
    t_roll = 0.1 + 6  # rank 1: prefill of 10 tokens then 6 iterations
    t = [t_roll, t_roll + 0.5]
    t.append(t[-1] + 0.001 * tokens / 2)
    t.append(t[-1] + 0.001 * tokens / 2)
    t.append(t[-1] + 0.003 * tokens / 2)
    t.append(t[-1] + 1.0)
    assert spans == sorted([
        (Stage.PREFILL, 0, 0.0, 0.1), (Stage.DECODE_SMALL, 0, 0.1, 3.1),
        (Stage.PREFILL, 1, 0.0, 0.1), (Stage.DECODE_SMALL, 1, 0.1, 6.1),
        (Stage.REWARD, 0, round(t[0], 6), round(t[1], 6)),
        (Stage.OLD_LOGPROB, 0, round(t[1], 6), round(t[2], 6)),
        (Stage.REF_LOGPROB, 0, round(t[2], 6), round(t[3], 6)),
        (Stage.ACTOR_UPDATE, 0, round(t[3], 6), round(t[4], 6)),
        (Stage.WEIGHT_SYNC, 0, round(t[4], 6), round(t[5], 6)),
    ])
    (step,) = [e for e in res.events if isinstance(e, StepFinished)]
    assert step.end_s == pytest.approx(t[5])
    assert step.timings_s["gen"] == pytest.approx(t_roll)
    assert step.timings_s["step"] == pytest.approx(t[5])
    samples = [e for e in res.events if isinstance(e, SampleFinished)]
    assert sorted(e.time_s for e in samples) == pytest.approx([3.1, 6.1])


def test_verl_split_runs_pipelines_in_parallel_serial_one_after_another(fake_cost) -> None:  # noqa: ANN001
    exp = experiment(n_pipes=2, steps=2, devices=2)
    lengths = {"p0": [3, 6], "p1": [3, 6]}
    split = run(exp, "verl-split", lengths, fake_cost)
    serial = run(exp, "verl-serial", lengths, fake_cost)
    end = {r: {e.pipeline: e.end_s for e in res.events if isinstance(e, StepFinished)}
           for r, res in (("split", split), ("serial", serial))}
    assert end["split"]["p0"] == pytest.approx(end["split"]["p1"])
    assert end["serial"]["p1"] > end["serial"]["p0"]
    p1_spans = [s for s in serial.events if isinstance(s, Span) and s.pipeline == "p1"]
    assert min(s.start_s for s in p1_spans) >= end["serial"]["p0"] - 1e-9
    devs = {s.devices for s in split.events if isinstance(s, Span) and s.pipeline == "p1"}
    assert devs <= {(1,), ()}  # () = the reward on the CPU


class Greedy(PolicyBase):
    name = "bad"

    def __init__(self, action) -> None:  # noqa: ANN001
        self.action = action

    def decide(self, view):  # noqa: ANN001, ANN201
        return Decision((self.action,) if self.action else ())


def test_driver_rejects_not_ready_and_stalls(fake_cost) -> None:  # noqa: ANN001
    exp = experiment()
    ex = FixedExecutor(exp, truth_cost=fake_cost, seed=0, lengths={"p0": [1, 1]})
    bad = Greedy(StartStage("p0", 0, Stage.ACTOR_UPDATE, (0, 1)))
    with pytest.raises(InvariantError, match="not ready"):
        Driver(exp, bad, ex, fake_cost).run()
    ex = FixedExecutor(exp, truth_cost=fake_cost, seed=0, lengths={"p0": [1, 1]})
    with pytest.raises(SchedulerStalled, match="started nothing"):
        Driver(exp, Greedy(None), ex, fake_cost).run()


class LosingExecutor(FixedExecutor):
    """Accepts every task and runs none of them (an executor that lost its tasks)."""

    def launch(self, action) -> None:  # noqa: ANN001
        pass


def test_stall_names_the_tasks_the_executor_lost(fake_cost) -> None:  # noqa: ANN001
    """A task the executor neither finished nor failed stalls the driver; the error names it."""
    exp = experiment()
    ex = LosingExecutor(exp, truth_cost=fake_cost, seed=0, lengths={"p0": [1, 1]})
    with pytest.raises(SchedulerStalled, match=r"no longer runs: \['p0/0/rollout'\]"):
        Driver(exp, get_policy("verl-split"), ex, fake_cost).run()


class Counting(PolicyBase):
    """verl-split that wants rank progress, counts its decisions and the reports it was asked
    about, and wakes on a report only when ``wake`` says so."""

    name = "counting"
    wants_rank_progress = True

    def __init__(self, wake: bool) -> None:
        self.inner = get_policy("verl-split")
        self.wake = wake
        self.decisions = 0
        self.asked: list[tuple[int, ...]] = []

    def decide(self, view):  # noqa: ANN001, ANN201
        self.decisions += 1
        return self.inner.decide(view)

    def wakes_on_progress(self, task, unfinished) -> bool:  # noqa: ANN001
        assert task.stage == Stage.ROLLOUT and len(unfinished) == len(task.rank_devices)
        self.asked.append(tuple(unfinished))
        return self.wake


def test_rank_progress_wakes_the_policy_only_when_it_says_so(fake_cost) -> None:  # noqa: ANN001
    exp = experiment(n_pipes=1, steps=2)
    lengths = {"p0": [30, 300]}
    runs = {}
    for wake in (False, True):
        pol = Counting(wake)
        ex = FixedExecutor(exp, truth_cost=fake_cost, seed=0, lengths=lengths)
        runs[wake] = (pol, Driver(exp, pol, ex, fake_cost).run())
    quiet, woken = runs[False][0], runs[True][0]
    assert quiet.asked == woken.asked and quiet.asked  # asked about every report, with its counts
    assert any(0 in counts for counts in quiet.asked)  # a rank drained while the other ran
    # each report the policy woke on costs one decision more; the run is the same (verl-split
    # reads no counts)
    assert woken.decisions == quiet.decisions + len(woken.asked)
    assert runs[False][1].events == runs[True][1].events


class FinishingExecutor(FixedExecutor):
    """Counts ``finish`` calls; its clock moves on inside one (as a real one's would)."""

    def __init__(self, *a, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*a, **kw)
        self.finished = 0
        self.extra_s = 0.0

    @property
    def now_s(self) -> float:
        return super().now_s + self.extra_s

    def finish(self) -> None:
        self.finished += 1
        self.extra_s = 100.0


def test_finish_runs_once_after_the_run_and_outside_its_makespan(fake_cost) -> None:  # noqa: ANN001
    exp = experiment()
    plain = run(exp, "verl-split", {"p0": [3, 6]}, fake_cost)
    ex = FinishingExecutor(exp, truth_cost=fake_cost, seed=0, lengths={"p0": [3, 6]})
    res = Driver(exp, get_policy("verl-split"), ex, fake_cost).run()
    assert ex.finished == 1
    assert res.makespan_s == pytest.approx(plain.makespan_s) and res.makespan_s > 0


class Deferring(PolicyBase):
    """verl-split that, at each new instant, first leaves its decision to background work and
    starts nothing; it decides once the work has run (``endless``: the work never settles it)."""

    name = "deferring"

    def __init__(self, endless: bool = False) -> None:
        self.inner = get_policy("verl-split")
        self.endless = endless
        self.settled: float | None = None  # the instant whose work has run
        self.pending: float | None = None
        self.log: list[tuple[str, float]] = []

    def decide(self, view):  # noqa: ANN001, ANN201
        self.log.append(("decide", view.now_s))
        if self.settled != view.now_s:
            self.pending = view.now_s
            return Decision(())
        return self.inner.decide(view)

    def background(self):  # noqa: ANN201
        if self.pending is None:
            return None
        t = self.pending
        self.pending = None if not self.endless else t

        def work() -> None:
            self.log.append(("work", t))
            if not self.endless:
                self.settled = t
        return work


def test_background_work_runs_after_the_decision_and_the_policy_decides_again(fake_cost) -> None:  # noqa: ANN001,E501
    exp = experiment(n_pipes=1, steps=2)
    lengths = {"p0": [30, 300]}
    plain = run(exp, "verl-split", lengths, fake_cost)
    pol = Deferring()
    res = Driver(exp, pol, FixedExecutor(exp, truth_cost=fake_cost, seed=0, lengths=lengths),
                 fake_cost).run()
    # the same run: each instant's decision waited for its work, and the clock did not move
    assert res.events == plain.events and res.makespan_s == plain.makespan_s
    works = [i for i, (kind, _) in enumerate(pol.log) if kind == "work"]
    assert works and len(res.background_times_s) == len(works)
    for i in works:  # a decision before the work and one after it, at the same instant
        assert pol.log[i - 1] == ("decide", pol.log[i][1]) == pol.log[i + 1]
    assert len(res.decision_times_s) == len(pol.log) - len(works)  # work is not a decision


def test_a_policy_that_always_wants_work_does_not_hold_the_clock(fake_cost) -> None:  # noqa: ANN001
    exp = experiment()
    pol = Deferring(endless=True)
    with pytest.raises(SchedulerStalled):  # it never starts anything; the driver still moves on
        Driver(exp, pol, FixedExecutor(exp, truth_cost=fake_cost, seed=0,
                                       lengths={"p0": [3, 6]}), fake_cost).run()
    assert sum(kind == "work" for kind, _ in pol.log) == MAX_BACKGROUND_ROUNDS
