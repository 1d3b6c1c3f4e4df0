"""Checkpoints are crash-safe: a failure or a kill at any moment of a save leaves the previous
checkpoint (or the new one) readable, and never a half-written folder under a ``step-*`` name."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from jigsawrl.engine import checkpoint as ck  # noqa: E402
from jigsawrl.engine.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint  # noqa: E402,I001

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


def _model_and_opt(fill: float = 1.0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(fill)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _assert_intact(root: Path, step: int, fill: float) -> None:
    """``latest`` is the checkpoint of ``step``, loadable, with the weights it was saved with;
    every visible ``step-*`` folder is complete and loadable."""
    path = latest_checkpoint(root)
    assert path is not None and path.name == f"step-{step:06d}"
    ckpt = load_checkpoint(path)
    assert ckpt.step == step and torch.all(ckpt.model["weight"] == fill)
    for folder in root.glob("step-*"):
        assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "state.pt"]
        load_checkpoint(folder)


def _half_then_fail(obj: object, f: io.BufferedWriter) -> None:
    buf = io.BytesIO()
    torch.serialization.save(obj, buf)
    f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
    raise OSError("disk full (simulated) halfway through state.pt")


def test_serialiser_failing_halfway_keeps_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    save_checkpoint(tmp_path, 1, *_model_and_opt(1.0))
    monkeypatch.setattr(ck.torch, "save", _half_then_fail)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(tmp_path, 2, *_model_and_opt(2.0))
    _assert_intact(tmp_path, 1, 1.0)
    assert not (tmp_path / "step-000002").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000001"]  # no leftovers


def test_failed_resave_of_the_same_step_keeps_its_previous_version(tmp_path, monkeypatch) -> None:
    save_checkpoint(tmp_path, 4, *_model_and_opt(1.0))
    real_rename = os.rename
    calls: list[str] = []

    def rename_then_fail(src, dst):  # the old folder moves aside, then the new one fails to land
        calls.append(Path(dst).name)
        if len(calls) == 2:
            raise OSError("simulated failure between the two renames")
        real_rename(src, dst)

    monkeypatch.setattr(ck.os, "rename", rename_then_fail)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(tmp_path, 4, *_model_and_opt(2.0))
    monkeypatch.undo()
    assert calls[0].startswith(".old-step-000004-") and calls[1] == "step-000004"
    _assert_intact(tmp_path, 4, 1.0)  # put back
    save_checkpoint(tmp_path, 4, *_model_and_opt(3.0))  # a successful re-save replaces it
    _assert_intact(tmp_path, 4, 3.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000004"]


def test_a_kill_between_the_renames_still_finds_the_moved_aside_version(tmp_path) -> None:
    """What a SIGKILL right after moving the old folder aside leaves behind."""
    save_checkpoint(tmp_path, 1, *_model_and_opt(1.0))
    save_checkpoint(tmp_path, 2, *_model_and_opt(2.0))
    os.rename(tmp_path / "step-000002", tmp_path / ".old-step-000002-123-abcd")
    (tmp_path / ".tmp-step-000002-123-ef01").mkdir()  # the new one, unfinished
    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == ".old-step-000002-123-abcd"
    assert torch.all(load_checkpoint(path).model["weight"] == 2.0)


def test_marker_failure_leaves_the_previous_latest(tmp_path, monkeypatch) -> None:
    save_checkpoint(tmp_path, 1, *_model_and_opt(1.0))

    def fail(src, dst):
        raise OSError("simulated failure replacing the marker")

    monkeypatch.setattr(ck.os, "replace", fail)
    with pytest.raises(OSError, match="marker"):
        save_checkpoint(tmp_path, 2, *_model_and_opt(2.0))
    monkeypatch.undo()
    _assert_intact(tmp_path, 1, 1.0)  # the marker still names step 1; step 2 is complete too
    assert torch.all(load_checkpoint(tmp_path / "step-000002").model["weight"] == 2.0)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_unserialisable_meta_writes_nothing(tmp_path) -> None:
    save_checkpoint(tmp_path, 1, *_model_and_opt(1.0))
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, 2, *_model_and_opt(2.0), {"bad": object()})
    _assert_intact(tmp_path, 1, 1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000001"]


def test_incomplete_or_damaged_folders_are_skipped(tmp_path) -> None:
    save_checkpoint(tmp_path, 1, *_model_and_opt(1.0))
    (tmp_path / "step-000009").mkdir()
    (tmp_path / "step-000009" / "state.pt").write_text("no meta.json: not complete")
    (tmp_path / "latest").write_bytes(b"\xff\xfe")
    assert latest_checkpoint(tmp_path).name == "step-000001"  # type: ignore[union-attr]
    (tmp_path / "latest").write_text("step-000007")  # names a folder that does not exist
    assert latest_checkpoint(tmp_path).name == "step-000001"  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- real kills

_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    from jigsawrl.engine import checkpoint as ck
    torch.set_num_threads(1)
    root, mode = Path(sys.argv[1]), sys.argv[2]
    def model(fill):
        m = torch.nn.Linear(3, 2)
        with torch.no_grad():
            m.weight.fill_(fill)
        return m, torch.optim.AdamW(m.parameters(), lr=0.1)
    ck.save_checkpoint(root, 1, *model(1.0))
    if mode == "block":
        real = torch.save
        def half_then_hang(obj, f):
            real(obj, f)
            f.flush()
            f.truncate(f.tell() // 2)
            (root.parent / "ready").write_text("x")
            time.sleep(120)
        ck.torch.save = half_then_hang
        ck.save_checkpoint(root, 2, *model(2.0))
    else:
        step = 2
        while True:
            ck.save_checkpoint(root, step, *model(float(step)))
            step += 1
""")


def _writer(tmp_path: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "ck"), mode], env=env)


def _wait_for(cond, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert proc.poll() is None, "the writer died on its own"
        assert time.monotonic() < deadline, "the writer did not get there in time"
        time.sleep(0.01)


def test_sigkill_in_the_middle_of_writing_state_keeps_the_previous(tmp_path) -> None:
    proc = _writer(tmp_path, "block")
    try:
        _wait_for((tmp_path / "ready").exists, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    root = tmp_path / "ck"
    _assert_intact(root, 1, 1.0)
    assert not (root / "step-000002").exists()
    leftovers = [p.name for p in root.iterdir() if p.name not in ("latest", "step-000001")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-step-000002-")


def test_sigkill_at_a_random_moment_of_repeated_saves(tmp_path) -> None:
    proc = _writer(tmp_path, "loop")
    root = tmp_path / "ck"
    try:
        _wait_for(lambda: (root / "step-000004").exists(), proc)
        time.sleep(0.003 * (os.getpid() % 17))  # somewhere inside a later save
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    path = latest_checkpoint(root)
    assert path is not None
    step = load_checkpoint(path).step
    # step-000004 existed, so step 3 was marked (step 4's marker may not have been written yet)
    assert step >= 3 and torch.all(load_checkpoint(path).model["weight"] == float(step))
    for folder in root.glob("step-*"):  # every visible checkpoint is whole
        ckpt = load_checkpoint(folder)
        assert torch.all(ckpt.model["weight"] == float(ckpt.step)) and ckpt.step <= step + 1
