"""Ray start-up and device placement: one placement-group bundle per logical device.

What: :func:`connect` starts a local Ray (declaring ``jigsaw_device`` resources, one per logical
device of the config) or joins a running cluster; :func:`reserve_devices` creates a placement
group with one bundle per device and returns the options that pin a device's worker actor to
its bundle.

Why a custom resource: on CPU a logical device is not a Ray CPU (the workers ask for
``num_cpus=0``, cpu-notes.md), so nothing in Ray's default accounting stops two devices' workers
from being packed onto a node that cannot hold them. A cluster node offers devices with
``ray start --resources='{"jigsaw_device": K}'``; a GPU cluster may instead offer its GPUs
(a bundle then reserves ``{"GPU": 1}``). ``ray.cluster_utils.Cluster`` nodes take the same
``resources=`` argument (the multi-node test does so).

Who may connect: a local Ray is started by :func:`start_local` bound to the loopback address
(every Ray process and worker listens on 127.0.0.1 only) with Ray's token authentication on
(a per-process random token in ``RAY_AUTH_TOKEN`` unless one is configured), so nobody else on
the network can reach it, and nobody on this machine without the token can call it.

Simplification: the bundles use the ``PACK`` strategy; the physical node of each device is
reported (``node_of``) rather than forced to match ``cluster.accelerators_per_node``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from typing import Any

import ray
import ray._private.ray_constants as ray_constants
from ray._raylet import AuthenticationTokenLoader, Config
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from jigsawrl.errors import ConfigError
from jigsawrl.executors.raycluster.wire import use_numpy_wire

log = logging.getLogger(__name__)

DEVICE_RESOURCE = "jigsaw_device"
PG_TIMEOUT_S = 60.0


def connect(address: str | None, num_devices: int, num_cpus: int | None = None) -> bool:
    """Start a local Ray with ``num_devices`` logical devices, or join ``address``.

    Returns:
        True when this call started Ray (the caller shuts it down).
    """
    use_numpy_wire()  # before any tensor is put: see wire.py
    if ray.is_initialized():
        return False
    if address is None:
        start_local(num_cpus or os.cpu_count() or 1, {DEVICE_RESOURCE: num_devices})
    else:
        check_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"cannot join the Ray cluster at {address!r}: {exc}",
                              where="--address",
                              fix="start one (`ray start --head --resources='{\"jigsaw_device\""
                                  ": 2}'`), pass its address, or drop --address for a local "
                                  "Ray") from None
    return True


def enable_token_auth() -> None:
    """Ray's token authentication on, for this process and every Ray process it starts.

    Sets ``RAY_AUTH_MODE=token`` and, unless a token is configured (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``), a random per-process ``RAY_AUTH_TOKEN`` that the GCS, the raylet
    and the workers inherit (nothing written to ``~/.ray``). Ray caches its config and token at
    import, so both are reloaded here, as Ray itself does when it turns token mode on. Call it
    only while this process is not connected to a Ray.
    """
    os.environ["RAY_AUTH_MODE"] = "token"
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """A Ray node started inside binds every server to 127.0.0.1.

    Ray 2.60 has no option for it: ``ray.init(_node_ip_address="127.0.0.1")`` is turned into the
    node's routable address (``services.resolve_ip_for_localhost``) and the GCS, the raylet and
    every core worker then listen on all interfaces (``[::]``). Its node address is the loopback
    one only where multi-node clusters are off (``ray_constants.ENABLE_RAY_CLUSTER``, the
    switch Ray uses on macOS and Windows); a node then advertises 127.0.0.1, and its servers,
    the runtime-env agent and the workers it starts bind to it. The switch is read only while
    the node starts (afterwards the started node's address is used), so it is turned back
    at once: a later ``--address`` run in this process joins a cluster as usual.
    ``tests/executors/test_ray_security.py`` checks every listening socket.
    """
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def start_local(num_cpus: int, resources: dict[str, float] | None = None,
                **init_kwargs: Any) -> None:
    """Start a local, single-node Ray reachable only from this machine, with the token.

    Loopback-only (:func:`loopback_node`), token authentication on (:func:`enable_token_auth`),
    no dashboard. ``init_kwargs`` go to ``ray.init``.
    """
    enable_token_auth()
    init_kwargs.setdefault("logging_level", logging.WARNING)
    with loopback_node():
        ray.init(num_cpus=num_cpus, resources=resources, include_dashboard=False,
                 dashboard_host="127.0.0.1", **init_kwargs)


def check_reachable(address: str) -> None:
    """Fail fast on a ``host:port`` nobody listens on: Ray itself retries for a minute and then
    aborts the process (a C++ check failure, no Python error)."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", ray:// client addresses: left to Ray
    try:
        socket.create_connection((host, int(port)), timeout=3.0).close()
    except OSError as exc:
        raise ConfigError(f"no Ray cluster answers at {address!r} ({exc})", where="--address",
                          fix="start one (ray start --head --resources='{\"jigsaw_device\": 2}')"
                              ", pass its address, or drop --address for a local Ray") from None


def _bundle(num_devices: int) -> dict[str, float]:
    """What one device's bundle reserves on this cluster."""
    have = ray.cluster_resources()
    if have.get(DEVICE_RESOURCE, 0) >= num_devices:
        return {DEVICE_RESOURCE: 1}
    if have.get("GPU", 0) >= num_devices:
        return {"GPU": 1}
    if have.get("CPU", 0) >= 0.01 * num_devices and not have.get(DEVICE_RESOURCE):
        # A Ray started elsewhere without device resources (e.g. a plain ray.init()): place by
        # a token CPU slice; devices may then share a node arbitrarily.
        log.warning("Ray offers no %r resources: placing %d devices by CPU slices",
                    DEVICE_RESOURCE, num_devices)
        return {"CPU": 0.01}
    raise ConfigError(
        f"the Ray cluster offers {have.get(DEVICE_RESOURCE, 0):g} {DEVICE_RESOURCE!r} and "
        f"{have.get('GPU', 0):g} GPU resources, the config needs {num_devices} devices",
        where="cluster", fix=f"start nodes with ray start --resources="
        f"'{{\"{DEVICE_RESOURCE}\": K}}', or lower cluster.accelerators_per_node/num_nodes")


class Reservation:
    """The placement group of a run: ``options(i)`` pins device ``i``'s worker to bundle ``i``."""

    def __init__(self, num_devices: int) -> None:
        self.num_devices = num_devices
        self.bundle = _bundle(num_devices)
        self.pg = placement_group([dict(self.bundle) for _ in range(num_devices)],
                                  strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=PG_TIMEOUT_S)
        if not ready:
            remove_placement_group(self.pg)
            raise ConfigError(f"Ray could not place {num_devices} device bundles "
                              f"{self.bundle} within {PG_TIMEOUT_S:.0f} s", where="cluster",
                              fix="check `ray status` for free resources")

    def options(self, device: int) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "num_cpus": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=device)}
        if "GPU" in self.bundle:
            opts["num_gpus"] = 1
        elif "CPU" in self.bundle:
            opts["num_cpus"] = self.bundle["CPU"]
        else:
            opts["resources"] = dict(self.bundle)
        return opts

    def host_options(self) -> dict[str, Any]:
        """Options of host-side helpers (reward workers): in the group, on any bundle."""
        return {"num_cpus": 0, "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=self.pg)}

    def release(self) -> None:
        try:
            remove_placement_group(self.pg)
        except Exception as exc:  # noqa: BLE001 - Ray already shut down
            log.debug("placement group not removed: %s", exc)
