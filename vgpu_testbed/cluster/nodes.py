"""Node objects for kubelet-less nodes: the spec parsing (`dgx-h100,a10-pcie` -> node-1, node-2)
and the manifest the scheduler needs to place pods on them.

Why kubelet-less nodes work: the scheduler only needs a Node with allocatable resources and no
taints; nothing heartbeats, so node-lifecycle must not run (see flags.CONTROLLERS). The
GPU profile label tells a later kubelet plugin which simulated machine this node is. Called by
`vgpu_testbed.cluster.control_plane`, the CLI and the demo.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Label carrying the simulated GPU profile (a file stem under hack/fakegpu/profiles/).
PROFILE_LABEL = "vgpu.dra.dev/fakegpu-profile"
DEFAULT_PROFILES: tuple[str, ...] = ("dgx-h100", "a10-pcie")
DEFAULT_ALLOCATABLE: dict[str, str] = {"cpu": "32", "memory": "256Gi", "pods": "110"}

# A label value: at most 63 characters, alphanumerics with - _ . inside.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    profile: str


def parse_profiles(text: str) -> list[str]:
    """`a,b,c` -> ["a", "b", "c"], each a valid label value; errors name the bad item."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ValueError(
            f"--nodes {text!r}: expected a comma-separated list like dgx-h100,a10-pcie"
        )
    for item in items:
        if not _LABEL_VALUE.match(item):
            raise ValueError(
                f"--nodes: profile {item!r} is not a valid label value (letters, digits, '-', "
                "'_', '.'; at most 63 characters; starting and ending with a letter or digit)"
            )
    return items


def profiles_arg(text: str) -> list[str]:
    """`parse_profiles` as an argparse `type=`: the `--nodes` option of dev-cluster and demo."""
    try:
        return parse_profiles(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def node_specs(profiles: Sequence[str]) -> list[NodeSpec]:
    """Nodes are named node-1, node-2, ... in the order of their profiles."""
    if not profiles:
        raise ValueError("a cluster needs at least one node")
    return [NodeSpec(name=f"node-{i}", profile=p) for i, p in enumerate(profiles, start=1)]


def node_manifest(spec: NodeSpec, allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    """A Ready Node with capacity = allocatable, labelled like a kubelet would label it."""
    resources = dict(allocatable or DEFAULT_ALLOCATABLE)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                PROFILE_LABEL: spec.profile,
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "TestbedNode",
                    "message": "kubelet-less node of the vgpu-dra test bed",
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "vgpu-dra testbed",
                "kernelVersion": "",
                "kubeletVersion": "",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }
