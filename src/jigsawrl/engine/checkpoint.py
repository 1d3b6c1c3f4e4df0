"""Checkpoints of a real pipeline: model, optimizer, step, RNG states and the metric history.

What: one folder per checkpoint (``step-000012/``) holding ``state.pt`` (model + optimizer state
dicts, the RNG states of python / numpy / torch) and ``meta.json`` (step, history of per-step
metrics, anything JSON the caller adds). ``latest`` points at the newest one.

Crash safety: a kill at any moment leaves the previous checkpoint or the new one readable, never
a half-written one under a ``step-*`` name. A checkpoint is written into a hidden temporary
folder (``.tmp-step-000012-<pid>-<hex>``), each file flushed and fsynced, then renamed to its
final name in one ``os.rename``; only then is ``latest`` replaced, itself atomically (temporary
file, fsync, ``os.replace``), and the folder entries are fsynced so the renames survive a power
cut. Re-saving an existing step moves the old folder aside (``.old-step-...``) before the
rename and deletes it after; in the instant between those two renames the step has no folder,
and :func:`latest_checkpoint` then finds the moved-aside copy. Readers ignore hidden folders
otherwise; a writer killed mid-save leaves its ``.tmp-*`` folder behind (delete it freely: it
is never read, and it is not deleted automatically because another process may be writing it).

Why: resuming must give the same next steps as not stopping (a tested property). The pipeline
derives its prompts and sampling seeds from ``(seed, step)``, so together with the model and the
AdamW moments the RNG states are all that is needed; they are saved anyway so that code drawing
from the global generators stays reproducible too.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jigsawrl.engine.device import to_host
from jigsawrl.errors import InputError

log = logging.getLogger(__name__)

_STATE = "state.pt"
_META = "meta.json"
_LATEST = "latest"


@dataclass
class Checkpoint:
    """What a checkpoint holds once loaded."""

    step: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


def capture_rng() -> dict[str, Any]:
    """The states of python's, numpy's and torch's global generators (and CUDA's, once this
    process has used CUDA)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restore :func:`capture_rng`'s states (CUDA's only where as many GPUs are seen)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)


def save_checkpoint(root: Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, meta: dict[str, Any] | None = None) -> Path:
    """Write ``root/step-NNNNNN`` atomically and then mark it latest (see the module docstring).

    Returns:
        The checkpoint folder.

    Raises:
        TypeError: ``meta`` is not JSON-serialisable (nothing is written then).
        OSError: the folder cannot be written; the previous checkpoint is left as it was.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    meta_text = json.dumps({"step": step, **(meta or {})}, indent=1)  # fails before any write
    tmp = root / f".tmp-{final.name}-{_unique()}"
    tmp.mkdir()
    old: Path | None = None
    try:
        with (tmp / _STATE).open("xb") as f:
            torch.save({"model": to_host(model.state_dict()),  # on the CPU: loads anywhere
                        "optimizer": to_host(optimizer.state_dict()), "rng": capture_rng()}, f)
            _sync(f)
        with (tmp / _META).open("x", encoding="utf-8") as f:
            f.write(meta_text)
            _sync(f)
        _fsync_dir(tmp)
        if final.exists():
            old = root / f".old-{final.name}-{_unique()}"
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not final.exists():
            os.rename(old, final)  # put the previous version back
        raise
    try:
        _write_marker(root, final.name)
    finally:  # the new folder is complete under the final name: the old version is not needed
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint saved: %s", final)
    return final


def _unique() -> str:
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def _sync(f: Any) -> None:
    f.flush()
    os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Make a folder's entries (renames, new files) durable; a no-op where folders cannot be
    opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_marker(root: Path, name: str) -> None:
    """Replace ``root/latest`` atomically: a reader sees the old name or the new, never a mix."""
    marker = root / _LATEST
    tmp = root / f".{_LATEST}-{_unique()}"
    try:
        with tmp.open("x", encoding="utf-8") as f:
            f.write(name)
            _sync(f)
        os.replace(tmp, marker)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(root)


def _complete(path: Path) -> bool:
    return (path / _STATE).is_file() and (path / _META).is_file()


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint folder under ``root``, or None.

    The one ``latest`` names if it is complete; else (a crash between a save's renames, or a
    marker written by hand) the moved-aside previous version of that step, if any; else the
    complete ``step-*`` folder of the highest step.
    """
    root = Path(root)
    if not root.is_dir():
        return None
    marker = root / _LATEST
    if marker.is_file():
        try:
            name = marker.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            name = ""  # a damaged marker: fall back to the folders themselves
        path = root / name
        if name and _complete(path):
            return path
        aside = sorted(p for p in root.glob(f".old-{name}-*") if _complete(p)) if name else []
        if aside:
            return aside[-1]
    found = sorted(p for p in root.glob("step-*") if _complete(p))
    return found[-1] if found else None


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint folder.

    Raises:
        InputError: the folder is missing or its files are unreadable.
    """
    try:
        state = torch.load(path / _STATE, map_location="cpu", weights_only=False)
        meta = json.loads((path / _META).read_text())
    except Exception as exc:  # noqa: BLE001 - torch.load raises many types for a bad file
        raise InputError(f"cannot read checkpoint: {type(exc).__name__}: {exc}", where=str(path),
                         fix="point --out at a run folder written by `jigsawrl run`, "
                             "or run without --resume") from None
    return Checkpoint(step=int(meta["step"]), model=state["model"],
                      optimizer=state["optimizer"], rng=state["rng"], meta=meta)


def apply_checkpoint(ckpt: Checkpoint, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer) -> None:
    """Load model, optimizer and RNG states from ``ckpt`` in place."""
    model.load_state_dict(ckpt.model)
    optimizer.load_state_dict(ckpt.optimizer)
    restore_rng(ckpt.rng)
