"""Facts about the machine a measurement ran on, for every report header (one place)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def host_cores() -> int:
    """The cores this process may run on (what a host's workers and the rest of a run share)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_info(*, with_torch: bool = False) -> dict[str, Any]:
    """Platform, CPU model, core count and Python version of this machine.

    ``with_torch`` adds the torch version and the load average (profiles and real runs taken on a
    busy machine read slower); it imports torch.
    """
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"platform": platform.platform(), "cpu": cpu, "cores": host_cores(),
                            "python": platform.python_version()}
    if with_torch:
        import torch

        info["torch"] = str(torch.__version__)
        info["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return info
