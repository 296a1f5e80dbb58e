"""The webhook's Service for a bed with two controller replicas: one loopback port the API
server calls, relayed to whichever replica answers.

Why: the bed's API server cannot reach a Service (no kube-proxy), so `register_webhooks` points
the configurations at one `https://127.0.0.1:<port>`. With one replica's port there, killing
that replica would take the webhook down, which a real install (a Service over both replicas)
does not do. This relay listens on a port of its own and connects each new connection to the
first replica, in turn, that accepts it (TLS passes through: both replicas serve the certificate
of the chart's one Secret). The replicas' ports are read from a file at every connection, so a
replica started again on other ports is found. Spawned by `vgpu_testbed.faults.bed`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from vgpu_testbed.realnode.relay import splice


def read_backends(path: Path) -> list[int]:
    """The replicas' webhook ports, one per line (a missing or torn file: none)."""
    try:
        return [int(line) for line in path.read_text().split() if line.strip().isdigit()]
    except OSError:
        return []


def write_backends(path: Path, ports: Sequence[int]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text("".join(f"{p}\n" for p in ports))
    os.replace(partial, path)


async def serve(port: int, backends: Path) -> None:
    turn = itertools.count()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ports = read_backends(backends)
        start = next(turn)
        for i in range(len(ports)):
            target = ports[(start + i) % len(ports)]
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", target), timeout=2
                )
            except (OSError, TimeoutError):
                continue
            await splice(reader, writer, up_reader, up_writer)
            return
        writer.close()  # no replica answers: the API server sees the webhook down

    server = await asyncio.start_server(relay, "127.0.0.1", port, reuse_address=True)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="vgpu_testbed.faults.service")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backends", type=Path, required=True, help="file of replica ports")
    args = parser.parse_args(list(argv))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.backends))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
