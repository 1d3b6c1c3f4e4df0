"""The profile's host-load probe: the host's CPU beside its device workers (/proc samples)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jigsawrl.experiments.hostload import HostSampler, Sample, load_while_busy, take_sample


def test_only_intervals_in_which_the_workers_computed_are_kept() -> None:
    samples = [Sample(0.0, 0.0, 0.0),
               Sample(1.0, 0.3, 0.1),  # workers 0.1 cores: start-up, not kept
               Sample(2.0, 2.3, 1.8),  # workers 1.7 cores, host 2.0: 0.3 beside them
               Sample(3.0, 4.1, 3.3),  # 1.5 and 1.8: 0.3
               Sample(4.0, 5.0, 3.1)]  # a worker ended (its CPU time gone): not kept
    got = load_while_busy(samples)
    assert got == {"load_cores": pytest.approx(0.3), "worker_cores": pytest.approx(1.6),
                   "seconds": pytest.approx(2.0)}
    # a window keeps the intervals inside it only
    assert load_while_busy(samples, 2.0, 3.0)["worker_cores"] == pytest.approx(1.5)
    assert load_while_busy(samples[:2]) is None


def fake_proc(root: Path, host_ticks: int, worker_ticks: int) -> Path:
    """A /proc with the host's CPU line, a device worker and another process."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  {host_ticks} 0 0 1000 7 0 0 0 0 0\ncpu0 1 2 3 4\n")
    for pid, cmd, ticks in (("11", b"ray::DeviceWorker.run\0", worker_ticks),
                            ("12", b"python\0-m\0driver\0", 50)):
        (root / pid).mkdir(exist_ok=True)
        (root / pid / "cmdline").write_bytes(cmd)
        fields = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 10
        (root / pid / "stat").write_text(f"{pid} (proc name) {' '.join(fields)}\n")
    return root


def test_a_sample_reads_the_hosts_busy_time_and_the_device_workers(tmp_path: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    s = take_sample(fake_proc(tmp_path / "proc", 300, 120))
    assert s.host_s == pytest.approx(300 / tick)  # idle and iowait are not busy
    assert s.workers_s == pytest.approx(120 / tick)  # only the device worker's


def test_the_sampler_does_nothing_without_a_proc(tmp_path: Path) -> None:
    with HostSampler(proc=tmp_path / "none") as sampler:
        pass
    assert not sampler.supported and sampler.samples == [] and sampler.result() is None


def test_the_sampler_samples_until_it_is_left(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", 300, 120)
    deadline = time.monotonic() + 30
    with HostSampler(every_s=0.001, proc=proc) as sampler:
        while len(sampler.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
    n = len(sampler.samples)
    assert n >= 3 and all(s.workers_s > 0 for s in sampler.samples)
    assert len(sampler.samples) == n  # stopped
