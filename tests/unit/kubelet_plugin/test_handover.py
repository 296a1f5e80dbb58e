"""A plugin instance that does not own the node yet (`PluginServer(preparer=None)`): how its DRA
calls end when there is no holder to forward to, when it stops, and when the holder refuses."""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubelet_plugin.health import HealthBoard, HealthServicer
from kubelet_plugin.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
)
from kubelet_plugin.server import PluginServer, SocketPaths
from tests.fixtures.claimdata import inventory

DRIVER = "vgpu.dra.dev"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ho-") as path:  # short: unix socket paths
        yield Path(path)


def waiting_server(root: Path, holder: str | None) -> PluginServer:
    sockets = SocketPaths.for_instance(
        DRIVER, plugin_dir=str(root / "p"), registrar_dir=str(root / "r"), instance="new"
    )
    (root / "r").mkdir(exist_ok=True)
    server = PluginServer(
        driver=DRIVER,
        sockets=sockets,
        preparer=None,
        holder_endpoint=lambda: holder,
        watch_period_s=0,
    )
    server.start()
    return server


@contextlib.contextmanager
def holder_server(
    socket: Path, on_prepare: Callable[[bytes, grpc.ServicerContext], bytes]
) -> Iterator[None]:
    """A stand-in lock holder on `socket` whose NodePrepareResources is `on_prepare` (raw bytes
    in and out), stopped with its thread pool on exit."""
    pool = ThreadPoolExecutor(max_workers=1)
    holder = grpc.server(pool)
    holder.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
                {"NodePrepareResources": grpc.unary_unary_rpc_method_handler(on_prepare)},
            )
        ]
    )
    holder.add_insecure_port(f"unix://{socket}")
    holder.start()
    try:
        yield
    finally:
        holder.stop(0).wait()
        pool.shutdown(wait=True)


def prepare(server: PluginServer, timeout: float) -> Any:
    claim = dra_v1_pb2.Claim(namespace="ns", name="c", uid="uid-1")
    with grpc.insecure_channel(f"unix://{server.sockets.dra}") as channel:
        return dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=timeout
        )


def test_without_a_holder_a_call_waits_until_its_deadline(short_dir: Path) -> None:
    server = waiting_server(short_dir, holder=None)
    try:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as raised:
            prepare(server, timeout=1.0)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started >= 0.9
    finally:
        server.stop()


def test_stopping_before_the_take_over_fails_held_calls_at_once(short_dir: Path) -> None:
    server = waiting_server(short_dir, holder=None)
    outcome: list[grpc.StatusCode] = []

    def call() -> None:
        try:
            prepare(server, timeout=30.0)
        except grpc.RpcError as exc:
            outcome.append(exc.code())

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.3)  # let the call reach the server and wait there
    started = time.monotonic()
    server.stop()
    caller.join(timeout=10)
    assert not caller.is_alive()
    assert outcome == [grpc.StatusCode.UNAVAILABLE]  # the kubelet retries with the holder
    assert time.monotonic() - started < 5


def test_a_holders_error_other_than_unavailable_is_passed_on(short_dir: Path) -> None:
    holder_socket = short_dir / "holder.sock"

    def refuse(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad claim")
        return b""

    with holder_server(holder_socket, refuse):
        server = waiting_server(short_dir, holder=str(holder_socket))
        try:
            with pytest.raises(grpc.RpcError) as raised:
                prepare(server, timeout=10.0)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "previous plugin instance: bad claim" in str(raised.value.details())
        finally:
            server.stop()


def test_health_stream_is_the_holders_until_it_ends(short_dir: Path) -> None:
    """The waiting instance's own board says every device is healthy; the kubelet must keep
    seeing the holder's view (here: discovery failed, every device unknown) instead."""
    holder_board = HealthBoard("node-a", inventory(count=2))
    holder_board.observe(None, "NVML: GPU is lost")
    pool = ThreadPoolExecutor(max_workers=2)
    holder = grpc.server(pool)
    dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        HealthServicer(holder_board, dra_health_v1_pb2), holder
    )
    holder_socket = short_dir / "holder.sock"
    holder.add_insecure_port(f"unix://{holder_socket}")
    holder.start()
    sockets = SocketPaths.for_instance(
        DRIVER, plugin_dir=str(short_dir / "p"), registrar_dir=str(short_dir / "r"), instance="n"
    )
    (short_dir / "r").mkdir()
    server = PluginServer(
        driver=DRIVER,
        sockets=sockets,
        preparer=None,
        holder_endpoint=lambda: str(holder_socket),
        health=HealthBoard("node-a", inventory(count=2)),
        watch_period_s=0,
    )
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{sockets.dra}") as channel:
            stream = dra_health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                dra_health_v1_pb2.NodeWatchResourcesRequest(), timeout=30
            )
            first = next(stream)
            assert [d.health for d in first.devices] == [dra_health_v1_pb2.UNKNOWN] * 2
            assert "GPU is lost" in first.devices[0].message
            holder.stop(0).wait()  # the holder exits: the forwarded stream ends, no error
            assert list(stream) == []
    finally:
        server.stop()
        holder.stop(0).wait()
        pool.shutdown(wait=True)


def test_a_call_the_stopping_holder_cancelled_is_served_again(short_dir: Path) -> None:
    """A holder stopping with a forwarded call in flight ends it CANCELLED (its SIGTERM grace ran
    out); the kubelet still waits, so the call is sent again, not failed (seen in a rolling
    update under load)."""
    holder_socket = short_dir / "holder.sock"
    calls: list[int] = []

    def cancel_first(request: bytes, context: grpc.ServicerContext) -> bytes:
        calls.append(len(calls))
        if len(calls) == 1:
            context.abort(grpc.StatusCode.CANCELLED, "server shutting down")
        return dra_v1_pb2.NodePrepareResourcesResponse().SerializeToString()

    with holder_server(holder_socket, cancel_first):
        server = waiting_server(short_dir, holder=str(holder_socket))
        try:
            response = prepare(server, timeout=10.0)
            assert isinstance(response, dra_v1_pb2.NodePrepareResourcesResponse)
            assert calls == [0, 1]
        finally:
            server.stop()
