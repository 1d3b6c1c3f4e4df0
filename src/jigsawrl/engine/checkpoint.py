"""Checkpoints of a real pipeline: model, optimizer, step, RNG states and the metric history.

What: one folder per checkpoint (``step-000012/``) holding ``state.pt`` (model + optimizer state
dicts, the RNG states of python / numpy / torch) and ``meta.json`` (step, history of per-step
metrics, anything JSON the caller adds). ``latest`` points at the newest one.

Why: resuming must give the same next steps as not stopping (a tested property). The pipeline
derives its prompts and sampling seeds from ``(seed, step)``, so together with the model and the
AdamW moments the RNG states are all that is needed; they are saved anyway so that code drawing
from the global generators stays reproducible too.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

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
    """The states of python's, numpy's and torch's global generators."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(root: Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, meta: dict[str, Any] | None = None) -> Path:
    """Write ``root/step-NNNNNN`` atomically-enough (temp folder, then rename) and mark it latest.

    Returns:
        The checkpoint folder.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    tmp.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "rng": capture_rng()}, tmp / _STATE)
    (tmp / _META).write_text(json.dumps({"step": step, **(meta or {})}, indent=1))
    if final.exists():
        for f in final.iterdir():
            f.unlink()
        final.rmdir()
    tmp.rename(final)
    (root / _LATEST).write_text(final.name)
    log.info("checkpoint saved: %s", final)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The newest checkpoint folder under ``root``, or None."""
    marker = root / _LATEST
    if marker.is_file():
        path = root / marker.read_text().strip()
        if (path / _STATE).is_file():
            return path
    found = sorted(p for p in root.glob("step-*") if (p / _STATE).is_file()) if root.is_dir() else []
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
