"""Fixtures of the Ray executor's tests: one local Ray per test module, one warm-start cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def shared_ray() -> Any:
    """A local Ray with four ``jigsaw_device`` resources, started once for the module."""
    ray = pytest.importorskip("ray")
    from jigsawrl.executors.raycluster.placement import start_local

    if ray.is_initialized():
        ray.shutdown()
    start_local(2, {"jigsaw_device": 4})  # loopback-only, token auth on: as a local run
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The warm starts of the tiny real pipelines, trained once for the session."""
    return tmp_path_factory.mktemp("warmstart")
