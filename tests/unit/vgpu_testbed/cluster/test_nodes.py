"""Node specs and manifests of kubelet-less test-bed nodes.

What this proves:
1. Profiles parse from a comma list, are validated as label values, and name nodes node-1..N.
2. The manifest is a Ready, untainted Node with allocatable == capacity, the kubelet's standard
   labels and the profile label.
"""

from __future__ import annotations

import pytest

from vgpu_testbed.cluster import nodes as cn


def test_parse_and_name() -> None:
    assert cn.parse_profiles("dgx-h100,a10-pcie") == ["dgx-h100", "a10-pcie"]
    specs = cn.node_specs(["dgx-h100", "a10-pcie", "dgx-h100"])
    assert [(s.name, s.profile) for s in specs] == [
        ("node-1", "dgx-h100"),
        ("node-2", "a10-pcie"),
        ("node-3", "dgx-h100"),
    ]


@pytest.mark.parametrize("bad", ["-x", "x-", "a b", "a/b", "x" * 64, ""])
def test_invalid_profiles(bad: str) -> None:
    with pytest.raises(ValueError, match="--nodes"):
        cn.parse_profiles(bad)


def test_no_nodes_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        cn.node_specs([])


def test_manifest() -> None:
    node = cn.node_manifest(cn.NodeSpec("node-2", "a10-pcie"))
    assert node["metadata"]["name"] == "node-2"
    labels = node["metadata"]["labels"]
    assert labels[cn.PROFILE_LABEL] == "a10-pcie"
    assert labels["kubernetes.io/hostname"] == "node-2"
    assert node["status"]["allocatable"] == node["status"]["capacity"] == cn.DEFAULT_ALLOCATABLE
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready"]
    assert node["status"]["conditions"][0]["status"] == "True"
    assert "taints" not in node["spec"]


def test_manifest_validates_as_a_client_model() -> None:
    from kubernetes import client

    model = client.V1Node.model_validate(cn.node_manifest(cn.NodeSpec("node-1", "t4")))
    assert model.status is not None and model.status.allocatable == cn.DEFAULT_ALLOCATABLE
