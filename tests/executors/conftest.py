"""Fixtures of the Ray executor's tests: one local Ray per test module, one warm-start cache."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def shared_ray() -> Any:
    """A local Ray with four ``jigsaw_device`` resources, started once for the module."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local run: no auth token file
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING",
             resources={"jigsaw_device": 4})
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The warm starts of the tiny real pipelines, trained once for the session."""
    return tmp_path_factory.mktemp("warmstart")
