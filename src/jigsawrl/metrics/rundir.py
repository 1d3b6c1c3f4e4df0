"""Write and read a run folder: the files a run leaves behind, and the one way to read them back.

A run folder holds::

    config.yaml     the resolved experiment config (what produced the numbers)
    events.jsonl    every event, one JSON object a line (jigsawrl.events.event_to_dict)
    trace.json      Chrome / Perfetto trace (metrics.trace)
    timeline.png    device timeline (metrics.timeline), unless disabled
    summary.json    metrics.summary.summarize's output

Crash safety: every file is written atomically (:func:`atomic_path`: into a hidden temporary file
in the same folder, flushed and fsynced, then ``os.replace``-d onto its name, and the folder
fsynced), so a kill at any moment leaves each file either whole-and-old or whole-and-new, never
half-written under its final name (a killed writer may leave a hidden ``.<name>.*.tmp``, which
nothing reads). ``summary.json`` is removed first and written last, so a folder that has one is
complete; a crashed run leaves none and :func:`load_run` says so instead of reporting half a
run. Reading errors are :class:`~jigsawrl.errors.InputError` naming the file (and line) and how
to fix it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from jigsawrl.errors import InputError
from jigsawrl.events import Event, event_from_dict, event_to_dict
from jigsawrl.metrics.summary import RunInfo
from jigsawrl.metrics.trace import write_trace

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
EVENTS_FILE = "events.jsonl"
TRACE_FILE = "trace.json"
SUMMARY_FILE = "summary.json"
TIMELINE_FILE = "timeline.png"
REQUIRED_SUMMARY_KEYS = ("name", "policy", "makespan_s", "throughput_tokens_per_s", "pipelines")
_RERUN_FIX = "re-run the command that produced this run folder (its summary.json is written last)"


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A fresh temporary path next to ``path`` to write; on success it replaces ``path``.

    Use as ``with atomic_path(p) as tmp: write(tmp)``. When the block finishes, ``tmp`` is
    fsynced and moved onto ``path`` with ``os.replace`` (atomic on POSIX and Windows), then the
    folder is fsynced; when the block raises, ``tmp`` is removed and ``path`` is untouched. The
    temporary name is hidden and unique (``.<name>.<pid>-<hex>.tmp``), so concurrent writers
    never share one.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    """fsync a file or (where the OS allows opening one) a folder."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if path.is_dir():
            return  # folders cannot be opened on Windows; nothing to sync there
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp, tmp.open("x", encoding="utf-8") as f:
        f.write(text)


def write_events(path: Path, events: Iterable[Event]) -> int:
    """Write events as JSON lines, atomically (:func:`atomic_path`); returns how many."""
    n = 0
    with atomic_path(Path(path)) as tmp, tmp.open("x", encoding="utf-8") as f:
        for ev in events:
            f.write(json.dumps(event_to_dict(ev), separators=(",", ":"), allow_nan=False))
            f.write("\n")
            n += 1
    return n


def read_events(path: Path) -> list[Event]:
    """Read an ``events.jsonl`` file.

    Raises:
        InputError: the file is missing, or a line is not a valid event (``where`` = file:line).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("events file not found", where=str(path), fix=_RERUN_FIX)
    out: list[Event] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(event_from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise InputError(
                    f"not a valid event ({type(exc).__name__}: {exc})",
                    where=f"{path}:{lineno}",
                    fix=f"{_RERUN_FIX}; or delete the broken line if the rest is trusted",
                ) from exc
    return out


def _write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, allow_nan=False) + "\n")


def write_run(
    out_dir: Path,
    *,
    events: list[Event],
    summary: dict[str, Any],
    info: RunInfo,
    config_yaml: str,
    timeline: bool = True,
) -> None:
    """Write a complete run folder (created if needed; existing files are replaced).

    Args:
        out_dir: the run folder.
        events: every event of the run.
        summary: :func:`~jigsawrl.metrics.summary.summarize` of those events.
        info: the run's facts (for the trace and the timeline).
        config_yaml: the resolved experiment config, as YAML text.
        timeline: also draw ``timeline.png``.

    Raises:
        ValueError: the summary holds a NaN or infinity (not valid JSON).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = out_dir / SUMMARY_FILE
    if stale.exists():
        stale.unlink()  # until the new summary lands, the folder must not look complete
        _fsync(out_dir)
    write_text_atomic(out_dir / CONFIG_FILE, config_yaml)
    n = write_events(out_dir / EVENTS_FILE, events)
    with atomic_path(out_dir / TRACE_FILE) as tmp:
        write_trace(tmp, events, info)
    if timeline:
        from jigsawrl.metrics.timeline import plot_timeline  # matplotlib: import only when drawing

        with atomic_path(out_dir / TIMELINE_FILE) as tmp:
            plot_timeline(tmp, events, info)
    _write_json_atomic(out_dir / SUMMARY_FILE, summary)
    logger.info("wrote run folder %s (%d events)", out_dir, n)


def load_summary(run_dir: Path) -> dict[str, Any]:
    """Read and check ``summary.json`` of a run folder (without reading the events).

    Raises:
        InputError: folder or file missing, invalid JSON, or required keys absent.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(
            "run folder not found",
            where=str(run_dir),
            fix="pass a folder written by `jigsawrl simulate` or `jigsawrl run` (see --out)",
        )
    path = run_dir / SUMMARY_FILE
    if not path.is_file():
        raise InputError(
            "no summary.json: not a run folder, or the run did not finish",
            where=str(path),
            fix=_RERUN_FIX,
        )
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(
            f"summary.json is not valid JSON ({exc})", where=str(path), fix=_RERUN_FIX
        ) from exc
    if not isinstance(summary, dict):
        raise InputError("summary.json is not a JSON object", where=str(path), fix=_RERUN_FIX)
    missing = [k for k in REQUIRED_SUMMARY_KEYS if k not in summary]
    if missing:
        raise InputError(
            f"summary.json lacks {', '.join(missing)}", where=str(path), fix=_RERUN_FIX
        )
    return summary


def load_run(run_dir: Path) -> tuple[dict[str, Any], list[Event]]:
    """Read a run folder written by :func:`write_run`.

    Returns:
        ``(summary, events)``.

    Raises:
        InputError: the folder, ``summary.json`` or ``events.jsonl`` is missing or malformed
            (``where`` names the path, and the line for events).
    """
    summary = load_summary(run_dir)
    return summary, read_events(Path(run_dir) / EVENTS_FILE)


def run_info_of(summary: dict[str, Any]) -> RunInfo:
    """The :class:`RunInfo` stored in a summary (to redraw a trace or timeline from a folder).

    Raises:
        InputError: the summary has no valid ``run_info`` (written by an older version).
    """
    try:
        return RunInfo.from_dict(summary["run_info"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"summary has no valid run_info ({exc})", where=SUMMARY_FILE, fix=_RERUN_FIX
        ) from exc
