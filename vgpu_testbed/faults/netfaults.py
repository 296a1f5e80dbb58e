"""Partitions and a slow API between a bed node and the API server, made inside the node's own
network namespace (never on the host's interfaces or rules).

How a node reaches the API server (vgpu_testbed.realnode): its kubelet and kubelet plugin call
127.0.0.1:<apiserver port> on the node's own loopback, where the node's forwarder listens and
relays to the host. Both ends of that TCP connection are in the node's namespace, so every
packet of it, either way, passes the node's `lo`. The other way, the API server reaches the
kubelet (logs, exec) over the node's `eth0` on the bed bridge.

- **partition**: a chain `VGPU-CHAOS`, jumped to first from the node namespace's INPUT chain,
  drops every packet of that port arriving on `lo` (either direction) and everything arriving
  on `eth0`. Dropped on input, not output: the sender gets no error, its connections hang and
  new ones time out, as behind a dead link (an OUTPUT drop would fail sends at once with EPERM).
- **slow API**: this kernel has neither `netem` nor `prio` (CONFIG_NET_SCH_NETEM and _PRIO are
  off), so a delay cannot be added per packet. An HTB qdisc on the node's `lo` sends that
  port's packets (u32 filters on source and destination port) to a class limited to a low rate
  instead: every answer of the API server, and every request, queues behind the ones before it
  (a 3 KB claim read at 400 kbit/s takes ~60 ms, a 20 KB list ~400 ms), everything else on
  `lo` is unlimited.
`heal` removes both. Everything runs through `nsenter --net=<the node's namespace>`; the
kubelet's own rules there (KUBE-FIREWALL) are left alone.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

CHAIN = "VGPU-CHAOS"


class NetFaultError(RuntimeError):
    """A tc or iptables command failed inside the node's namespace (the message has its output)."""


def _run(netns: str, argv: Sequence[str], *, check: bool = True) -> bool:
    command = ["nsenter", f"--net={netns}", "--", *argv]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetFaultError(f"{' '.join(command)}: {result.stderr.strip()}")
    return result.returncode == 0


def partition(netns: str, apiserver_port: int) -> None:
    """Cut the node off the API server both ways (its calls out, the API server's calls in)."""
    port = str(apiserver_port)
    _run(netns, ["iptables", "-N", CHAIN])
    for rule in (
        ["-i", "lo", "-p", "tcp", "--dport", port, "-j", "DROP"],
        ["-i", "lo", "-p", "tcp", "--sport", port, "-j", "DROP"],
        ["-i", "eth0", "-j", "DROP"],
    ):
        _run(netns, ["iptables", "-A", CHAIN, *rule])
    _run(netns, ["iptables", "-I", "INPUT", "1", "-j", CHAIN])


def throttle(netns: str, apiserver_port: int, rate_kbit: int) -> None:
    """Limit every packet between the node and the API server to `rate_kbit` in all."""
    port = str(apiserver_port)
    _run(netns, ["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10"])
    _run(netns, ["tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb",
                 "rate", "10gbit"])  # fmt: skip
    _run(netns, ["tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb",
                 "rate", f"{rate_kbit}kbit", "ceil", f"{rate_kbit}kbit", "burst", "2k",
                 "cburst", "2k"])  # fmt: skip
    for direction in ("dport", "sport"):
        _run(netns, ["tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip",
                     "prio", "1", "u32", "match", "ip", direction, port, "0xffff",
                     "flowid", "1:20"])  # fmt: skip


def heal(netns: str) -> None:
    """Remove what `partition` or `throttle` added (what is absent is fine)."""
    _run(netns, ["iptables", "-D", "INPUT", "-j", CHAIN], check=False)
    _run(netns, ["iptables", "-F", CHAIN], check=False)
    _run(netns, ["iptables", "-X", CHAIN], check=False)
    _run(netns, ["tc", "qdisc", "del", "dev", "lo", "root"], check=False)
