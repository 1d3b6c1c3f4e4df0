"""A killed driver: ``jigsawrl run CONFIG --ray --resume`` continues every pipeline from its last
checkpoint.

The first run (a subprocess, its own session) is SIGKILLed together with the Ray processes it
started as soon as every pipeline has written a checkpoint; the second run resumes from those
checkpoints and finishes the remaining steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

STEPS = 3
SETS = [f"pipelines.{i}.{k}={v}" for i in (0, 1) for k, v in (
    ("steps", STEPS), ("batch_size", 2), ("group_size", 2), ("train.warmup_steps", 2),
    ("train.checkpoint_every", 1))]


def jigsawrl_cmd(*args: str) -> list[str]:
    exe = shutil.which("jigsawrl", path=str(Path(sys.executable).parent))
    return [exe or "jigsawrl", *args]


def checkpoint_step(out: Path, name: str) -> int:
    latest = out / "checkpoints" / name / "latest"
    if not latest.is_file():
        return 0
    meta = out / "checkpoints" / name / latest.read_text().strip() / "meta.json"
    return json.loads(meta.read_text())["step"] if meta.is_file() else 0


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it; a driver that already ended is no error
    here (the caller's own assertion says why it ended)."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for p in [*proc.children(recursive=True), proc]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)


def test_killed_driver_resumes_every_pipeline(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "JIGSAWRL_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    sets = [a for s in SETS for a in ("--set", s)]
    args = jigsawrl_cmd("run", "configs/real/multi.yaml", "--ray", "--out", str(out), *sets)
    first = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and first.poll() is None:
            if all(checkpoint_step(out, n) >= 1 for n in ("arithmetic", "calculator")):
                break
            time.sleep(0.2)
        assert first.poll() is None, "the first run ended before it could be killed"
        done = {n: checkpoint_step(out, n) for n in ("arithmetic", "calculator")}
        assert min(done.values()) >= 1, "no checkpoint within the deadline"
    finally:
        kill_tree(first.pid)
        first.wait()
    if max(done.values()) >= STEPS:
        pytest.skip("the first run finished a pipeline before the kill (machine too fast)")
    second = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    resumed = summary["resumed_from"]
    assert set(resumed) == {"arithmetic", "calculator"}
    assert all(resumed[n] >= done[n] for n in resumed)
    for name in ("arithmetic", "calculator"):
        assert checkpoint_step(out, name) == STEPS
        steps = [m["step"] for m in summary["pipeline_metrics"][name]]
        assert steps == list(range(STEPS)), steps


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warm")


def run_events(out: Path) -> list[Any]:
    from jigsawrl.metrics.rundir import EVENTS_FILE, read_events

    return read_events(out / EVENTS_FILE)


@pytest.mark.chaos
@pytest.mark.slow  # ~2.5 min for the three: run by .ci/run (-m chaos)
@pytest.mark.parametrize(("where", "stage", "nth"), [
    ("mid-rollout", "rollout@2", 1), ("mid-update", "actor_update", 3),
    ("mid-checkpoint", "weight_sync", 3)])
def test_driver_killed_at_a_point_resumes_to_the_same_steps(
        tmp_path: Path, shared_cache: Path, where: str, stage: str, nth: int) -> None:
    """The driver stops right after submitting its ``nth`` call of ``stage`` (a rollout slice
    running, an update running, a checkpoint being written: ``JIGSAWRL_DRILL_FREEZE``) and is
    SIGKILLed with its Ray there; ``--resume`` then finishes every pipeline: the checkpoints
    reach the last step, the metric history holds every step once, and the resumed run holds
    exactly the samples of the steps it ran (each once)."""
    from jigsawrl.events import SampleFinished, StepFinished

    out, marker = tmp_path / "run", tmp_path / "stopped"
    env = {**os.environ, "JIGSAWRL_CACHE": str(shared_cache), "HF_HUB_OFFLINE": "1"}
    sets = [a for s in SETS for a in ("--set", s)]
    args = jigsawrl_cmd("run", "configs/real/multi.yaml", "--ray", "--out", str(out), *sets)
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log_file:
        first = subprocess.Popen(args, env={**env, "JIGSAWRL_DRILL_FREEZE":
                                            f"{stage}:{nth}:{marker}"},
                                 stdout=log_file, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and first.poll() is None and not marker.is_file():
            time.sleep(0.1)
        assert marker.is_file(), (f"the drill never reached {where} (driver exit code "
                                  f"{first.poll()}):\n{log_path.read_text()[-3000:]}")
        time.sleep(0.3)  # the call it stopped at is running on its worker
    finally:
        kill_tree(first.pid)
        first.wait()
    done = {n: checkpoint_step(out, n) for n in ("arithmetic", "calculator")}
    second = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True,
                            timeout=300)
    if min(done.values()) == 0 and "no checkpoint" in second.stderr.lower():
        pytest.skip(f"{where}: killed before any checkpoint (nothing to resume)")
    assert second.returncode == 0, second.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    resumed = summary["resumed_from"]
    events = run_events(out)
    for name in ("arithmetic", "calculator"):
        assert checkpoint_step(out, name) == STEPS
        if resumed.get(name, 0) >= STEPS:  # it had finished before the kill: nothing resumed
            assert name not in summary["pipeline_metrics"]
            continue
        assert [m["step"] for m in summary["pipeline_metrics"][name]] == list(range(STEPS))
        ran = STEPS - resumed.get(name, 0)
        assert resumed.get(name, 0) >= done[name]
        assert sum(isinstance(e, StepFinished) and e.pipeline == name for e in events) == ran
        ids = [e.sample_id for e in events if isinstance(e, SampleFinished) and e.pipeline == name]
        assert len(ids) == len(set(ids)) == ran * 2 * 2, (name, len(ids), ran)
