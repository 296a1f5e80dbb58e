"""Relays TCP between the host's loopback and a node's network namespace, either way.

Default direction: makes the bed's API server reachable on 127.0.0.1 inside a node's network
namespace.

The control plane listens on the host's loopback only (the bed's network rule), and a node's
kubelet and plugin live in their own network namespace, whose loopback is a different one. This
process listens on `127.0.0.1:<port>` *inside* the node namespace (the listening socket is
created after `setns` into it; a socket stays in the namespace it was created in) and relays
each connection to `127.0.0.1:<port>` of the host, where it runs. TLS passes through untouched,
so clients verify the API server's certificate (SAN 127.0.0.1) as before, and node kubeconfigs
stay unchanged. No library does a cross-namespace listen; the relay is a few lines of asyncio.

`--into` reverses it: listen on the host's 127.0.0.1 (port 0: the kernel picks one, written to
the ready file) and relay each connection to the same port on the node's own loopback, where the
node's kubelet plugin serves /metrics. The plugin is started on that port, so the URL it logs is
valid on the host too (`vgpu-dra status`, tests, the health benchmark read it from there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import socket
import sys
from collections.abc import Iterator, Sequence

from vgpu_testbed.realnode.relay import splice

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def _inside(netns: str) -> Iterator[None]:
    """This thread in the network namespace at `netns` for the block (sockets made there stay
    there), back in its own afterwards."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)


def listen_in(netns: str, port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:port of the network namespace at `netns`."""
    with _inside(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    sock.setblocking(False)
    return sock


def socket_in(netns: str) -> socket.socket:
    """A fresh TCP socket of the network namespace at `netns` (to connect from there)."""
    with _inside(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def listen_on_host() -> socket.socket:
    """A listening socket on a free port of the host's 127.0.0.1."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(listener: socket.socket, upstream_port: int, into: str | None = None) -> None:
    """Relay every connection to 127.0.0.1:upstream_port: the host's, or with `into` the one of
    that network namespace."""

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if into is None:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
            else:
                up = socket_in(into)
                await asyncio.get_running_loop().sock_connect(up, ("127.0.0.1", upstream_port))
                up_reader, up_writer = await asyncio.open_connection(sock=up)
        except OSError:
            writer.close()
            return
        await splice(reader, writer, up_reader, up_writer)

    server = await asyncio.start_server(relay, sock=listener)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="vgpu_testbed.realnode.forwarder")
    parser.add_argument("--netns", required=True, help="e.g. /proc/<pid>/ns/net")
    parser.add_argument("--port", type=int, help="the API server's port (not with --into)")
    parser.add_argument(
        "--into",
        action="store_true",
        help="listen on a free port of the host's loopback, relay into the namespace",
    )
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args(list(argv))
    if args.into:
        listener = listen_on_host()
        port = int(listener.getsockname()[1])
        into: str | None = args.netns
    else:
        if args.port is None:
            parser.error("--port is required without --into")
        port = args.port
        listener = listen_in(args.netns, port)
        into = None
    # Written whole, then renamed: the starter reads the port as soon as the file exists.
    partial = f"{args.ready_file}.partial"
    with open(partial, "w") as ready:
        ready.write(f"{port}\n")
    os.replace(partial, args.ready_file)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(listener, port, into))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
