"""The cluster directory's `state.json`: what was started, on which ports, and which simulated GPU
profile each node has.

Why a file: `vgpu-dra dev-cluster up` exits while the components keep running, and `down`,
`status`, the demo or another engineer's tooling (the kubelet stand-in needs the node -> profile
map) must find them again. Written atomically after every change, so a crash mid-start still
leaves a file from which `down` can stop what did start. Called by
`vgpu_testbed.cluster.control_plane`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.atomicfile import write_atomic
from vgpu_testbed.procs import ProcessRecord


class NodeRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    profile: str
    kubeconfig: str  # this node's identity (system:node:<name>), for a kubelet stand-in


class ClusterState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    k8s_version: str
    root: str
    server: str = ""  # https://127.0.0.1:<port>
    kubeconfig: str = ""  # admin kubeconfig
    ca_cert: str = ""
    ports: dict[str, int] = Field(default_factory=dict)
    processes: list[ProcessRecord] = Field(default_factory=list)
    nodes: list[NodeRecord] = Field(default_factory=list)
    ready: bool = False  # set once every component answered healthy and the nodes exist
    started_at: float = 0.0
    # kube-scheduler's and kube-controller-manager's --kube-api-qps/--kube-api-burst; None = stock
    client_qps: int | None = None
    client_burst: int | None = None

    def profile_of(self, node: str) -> str:
        for rec in self.nodes:
            if rec.name == node:
                return rec.profile
        raise KeyError(f"no node {node!r} in this cluster (nodes: {[n.name for n in self.nodes]})")


class StateError(RuntimeError):
    """No usable state file in a cluster directory."""


def save(state: ClusterState, path: Path) -> None:
    """Replace `path` atomically (temp file in the same directory, fsync, rename), mode 0600."""
    data = json.dumps(state.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    write_atomic(str(path), data.encode(), mode=0o600)


def load(path: Path) -> ClusterState:
    try:
        raw = path.read_text()
    except FileNotFoundError:
        raise StateError(
            f"no cluster state at {path}: nothing was started in {path.parent} "
            "(run `vgpu-dra dev-cluster up` first, or pass the --dir it used)"
        ) from None
    try:
        return ClusterState.model_validate_json(raw)
    except ValidationError as err:
        raise StateError(f"{path} is not a valid cluster state file: {err}") from err
