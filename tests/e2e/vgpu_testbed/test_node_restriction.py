"""The test bed refuses what a real cluster refuses: a node's credentials reach only its own
objects (Node authorizer + the NodeRestriction admission plugin, issue 15.9).

node-2's kubeconfig (system:node:node-2 in system:nodes) may create a ResourceSlice for node-2
but not for node-1, and may not patch node-1's labels.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver import kube
from vgpu_testbed.cluster.control_plane import Cluster

# Longer than the 60 s default: the first test may start the session cluster.
pytestmark = pytest.mark.timeout(180)


SLICES = kube.path(kube.RESOURCE_API, "resourceslices")


def slice_for(node: str) -> dict[str, Any]:
    name = f"restriction-{node}-{uuid.uuid4().hex[:6]}"
    return {
        "apiVersion": kube.RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "restriction.test.dev",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
        },
    }


@pytest.fixture
def kube_admin(cluster: Cluster) -> Iterator[kube.KubeClient]:
    client = kube.KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def node2(cluster: Cluster) -> Iterator[kube.KubeClient]:
    client = kube.KubeClient.from_kubeconfig(str(cluster.node_kubeconfig("node-2")))
    yield client
    client.close()


def test_a_node_cannot_create_another_nodes_slice(
    node2: kube.KubeClient, kube_admin: kube.KubeClient
) -> None:
    own = node2.create(SLICES, slice_for("node-2"))  # its own node: allowed
    try:
        with pytest.raises(kube.KubeError) as denied:
            node2.create(SLICES, slice_for("node-1"))
        assert denied.value.status == 403, denied.value
        foreign = kube_admin.list(SLICES, field_selector="spec.nodeName=node-1")
        assert not [s for s in foreign if s["spec"]["driver"] == "restriction.test.dev"]
    finally:
        kube_admin.delete(kube.path(kube.RESOURCE_API, "resourceslices", own["metadata"]["name"]))


def test_a_node_cannot_patch_another_nodes_labels(
    node2: kube.KubeClient, kube_admin: kube.KubeClient
) -> None:
    node1 = kube.path("v1", "nodes", "node-1")
    with pytest.raises(kube.KubeError) as denied:
        node2.merge_patch(node1, {"metadata": {"labels": {"restriction.test/owned": "node-2"}}})
    assert denied.value.status == 403, denied.value
    labels = kube_admin.get(node1)["metadata"].get("labels") or {}
    assert "restriction.test/owned" not in labels
