"""A killed device worker in a real multi-pipeline run: the train states it held are rebuilt on
its replacement (host copy + the passes run since), every pipeline finishes, and the run returns
its summary. (Before train states were rebuilt, the pipelines whose state it held failed with
"whose worker died"; the drills now check that none does.)

Each drill kills a worker at a deterministic point, from the executor's ``on_call`` hook (right
after a call's submission), and waits until every call in flight on it has failed
(``kill_device(wait=True)``), so that the executor reads all those failures at once. Tiny real
pipelines (see ``test_ray_executor``), a few steps; ~30 s each on a 2-core machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from test_ray_executor import check_run, run_with_policy, tiny  # noqa: E402

from jigsawrl.config import load_config  # noqa: E402
from jigsawrl.events import PipelineFailed  # noqa: E402
from jigsawrl.executors.raycluster.records import Call, CallKind  # noqa: E402
from jigsawrl.scheduler.base import (  # noqa: E402
    Decision,
    PolicyBase,
    StartRollout,
    StartStage,
    View,
)
from jigsawrl.stages import Stage  # noqa: E402

LOST = "whose worker died"  # what the failure of a pipeline whose train state died says


class Pinned(PolicyBase):
    """verl's stage-after-stage steps, each pipeline's rollout on ``rollout[name]`` and its other
    device stages on ``train[name]``, every call at share 0.5: two pipelines share a device."""

    name = "pinned"

    def __init__(self, rollout: dict[str, tuple[int, ...]],
                 train: dict[str, tuple[int, ...]]) -> None:
        self.rollout, self.train = rollout, train

    def decide(self, view: View) -> Decision:
        actions: list[StartRollout | StartStage] = []
        for pv in view.pipelines:
            if pv.finished or pv.running:
                continue
            for step, stage in pv.ready(force_sync=True):
                if stage == Stage.ROLLOUT:
                    actions.append(StartRollout(pv.name, step, self.rollout[pv.name], share=0.5))
                elif stage == Stage.REWARD:
                    actions.append(StartStage(pv.name, step, stage, (), share=0.0))
                else:
                    actions.append(StartStage(pv.name, step, stage, self.train[pv.name],
                                              share=0.5))
        return Decision(tuple(actions))


class Drill:
    """Kills device ``when(ex, call)``'s worker at the first call it names; records which
    pipelines' train states were on that device then."""

    def __init__(self, when: Any) -> None:
        self.when = when
        self.device: int | None = None
        self.doomed: set[str] = set()

    def install(self, ex: Any) -> None:
        def on_call(call: Call) -> None:
            device = None if self.device is not None else self.when(ex, call)
            if device is None:
                return
            self.device = device
            self.doomed = {n for n in ex.state.pipes if ex.train_state_device(n) == device}
            ex.kill_device(device, wait=True)

        ex.on_call = on_call


def check_faulted_run(summary: dict[str, Any], events: list[Any], drill: Drill,
                      steps: int, names: tuple[str, ...]) -> None:
    """The doomed pipelines' train states were rebuilt: no pipeline failed (none with the
    lost-state error), every one finished every step with each sample once."""
    assert drill.device is not None, "the drill never found its kill point"
    assert summary["replaced_devices"] == [drill.device]
    assert summary["failed_pipelines"] == []
    failed = [e for e in events if isinstance(e, PipelineFailed)]
    assert not failed, [f.error for f in failed]
    assert not any(LOST in f.error for f in failed)
    assert summary["recovered"]["train_states_restored"] >= len(drill.doomed)
    check_run(summary, events, dict.fromkeys(names, steps))


def test_worker_killed_during_update_of_its_resident_state(shared_ray: Any, cache: Path) -> None:
    """arithmetic trains on device 0 (its train state lives there) while calculator's rollout
    slices queue on the same worker; the worker dies during arithmetic's actor_update. Its update
    and calculator's slice fail in one batch: arithmetic's train state is rebuilt on the new
    worker and its update runs again, calculator's requests go on there, and the run ends with
    a summary (it crashed with ``KeyError: ObjectRef(...)`` in
    ``advance``: the recovery had already dropped the slice's call)."""

    def update_beside_a_slice(ex: Any, call: Call) -> int | None:
        if call.kind != CallKind.CHUNK or call.worker != 0:
            return None
        updating = [c for c in ex.state.calls.values() if c.stage == Stage.ACTOR_UPDATE
                    and c.worker == 0 and ex.train_state_device(c.pipeline) == 0]
        return 0 if updating else None

    drill = Drill(update_beside_a_slice)
    policy = Pinned(rollout={"arithmetic": (0,), "calculator": (0,)},
                    train={"arithmetic": (0,), "calculator": (1,)})
    summary, events = run_with_policy(tiny(steps=3), policy, cache, drill.install)
    assert drill.doomed == {"arithmetic"}
    check_faulted_run(summary, events, drill, 3, ("arithmetic", "calculator"))


def test_worker_killed_during_a_slice_of_its_resident_pipeline(shared_ray: Any,
                                                              cache: Path) -> None:
    """The three demo pipelines on two devices: search rolls out and trains on device 0,
    countdown and calculator share device 1. The worker of device 0 dies during a rollout slice
    of search (step 1: search's train state lives there since its step-0 passes). search's
    state is rebuilt; all three finish every step and the run returns its summary (it died with
    ``SchedulerStalled``: the dead slice's rank still looked in flight, so search's rollout was
    never resubmitted nor failed, and the driver waited on it with nothing running)."""
    steps = 2
    sets = [f"pipelines.{i}.{k}={v}" for i in (0, 1, 2) for k, v in (
        ("steps", steps), ("batch_size", 2), ("group_size", 2), ("train.warmup_steps", 2))]
    cfg = load_config("configs/real/demo.yaml", sets)
    names = tuple(p.name for p in cfg.pipelines)
    assert set(names) == {"countdown", "calculator", "search"}

    def slice_of_search_on_its_holder(ex: Any, call: Call) -> int | None:
        holder = ex.train_state_device("search")
        if call.kind == CallKind.CHUNK and call.pipeline == "search" and call.worker == holder:
            return holder
        return None

    drill = Drill(slice_of_search_on_its_holder)
    devices = {"search": (0,), "countdown": (1,), "calculator": (1,)}
    summary, events = run_with_policy(cfg, Pinned(devices, devices), cache, drill.install)
    assert drill.device == 0 and drill.doomed == {"search"}
    check_faulted_run(summary, events, drill, steps, names)
