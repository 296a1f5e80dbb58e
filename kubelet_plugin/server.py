"""The plugin's two unix-socket gRPC servers: DRA (+ health) and registration.

Order matters: the DRA socket serves before the registration socket appears, because the kubelet
calls the DRA endpoint as soon as it has registered us. Sockets are 0600 in 0700 directories
(only the kubelet, as root, talks to them); a stale socket of a previous run is replaced.

Sockets are owned by identity, not by path: each bound socket's device, inode and change time
are remembered, and shutdown unlinks a path only while it is still that socket, so an old
instance stopping after a new one bound the same path leaves the new one alone. A watcher
re-creates a socket of ours that disappears (someone deleted it): the kubelet's plugin watcher
registers a re-created registration socket again. The watcher is the supervised loop
`socket-watch` (`dra_driver.supervision`): a check that raises is logged, counted and backed
off; one that never returns (a server that does not stop) is a stall after
`WATCH_DEADLINE_S`.
A path taken over by another process is left to it.

Rolling updates (`SocketPaths.for_instance`): each instance names both sockets after its instance
id (the pod UID), because the kubelet keeps several registrations of one driver only when their
registration sockets and DRA endpoints differ, and routes calls to the newest connected one. An
instance built without a Preparer routes its DRA calls through a `kubelet_plugin.handover.Handover`
until `serve_locally`. `remove_stale_sockets` deletes the sockets of dead instances (a SIGKILLed
pod cannot remove its own, and the kubelet keeps a registration while its socket file exists).
Used by `kubelet_plugin.main` and by the integration tests.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fnmatch
import hashlib
import logging
import os
import re
import secrets
import socket
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from dra_driver.names import DriverNames
from dra_driver.supervision import Supervisor
from kubelet_plugin.dra_service import DraServicer
from kubelet_plugin.handover import Handover, HandoverHealthServicer
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
# Worker threads of the DRA server: calls served at once (a call's claims fan out further, on
# the Preparer's --workers pool).
DRA_WORKERS = 8
# A check stats two paths; re-serving a socket stops the old server (1 s grace) and binds a new
# one: well under a second. 30 s without a finished check is a call that does not return.
WATCH_DEADLINE_S = 30.0
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

    @classmethod
    def for_instance(
        cls, driver: str, *, plugin_dir: str, registrar_dir: str, instance: str
    ) -> SocketPaths:
        """Per-instance names: `<driver>-<instance>-reg.sock` and `dra-<instance>.sock`.

        Where a path with the whole id is too long for a unix socket, that name carries
        `short_instance(instance)` instead (the probe script applies the same rule). ValueError
        when the instance id is not a plain token or even the short path is too long (the
        kernel would truncate it silently on some systems, fail on others).
        """
        if not _INSTANCE_ID.fullmatch(instance):
            raise ValueError(
                f"instance id {instance!r} must be 1-63 letters, digits, '-', '_' or '.' "
                "(use the pod UID)"
            )
        return cls(
            _socket_path(registrar_dir, f"{driver}-{{}}-reg.sock", instance),
            _socket_path(plugin_dir, "dra-{}.sock", instance),
        )

    def patterns(self, driver: str) -> tuple[tuple[str, str], ...]:
        """(directory, glob) of every socket name any instance of `driver` may use."""
        registrar, plugin = os.path.dirname(self.registration), os.path.dirname(self.dra)
        return (
            (registrar, f"{driver}-reg.sock"),
            (registrar, f"{driver}-*-reg.sock"),
            (plugin, "dra.sock"),
            (plugin, "dra-*.sock"),
        )


MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL
_INSTANCE_ID = re.compile(r"[A-Za-z0-9_.-]{1,63}")


def short_instance(instance: str) -> str:
    """11 characters for an instance id: base64url of the first 8 bytes of its SHA-256."""
    digest = hashlib.sha256(instance.encode()).digest()[:8]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _socket_path(directory: str, pattern: str, instance: str) -> str:
    for token in (instance, short_instance(instance)):
        path = os.path.join(directory, pattern.format(token))
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
            return path
    raise ValueError(
        f"socket path {path} is {len(os.fsencode(path))} bytes, over the {MAX_SOCKET_PATH}-byte "
        "limit of unix sockets: use a shorter directory"
    )


def remove_stale_sockets(sockets: SocketPaths, driver: str) -> list[str]:
    """Delete sockets of `driver`'s dead instances (nothing listens: connect is refused).

    A live instance's socket accepts connections from the moment it appears (it is bound and
    listening before it is renamed into place), so only sockets whose process is gone are
    removed; ours and other live instances' stay. Returns the removed paths.
    """
    removed = []
    own = {sockets.registration, sockets.dra}
    for directory, pattern in sockets.patterns(driver):
        try:
            entries = os.listdir(directory)
        except FileNotFoundError:
            continue
        for name in sorted(fnmatch.filter(entries, pattern)):
            path = os.path.join(directory, name)
            if path in own or not _is_socket(path) or _listening(path):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
                log.info("removed stale socket %s (its plugin instance is gone)", path)
    return removed


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _listening(path: str) -> bool:
    """False only when the kernel says nobody listens; any other outcome counts as alive."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError as exc:
            return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    return True


