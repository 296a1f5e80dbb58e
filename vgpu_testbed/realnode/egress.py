"""The API server's way to the kubelets of real nodes (kubectl logs, exec, port-forward).

The API server listens on the host's loopback; kubelets listen on their node address
(10.250.0.N) in network namespaces only the bed network reaches. The API server's egress
selector (`--egress-selector-config-file`, selection `cluster`) sends every connection to a node
as an HTTP CONNECT over a unix socket; `serve` answers it from inside the bed network namespace
(the `bed-network` process), so the traffic goes only to namespaces the bed created. Only
addresses of the bed subnet are relayed; anything else gets 403.

Why hand-written: an HTTP CONNECT relay is a request line, headers and two pipes; konnectivity
(the usual server) is a separate Go program with its own agents, far more than the bed needs.
"""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import yaml

from vgpu_testbed.realnode.config import NODE_SUBNET
from vgpu_testbed.realnode.relay import splice

SOCKET_NAME = "egress.sock"
CONFIG_NAME = "egress-selector.yaml"
BED_NETWORK = ipaddress.ip_network(f"{NODE_SUBNET}.0/24")


def render_config(uds: Path) -> str:
    """The API server's EgressSelectorConfiguration: cluster traffic through `uds`."""
    conf = {
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [
            {
                "name": "cluster",
                "connection": {
                    "proxyProtocol": "HTTPConnect",
                    "transport": {"uds": {"udsName": str(uds)}},
                },
            }
        ],
    }
    return yaml.safe_dump(conf, sort_keys=False)


def allowed(target: str) -> tuple[str, int] | None:
    """`host:port` of a CONNECT request if it is a bed node address, else None."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return None
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if address not in BED_NETWORK or not 0 < int(port) < 65536:
        return None
    return str(address), int(port)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        writer.close()
        return
    parts = request.split("\r\n", 1)[0].split()
    target = allowed(parts[1]) if len(parts) == 3 and parts[0] == "CONNECT" else None
    if target is None:
        writer.write(b"HTTP/1.1 403 Forbidden\r\n\r\n")
        writer.close()
        return
    try:
        up_reader, up_writer = await asyncio.open_connection(*target)
    except OSError as exc:
        writer.write(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{exc}".encode())
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await writer.drain()
    await splice(reader, writer, up_reader, up_writer)


async def serve(uds: Path, stop: asyncio.Event) -> None:
    uds.unlink(missing_ok=True)
    server = await asyncio.start_unix_server(_handle, path=str(uds))
    uds.chmod(0o600)
    async with server:
        await stop.wait()
