"""The plugin's two unix-socket gRPC servers: DRA (+ health) and registration.

Order matters: the DRA socket serves before the registration socket appears, because the kubelet
calls the DRA endpoint as soon as it has registered us. Sockets are 0600 in 0700 directories
(only the kubelet, as root, talks to them); a stale socket of a previous run is replaced.

Sockets are owned by identity, not by path: each bound socket's device, inode and change time
are remembered, and shutdown unlinks a path only while it is still that socket, so an old
instance stopping after a new one bound the same path leaves the new one alone. A watcher
re-creates a socket of ours that disappears (someone deleted it): the kubelet's plugin watcher
registers a re-created registration socket again.
A path taken over by another process is left to it.
Used by `kubelet_plugin.main` and by the integration tests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
import threading
from collections.abc import Callable, Sequence
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
WATCH_PERIOD_S = 2.0
# (st_dev, st_ino, st_ctime_ns) of a socket we bound: the change time tells a successor's socket
# apart even when it got the freed inode number back.
SocketId = tuple[int, int, int]


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
    """Owns both servers; `start()` then `stop()` (removes the sockets that are still ours)."""

    def __init__(
        self,
        *,
        driver: str,
        sockets: SocketPaths,
        preparer: Preparer,
        health: HealthBoard | None = None,
        max_workers: int = 8,
        watch_period_s: float = WATCH_PERIOD_S,
        interceptors: Sequence[grpc.ServerInterceptor] = (),
    ) -> None:
        self.sockets = sockets
        self.registration = RegistrationServicer(
            driver=driver,
            endpoint=sockets.dra,
            services=supported_services(health=health is not None),
        )
        self._preparer = preparer
        self._health = health
        self._max_workers = max_workers
        self._watch_period_s = watch_period_s
        # Every worker pool the servers were built with: grpc's stop() leaves them running.
        self._executors: list[ThreadPoolExecutor] = []
        self._interceptors = list(interceptors)  # e.g. OpenTelemetry's, when tracing is on
        self._dra = self._dra_server()
        self._reg = self._reg_server()
        self._ids: dict[str, SocketId] = {}
        self._lock = threading.Lock()  # servers and socket ids: watcher vs stop()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self._foreign_logged: set[str] = set()

    def _dra_server(self) -> grpc.Server:
        server = grpc.server(
            self._executor(self._max_workers, "grpc-dra"), interceptors=self._interceptors
        )
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            DraServicer(self._preparer, dra_v1_pb2, version="v1"), server
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            DraServicer(self._preparer, dra_v1beta1_pb2, version="v1beta1"), server
        )
        if self._health is not None:
            dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                HealthServicer(self._health, dra_health_v1_pb2), server
            )
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                HealthServicer(self._health, dra_health_v1alpha1_pb2), server
            )
        return server

    def _reg_server(self) -> grpc.Server:
        server = grpc.server(self._executor(2, "grpc-reg"))
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self.registration, server)
        return server

    def _executor(self, workers: int, prefix: str) -> ThreadPoolExecutor:
        executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix)
        self._executors.append(executor)
        return executor

    def start(self) -> None:
        with self._lock:
            self._ids[self.sockets.dra] = _listen(self._dra, self.sockets.dra, own_dir=True)
            self._dra.start()
            log.info("DRA service listening on %s", self.sockets.dra)
            # The registrar directory is the kubelet's, shared with other plugins: leave it be.
            self._ids[self.sockets.registration] = _listen(
                self._reg, self.sockets.registration, own_dir=False
            )
            self._reg.start()
            log.info("registration service listening on %s", self.sockets.registration)
        if self._watch_period_s > 0:
            self._watcher = threading.Thread(target=self._watch, name="socket-watch", daemon=True)
            self._watcher.start()

    def stop(self, grace_s: float = 5.0) -> None:
        """Registration first (the kubelet stops routing to us), then in-flight DRA calls."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
        with self._lock:
            self._reg.stop(grace_s).wait()
            _unlink_if_ours(self.sockets.registration, self._ids.get(self.sockets.registration))
            self._dra.stop(grace_s).wait()
            _unlink_if_ours(self.sockets.dra, self._ids.get(self.sockets.dra))
            for executor in self._executors:  # idle now: no server hands them calls any more
                executor.shutdown(wait=False, cancel_futures=True)
        log.info("gRPC servers stopped; our sockets removed")

    # --- keeping the sockets -----------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stopping.wait(self._watch_period_s):
            try:
                self.check_sockets()
            except Exception:
                log.exception("socket watch failed; retrying in %g s", self._watch_period_s)

    def check_sockets(self) -> None:
        """Re-create a socket of ours that disappeared (DRA first: registration points at it)."""
        with self._lock:
            if self._stopping.is_set():
                return
            dra_gone = self._gone(self.sockets.dra)
            if dra_gone:
                log.warning("DRA socket %s disappeared; serving it again", self.sockets.dra)
                self._dra = self._rebind(self._dra, self._dra_server, self.sockets.dra, True)
            if dra_gone or self._gone(self.sockets.registration):
                # A fresh registration socket makes the kubelet's plugin watcher register us
                # again (and learn the re-created DRA socket).
                log.warning("registering again via %s", self.sockets.registration)
                self.registration.registered.clear()
                self._reg = self._rebind(
                    self._reg, self._reg_server, self.sockets.registration, False
                )

    def _gone(self, path: str) -> bool:
        """True when `path` no longer exists; a path now held by someone else is not ours."""
        current = _socket_id(path)
        if current is None:
            return True
        if current != self._ids.get(path) and path not in self._foreign_logged:
            self._foreign_logged.add(path)
            log.warning("%s was replaced by another process's socket; leaving it to them", path)
        return False

    def _rebind(
        self,
        old: grpc.Server,
        build: Callable[[], grpc.Server],
        path: str,
        own_dir: bool,
    ) -> grpc.Server:
        old.stop(1.0).wait()
        server = build()
        self._ids[path] = _listen(server, path, own_dir=own_dir)
        server.start()
        return server


