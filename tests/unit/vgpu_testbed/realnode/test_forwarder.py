"""The relay between the host's loopback and a node's network namespace, `--into` direction:
connections accepted on the host are opened from inside the namespace (here the test's own, so
no namespace has to be created; entering it still takes setns, hence root)."""

from __future__ import annotations

import asyncio
import os

import pytest

from vgpu_testbed.realnode.forwarder import listen_on_host, serve

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setns needs CAP_SYS_ADMIN")


async def _round_trip() -> bytes:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"seen:" + await reader.readline())
        await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    upstream_port = upstream.sockets[0].getsockname()[1]
    listener = listen_on_host()
    port = listener.getsockname()[1]
    relay = asyncio.create_task(serve(listener, upstream_port, into="/proc/self/ns/net"))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hello\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
        return answer
    finally:
        relay.cancel()
        upstream.close()


def test_a_connection_on_the_host_reaches_the_port_in_the_namespace() -> None:
    assert asyncio.run(_round_trip()) == b"seen:hello\n"


async def _refused() -> bytes:
    listener = listen_on_host()
    port = listener.getsockname()[1]
    # Nothing listens on the upstream port: the client's connection is closed, not hung.
    closed = socket_port_free()
    relay = asyncio.create_task(serve(listener, closed, into="/proc/self/ns/net"))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
        return answer
    finally:
        relay.cancel()


def socket_port_free() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_upstream_that_refuses_closes_the_client_connection() -> None:
    assert asyncio.run(_refused()) == b""
