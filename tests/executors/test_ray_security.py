"""Nobody else gets in: the Ray a local run starts listens on the loopback address only, and
every Ray server asks for the run's token.

Starts Ray the way ``jigsawrl run --ray`` does (``placement.connect`` without ``--address``),
places two actors the way the executor places its device workers, and reads every listening
socket of the driver and of every process it started (GCS, raylet, agents, workers).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from typing import Any

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from ray._raylet import AuthenticationMode, get_authentication_mode  # noqa: E402

from jigsawrl.executors.raycluster.placement import Reservation, connect  # noqa: E402


@ray.remote(num_cpus=0)
class _Worker:
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def local_run() -> Any:
    if ray.is_initialized():
        ray.shutdown()
    assert connect(None, 2, num_cpus=2)
    reservation = Reservation(2)
    workers = [_Worker.options(**reservation.options(i)).remote() for i in range(2)]
    pids = ray.get([w.pid.remote() for w in workers])
    yield pids
    reservation.release()
    ray.shutdown()


def listeners() -> dict[int, tuple[str, list[str]]]:
    """pid -> (process name, the addresses it listens on) for this process and its children."""
    me = psutil.Process()
    out: dict[int, tuple[str, list[str]]] = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="inet")
            name = proc.name()
        except psutil.NoSuchProcess:
            continue
        out[proc.pid] = (name, [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN])
    return out


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def test_every_ray_socket_listens_on_loopback_only(local_run: Any) -> None:
    found = listeners()
    open_ = {f"{name} ({pid}): {ip}" for pid, (name, ips) in found.items() for ip in ips
             if not is_loopback(ip)}
    assert not open_, f"listening beyond the loopback address: {sorted(open_)}"
    names = " ".join(name for name, ips in found.values() if ips)
    assert "gcs_server" in names and "raylet" in names, names
    assert all(found.get(pid, ("", []))[1] for pid in local_run), "a worker listens nowhere"
    assert found[os.getpid()][1], "the driver listens nowhere"
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")


def test_token_authentication_is_on(local_run: Any) -> None:
    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert get_authentication_mode() == AuthenticationMode.TOKEN
    address = ray.get_runtime_context().gcs_address
    probe = f"import ray; ray.init(address={address!r}); print('joined')"
    # the stranger dials 127.0.0.1 itself (else Ray swaps it for the routable address,
    # where nothing listens) and holds a wrong token
    env = {**os.environ, "RAY_AUTH_TOKEN": "not-the-token", "RAY_AUTH_MODE": "token",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    stranger = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              text=True, timeout=90)
    assert stranger.returncode != 0 and "joined" not in stranger.stdout
    assert "InvalidAuthToken" in stranger.stderr or "uthentication" in stranger.stderr, \
        stranger.stderr[-2000:]
