"""The bed's own network: a bridge in a network namespace the bed creates, nodes on veths.

Why: the kubelet's node IP may not be a loopback address, and the bed may only send traffic to
loopback or to namespaces it creates itself. `python -m vgpu_testbed.realnode.network` (spawned
once per cluster as `bed-network`) unshares a network namespace, creates the bridge `bedbr0`
(10.250.0.1/24) there and waits; `connect_node` adds a veth pair whose bridge end stays here and
whose other end is the node's `eth0` with 10.250.0.N/24. Nothing touches the host's own network
namespace; when the process dies its namespace, bridge and veth ends disappear with it.
The same process serves the API server's egress socket (`realnode.egress`): the way from the
API server to the kubelets for logs and exec.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from vgpu_testbed.realnode.config import NODE_SUBNET

CLONE_NEWNET = 0x40000000
BRIDGE = "bedbr0"
GATEWAY = f"{NODE_SUBNET}.1"


class NetworkError(RuntimeError):
    """A bed network step failed; the message has the command and its error."""


def _run(argv: Sequence[str]) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {result.stderr.strip()}")


def in_netns(pid: int, argv: Sequence[str]) -> list[str]:
    return ["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv]


def connect_node(bed_pid: int, node_pid: int, index: int, ip: str) -> None:
    """Give the node (network namespace of `node_pid`) its eth0 on the bed bridge."""
    host_end = f"vn{index}"
    _run(
        in_netns(
            bed_pid,
            [
                "ip",
                "link",
                "add",
                host_end,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                str(node_pid),
            ],
        )
    )
    _run(in_netns(bed_pid, ["ip", "link", "set", host_end, "master", BRIDGE, "up"]))
    _run(in_netns(node_pid, ["ip", "addr", "add", f"{ip}/24", "dev", "eth0"]))
    _run(in_netns(node_pid, ["ip", "link", "set", "eth0", "up"]))
    _run(in_netns(node_pid, ["ip", "link", "set", "lo", "up"]))
    _run(in_netns(node_pid, ["ip", "route", "add", "default", "via", GATEWAY]))


def main(argv: Sequence[str]) -> int:
    """argv: READY_FILE [EGRESS_SOCKET]"""
    ready = Path(argv[0])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        print(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 1
    _run(["ip", "link", "set", "lo", "up"])
    _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    _run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    asyncio.run(_serve(ready, Path(argv[1]) if len(argv) > 1 else None))
    return 0


async def _serve(ready: Path, egress_socket: Path | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if egress_socket is None:
        ready.write_text("ready\n")
        await stop.wait()
        return
    from vgpu_testbed.realnode import egress

    task = asyncio.create_task(egress.serve(egress_socket, stop))
    while not egress_socket.exists() and not task.done():
        await asyncio.sleep(0.01)
    ready.write_text("ready\n")
    await task


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
