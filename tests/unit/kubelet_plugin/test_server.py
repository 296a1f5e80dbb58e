"""Sockets are removed by identity, not path, and re-created when they vanish (issue 15.6).

Two real PluginServers (gRPC on unix sockets) on the same paths, as in a rolling update where
the new instance binds before the old one has shut down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kubelet_plugin.prepare import Preparer
from kubelet_plugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from kubelet_plugin.server import PluginServer, SocketPaths
from tests.fixtures.claimdata import DRIVER, GiB, inventory
from tests.fixtures.prepare import Claims, node_settings


@pytest.fixture
def preparer(tmp_path: Path) -> Iterator[Preparer]:
    p = Preparer(node_settings(tmp_path), inventory(memory=16 * GiB), Claims())
    p.reconcile()
    yield p
    p.close()


def sockets(tmp_path: Path) -> SocketPaths:
    return SocketPaths.for_driver(
        DRIVER, plugins_dir=str(tmp_path / "plugins"), registrar_dir=str(tmp_path / "reg")
    )


def answers(paths: SocketPaths) -> bool:
    """Both sockets serve: GetInfo on registration, an (empty) unprepare on DRA."""
    with grpc.insecure_channel(f"unix://{paths.registration}") as channel:
        info = pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
            pluginregistration_v1_pb2.InfoRequest(), timeout=5
        )
    assert info.endpoint == paths.dra
    with grpc.insecure_channel(f"unix://{paths.dra}") as channel:
        dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(), timeout=5
        )
    return True


def wait_for(predicate: object, timeout: float = 20.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_old_instance_shutdown_leaves_the_new_instances_sockets(
    tmp_path: Path, preparer: Preparer
) -> None:
    paths = sockets(tmp_path)
    old = PluginServer(driver=DRIVER, sockets=paths, preparer=preparer, watch_period_s=0)
    old.start()
    new = PluginServer(driver=DRIVER, sockets=paths, preparer=preparer, watch_period_s=0)
    new.start()  # replaces the old sockets at the same paths
    try:
        old.stop(grace_s=0)
        assert Path(paths.dra).exists() and Path(paths.registration).exists()
        assert answers(paths)
    finally:
        new.stop(grace_s=0)
    assert not Path(paths.dra).exists() and not Path(paths.registration).exists()


def test_a_deleted_socket_is_served_again(tmp_path: Path, preparer: Preparer) -> None:
    paths = sockets(tmp_path)
    server = PluginServer(driver=DRIVER, sockets=paths, preparer=preparer, watch_period_s=0.05)
    server.start()
    try:
        reg_before = Path(paths.registration).stat().st_ino
        Path(paths.registration).unlink()
        wait_for(lambda: Path(paths.registration).exists())
        assert answers(paths)
        Path(paths.dra).unlink()  # the DRA socket too; registration is re-created after it
        wait_for(lambda: Path(paths.dra).exists())
        wait_for(lambda: Path(paths.registration).stat().st_ino != reg_before)
        assert answers(paths)
        assert Path(paths.dra).stat().st_mode & 0o777 == 0o600
    finally:
        server.stop(grace_s=0)
    assert not Path(paths.dra).exists() and not Path(paths.registration).exists()


def test_stop_ends_the_worker_threads_of_both_servers(tmp_path: Path, preparer: Preparer) -> None:
    # grpc's Server.stop() leaves the executor it was given running; the plugin must end them,
    # also while the PluginServer object is still referenced (here: by this frame).
    def workers() -> list[str]:
        names = [t.name for t in threading.enumerate()]
        return [name for name in names if name.startswith(("grpc-dra", "grpc-reg"))]

    server = PluginServer(driver=DRIVER, sockets=sockets(tmp_path), preparer=preparer)
    server.start()
    try:
        assert answers(server.sockets)  # one call per server starts its workers
        assert workers()
    finally:
        server.stop(grace_s=0)
    wait_for(lambda: not workers(), timeout=5)
    assert not Path(server.sockets.dra).exists()
