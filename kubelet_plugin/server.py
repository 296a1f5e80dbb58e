"""The plugin's two unix-socket gRPC servers: DRA (+ health) and registration.

Order matters: the DRA socket serves before the registration socket appears, because the kubelet
calls the DRA endpoint as soon as it has registered us. Sockets are 0600 in 0700 directories
(only the kubelet, as root, talks to them); stale sockets of a previous run are removed first.
Used by `kubelet_plugin.main` and by the integration tests.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from dra_driver.names import DriverNames
from kubelet_plugin.dra_service import DraServicer
from kubelet_plugin.health import HealthBoard, HealthServicer
from kubelet_plugin.prepare import Preparer
from kubelet_plugin.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2_grpc,
)
from kubelet_plugin.registration import RegistrationServicer, supported_services

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
SOCKET_DIR_MODE = 0o700


@dataclass(frozen=True, slots=True)
class SocketPaths:
    registration: str
    dra: str

    @classmethod
    def for_driver(cls, driver: str, *, plugins_dir: str, registrar_dir: str) -> SocketPaths:
        """Standard layout: `<registrar>/<driver>-reg.sock`, `<plugins>/<driver>/dra.sock`."""
        names = DriverNames(driver)
        return cls(names.registration_socket(registrar_dir), names.dra_socket(plugins_dir))


class PluginServer:
    """Owns both servers; `start()` then `stop()` (removes the sockets)."""

    def __init__(
        self,
        *,
        driver: str,
        sockets: SocketPaths,
        preparer: Preparer,
        health: HealthBoard | None = None,
        max_workers: int = 8,
        interceptors: Sequence[grpc.ServerInterceptor] = (),
    ) -> None:
        self.sockets = sockets
        self.registration = RegistrationServicer(
            driver=driver,
            endpoint=sockets.dra,
            services=supported_services(health=health is not None),
        )
        executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc-dra")
        self._dra = grpc.server(executor, interceptors=list(interceptors))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            DraServicer(preparer, dra_v1_pb2, version="v1"), self._dra
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            DraServicer(preparer, dra_v1beta1_pb2, version="v1beta1"), self._dra
        )
        if health is not None:
            dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                HealthServicer(health, dra_health_v1_pb2), self._dra
            )
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                HealthServicer(health, dra_health_v1alpha1_pb2), self._dra
            )
        self._reg = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="grpc-reg"))
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(
            self.registration, self._reg
        )

    def start(self) -> None:
        _listen(self._dra, self.sockets.dra, own_dir=True)
        self._dra.start()
        log.info("DRA service listening on %s", self.sockets.dra)
        # The registrar directory is the kubelet's, shared with other plugins: leave it as it is.
        _listen(self._reg, self.sockets.registration, own_dir=False)
        self._reg.start()
        log.info("registration service listening on %s", self.sockets.registration)

    def stop(self, grace_s: float = 5.0) -> None:
        """Registration first (the kubelet stops routing to us), then in-flight DRA calls."""
        self._reg.stop(grace_s).wait()
        _unlink_socket(self.sockets.registration)
        self._dra.stop(grace_s).wait()
        _unlink_socket(self.sockets.dra)
        log.info("gRPC servers stopped; sockets removed")


def _listen(server: grpc.Server, path: str, *, own_dir: bool) -> None:
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=SOCKET_DIR_MODE)
        os.chmod(directory, SOCKET_DIR_MODE)  # makedirs' mode is filtered by the umask
    elif own_dir:
        os.chmod(directory, SOCKET_DIR_MODE)
    if _unlink_socket(path):
        log.info("removed stale socket %s", path)
    if server.add_insecure_port(f"unix://{path}") == 0:
        raise OSError(f"cannot listen on unix socket {path}")
    os.chmod(path, SOCKET_MODE)


def _unlink_socket(path: str) -> bool:
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise OSError(f"{path} exists and is not a socket; refusing to remove it")
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