class PluginServer:
    """Owns both servers; `start()` then `stop()` (removes the sockets that are still ours).

    Without a `preparer` the DRA calls go through `self.handover` (forwarded to the node lock's
    holder) until `serve_locally(preparer)`.
    """

    def __init__(
        self,
        *,
        driver: str,
        sockets: SocketPaths,
        preparer: Preparer | None,
        holder_endpoint: Callable[[], str | None] = lambda: None,
        health: HealthBoard | None = None,
        max_workers: int = DRA_WORKERS,
        watch_period_s: float = WATCH_PERIOD_S,
        interceptors: Sequence[grpc.ServerInterceptor] = (),
        supervisor: Supervisor | None = None,
    ) -> None:
        self.sockets = sockets
        self.registration = RegistrationServicer(
            driver=driver,
            endpoint=sockets.dra,
            services=supported_services(health=health is not None),
        )
        self._preparer = preparer
        self.handover = Handover(sockets.dra, holder_endpoint) if preparer is None else None
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
        self._supervisor = supervisor or Supervisor()

    def _dra_server(self) -> grpc.Server:
        server = grpc.server(
            self._executor(self._max_workers, "grpc-dra"), interceptors=self._interceptors
        )
        if self.handover is not None:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
                self.handover.servicer(dra_v1_pb2, dra_v1_pb2_grpc, "v1"), server
            )
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                self.handover.servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc, "v1beta1"), server
            )
        else:
            assert self._preparer is not None
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
                DraServicer(self._preparer, dra_v1_pb2, version="v1"), server
            )
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                DraServicer(self._preparer, dra_v1beta1_pb2, version="v1beta1"), server
            )
        if self._health is not None:
            for messages, stubs in (
                (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
                (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
            ):
                local = HealthServicer(self._health, messages)
                servicer: HealthServicer | HandoverHealthServicer = (
                    local if self.handover is None else self.handover.health_servicer(local, stubs)
                )
                stubs.add_DRAResourceHealthServicer_to_server(servicer, server)
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
            self._watcher = self._supervisor.run(
                "socket-watch",
                self.check_sockets,
                self._stopping,
                period_s=self._watch_period_s,
                deadline_s=WATCH_DEADLINE_S + self._watch_period_s,
            )

    def serve_locally(self, preparer: Preparer) -> None:
        """This instance now owns the node's state: serve DRA calls with `preparer`."""
        if self.handover is None:
            raise RuntimeError("serve_locally: this server was built with its Preparer")
        self.handover.serve_locally(preparer)

    def stop(self, grace_s: float = 5.0) -> None:
        """Registration first (the kubelet stops routing to us), then in-flight DRA calls."""
        self._stopping.set()
        if self.handover is not None and not self.handover.local:
            # Calls held for a take-over that will not happen fail now (the kubelet retries
            # them with the instance that still runs) instead of at the end of the grace time.
            self.handover.fail("this plugin instance stopped before it took over the node")
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
