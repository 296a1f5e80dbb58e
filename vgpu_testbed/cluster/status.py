"""Health of a cluster: probe each recorded process and read the Nodes back.

Used by `Cluster.status()` (and so `vgpu-dra dev-cluster status`) and by the start-up waits,
which share the meaning of "healthy": HTTP 200 with `ok` (Kubernetes components) or etcd's
`{"health":"true"}`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpu_testbed import procs
from vgpu_testbed.cluster.flags import LOOPBACK
from vgpu_testbed.cluster.health import http_get
from vgpu_testbed.cluster.state import NodeRecord
from vgpu_testbed.procs import ProcessRecord


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str
    pid: int
    alive: bool
    port: int | None
    healthy: bool | None  # None: no health endpoint (extra processes)
    detail: str


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    profile: str
    exists: bool
    ready: bool


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    root: Path
    server: str
    components: list[ComponentStatus]
    nodes: list[NodeStatus]

    @property
    def healthy(self) -> bool:
        return all(c.alive and c.healthy is not False for c in self.components) and all(
            n.exists and n.ready for n in self.nodes
        )


# The allocation controller's process name (vgpu_testbed.cluster.controller); more replicas get
# a suffix. It answers /readyz on the port recorded with it.
CONTROLLER_PROCESS = "vgpu-dra-controller"


def is_controller(process_name: str) -> bool:
    return process_name == CONTROLLER_PROCESS or process_name.startswith(CONTROLLER_PROCESS + "-")


def healthy_answer(code: int, body: str) -> bool:
    return code == 200 and (body.strip() == "ok" or '"health":"true"' in body.replace(" ", ""))


def probe(url: str, **kwargs: Any) -> Callable[[], tuple[bool, str]]:
    """A readiness probe for `health.wait_for`: (healthy, what answered)."""

    def check() -> tuple[bool, str]:
        code, body = http_get(url, **kwargs)
        return healthy_answer(code, body), f"{code} {body.strip()[:200]}"

    return check


def health_url(rec: ProcessRecord, server: str) -> str | None:
    """Where a control-plane component answers health probes (None for extra processes)."""
    if rec.name == "etcd":
        return f"http://{LOOPBACK}:{rec.port}/health"
    if rec.name == "kube-apiserver":
        return f"{server}/readyz"
    if rec.name in ("kube-scheduler", "kube-controller-manager"):
        return f"https://{LOOPBACK}:{rec.port}/healthz"
    if is_controller(rec.name) and rec.port:
        return f"http://{LOOPBACK}:{rec.port}/readyz"
    return None


def component_status(
    rec: ProcessRecord, *, server: str, ca_cert: Path, admin_token: str
) -> ComponentStatus:
    alive = procs.is_alive(rec)
    url = health_url(rec, server)
    if url is None:
        return ComponentStatus(
            rec.name, rec.pid, alive, rec.port, None, "running" if alive else "not running"
        )
    if not alive:
        return ComponentStatus(rec.name, rec.pid, False, rec.port, False, "not running")
    kwargs: dict[str, Any] = {"verify": False}  # scheduler, controller-manager: self-signed
    if rec.name == "kube-apiserver":
        kwargs = {"ca_file": ca_cert, "token": admin_token}
    elif rec.name == "etcd" or is_controller(rec.name):
        kwargs = {}
    code, body = http_get(url, **kwargs)
    detail = f"{url} -> {code} {body.strip()[:60]}"
    return ComponentStatus(rec.name, rec.pid, True, rec.port, healthy_answer(code, body), detail)


def node_status(api_client: Any, records: Sequence[NodeRecord]) -> list[NodeStatus]:
    """Each recorded node: does its Node object exist, and is it Ready?"""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    existing = {n.metadata.name: n for n in core.list_node().items if n.metadata}
    out = []
    for rec in records:
        node = existing.get(rec.name)
        ready = False
        if node is not None and node.status and node.status.conditions:
            ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        out.append(NodeStatus(rec.name, rec.profile, node is not None, ready))
    return out
