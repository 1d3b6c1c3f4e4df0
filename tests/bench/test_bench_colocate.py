"""`jigsawrl bench colocate`: both modes run the same calls and report a makespan each."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from jigsawrl.bench.colocate import ColocateSpec, run_colocate  # noqa: E402


@pytest.mark.slow
def test_both_modes_on_both_workloads(tmp_path: Path) -> None:
    spec = ColocateSpec(batch_size=2, group_size=2, repeats=1, tool_latency_s=0.05)
    out = run_colocate(spec, cache_dir=tmp_path)
    assert set(out["workloads"]) == {"tool", "compute"}
    for w in out["workloads"].values():
        assert len(w["runs"]["serial_s"]) == len(w["runs"]["concurrent_s"]) == 1
        assert w["serial_s"]["median"] > 0 and w["concurrent_s"]["median"] > 0
        assert w["speedup"] == pytest.approx(w["serial_s"]["median"]
                                             / w["concurrent_s"]["median"])