def _listen(server: grpc.Server, path: str, *, own_dir: bool) -> SocketId:
    """Serve `path` (taking it over from a stale socket) and return the new socket's identity.

    gRPC unlinks the path it bound when the server stops, by name, which would delete a
    successor's socket at the same path. So the server binds a private dot-name in the same
    directory (the kubelet's plugin watcher ignores dot-files) that is then renamed over `path`:
    gRPC's unlink at stop hits the long-gone private name, and `path` changes hands atomically.
    """
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=SOCKET_DIR_MODE)
        os.chmod(directory, SOCKET_DIR_MODE)  # makedirs' mode is filtered by the umask
    elif own_dir:
        os.chmod(directory, SOCKET_DIR_MODE)
    if _socket_id(path) is not None:
        _require_socket(path)
        log.info("replacing stale socket %s", path)
    private = os.path.join(directory, f".{secrets.token_hex(4)}.sock")
    if server.add_insecure_port(f"unix://{private}") == 0:
        raise OSError(f"cannot listen on unix socket {private}")
    try:
        os.chmod(private, SOCKET_MODE)
        os.replace(private, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(private)
        raise
    identity = _socket_id(path)  # after the rename, which changes st_ctime
    if identity is None:
        raise OSError(f"socket {path} vanished right after it was bound")
    return identity


def _socket_id(path: str) -> SocketId | None:
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    return (status.st_dev, status.st_ino, status.st_ctime_ns)


def _unlink_if_ours(path: str, ours: SocketId | None) -> None:
    """Remove `path` only while it is still the socket we bound (not a successor's)."""
    current = _socket_id(path)
    if current is None:
        return
    if current != ours:
        log.info("leaving %s in place: it is another process's socket now", path)
        return
    os.unlink(path)


def _require_socket(path: str) -> None:
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise OSError(f"{path} exists and is not a socket; refusing to replace it")
