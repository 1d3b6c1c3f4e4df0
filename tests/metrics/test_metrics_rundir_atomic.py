"""Run folders are crash-safe: a failure or a kill in the middle of writing a file leaves the
previous version of that file whole, no partial file under a final name, and no summary.json
until the whole folder is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jigsawrl.errors import InputError
from jigsawrl.metrics import load_run, rundir, summarize, write_run
from jigsawrl.metrics.rundir import atomic_path, read_events, write_events, write_text_atomic

ROOT = Path(__file__).resolve().parents[2]
FILES = ("config.yaml", "events.jsonl", "trace.json", "summary.json")


def _write(run: Path, events, info, config: str = "seed: 1\n", timeline: bool = False) -> None:
    write_run(run, events=events, summary=summarize(events, info), info=info,
              config_yaml=config, timeline=timeline)


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir()}


def _hidden(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if p.name.startswith("."))


def test_event_serialiser_failing_halfway_keeps_the_previous_events(tmp_path, events, info,
                                                                    monkeypatch) -> None:
    _write(tmp_path, events, info)
    before = _snapshot(tmp_path)
    real, count = rundir.event_to_dict, [0]

    def fail_on_the_fourth(ev):
        count[0] += 1
        if count[0] == 4:
            raise RuntimeError("simulated crash while writing events.jsonl")
        return real(ev)

    monkeypatch.setattr(rundir, "event_to_dict", fail_on_the_fourth)
    with pytest.raises(RuntimeError, match="simulated"):
        _write(tmp_path, events, info, config="seed: 2\n")
    assert (tmp_path / "events.jsonl").read_bytes() == before["events.jsonl"]
    assert read_events(tmp_path / "events.jsonl") == events
    assert (tmp_path / "trace.json").read_bytes() == before["trace.json"]
    assert (tmp_path / "config.yaml").read_text() == "seed: 2\n"  # written (whole) before events
    assert not (tmp_path / "summary.json").exists() and not _hidden(tmp_path)
    with pytest.raises(InputError, match="did not finish"):  # the folder does not look complete
        load_run(tmp_path)
    monkeypatch.undo()
    _write(tmp_path, events, info, config="seed: 2\n")  # a re-run completes it
    assert load_run(tmp_path)[1] == events


def test_trace_writer_failing_halfway_keeps_the_previous_trace(tmp_path, events, info,
                                                               monkeypatch) -> None:
    _write(tmp_path, events, info)
    before = (tmp_path / "trace.json").read_bytes()

    def half_then_fail(path, evs, inf):
        Path(path).write_text('{"traceEvents": [{"ph": "X", ')
        raise OSError("simulated disk full in trace.json")

    monkeypatch.setattr(rundir, "write_trace", half_then_fail)
    with pytest.raises(OSError, match="simulated"):
        _write(tmp_path, events, info)
    assert (tmp_path / "trace.json").read_bytes() == before
    json.loads(before)
    assert not _hidden(tmp_path) and not (tmp_path / "summary.json").exists()


def test_timeline_failing_keeps_the_previous_png(tmp_path, events, info, monkeypatch) -> None:
    _write(tmp_path, events, info, timeline=True)
    before = (tmp_path / "timeline.png").read_bytes()
    import jigsawrl.metrics.timeline as timeline

    def half_then_fail(path, evs, inf):
        Path(path).write_bytes(before[: len(before) // 2])
        raise RuntimeError("simulated crash drawing timeline.png")

    monkeypatch.setattr(timeline, "plot_timeline", half_then_fail)
    with pytest.raises(RuntimeError, match="simulated"):
        _write(tmp_path, events, info, timeline=True)
    assert (tmp_path / "timeline.png").read_bytes() == before and not _hidden(tmp_path)


def test_unserialisable_summary_leaves_no_summary(tmp_path, events, info) -> None:
    _write(tmp_path, events, info)
    before = _snapshot(tmp_path)
    bad = dict(summarize(events, info), makespan_s=float("nan"))
    with pytest.raises(ValueError):
        write_run(tmp_path, events=events, summary=bad, info=info, config_yaml="seed: 1\n",
                  timeline=False)
    assert not (tmp_path / "summary.json").exists() and not _hidden(tmp_path)
    for name in ("config.yaml", "events.jsonl", "trace.json"):
        assert (tmp_path / name).read_bytes() == before[name], name


def test_atomic_path_replaces_only_on_success(tmp_path) -> None:
    target = tmp_path / "f.txt"
    write_text_atomic(target, "old\n")
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:
        tmp.write_text("new, half")
        raise KeyboardInterrupt  # even a BaseException leaves the old file
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "f.txt"]
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".f.txt.") and not tmp.exists()
        tmp.write_text("new\n")
    assert target.read_text() == "new\n" and not _hidden(tmp_path)
    with pytest.raises(FileNotFoundError), atomic_path(tmp_path / "never.txt"):
        pass  # nothing written to the temporary path: an error, and no file appears
    assert not (tmp_path / "never.txt").exists()


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from jigsawrl.metrics.rundir import read_events, write_events
    path = Path(sys.argv[1])
    events = read_events(path)
    def slow():
        for i, ev in enumerate(events):
            if i == len(events) // 2:
                (path.parent / "ready").write_text("x")
                time.sleep(120)
            yield ev
    write_events(path, slow())
""")


def test_sigkill_in_the_middle_of_writing_events_keeps_the_previous(tmp_path, events,
                                                                    info) -> None:
    run = tmp_path / "run"
    _write(run, events * 50, info)
    before = (run / "events.jsonl").read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(run / "events.jsonl")], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (run / "ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (run / "events.jsonl").read_bytes() == before
    assert load_run(run)[1] == events * 50
    hidden = _hidden(run)
    assert len(hidden) == 1 and hidden[0].startswith(".events.jsonl.")  # the killed temp file
    assert read_events(run / "events.jsonl")  # and readers never look at it


def test_write_events_atomic_on_a_fresh_path(tmp_path, events) -> None:
    assert write_events(tmp_path / "e.jsonl", iter(events)) == len(events)
    assert read_events(tmp_path / "e.jsonl") == events and not _hidden(tmp_path)
