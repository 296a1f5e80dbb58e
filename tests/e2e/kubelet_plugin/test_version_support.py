"""Version support: a cluster whose API server drops consumable capacity (as 1.34/1.35 do with
the DRAConsumableCapacity alpha gate off) gets whole-GPU slices, written once, never rewritten.

A private test-bed cluster (one a10-pcie node, run for real where the host allows:
`vgpu_testbed.realnode.node.start_nodes`) runs with `DRAConsumableCapacity=false`; the real
kubelet plugin probes the server at start (kubelet_plugin.api_support), publishes its GPUs without
`allowMultipleAllocations`/`requestPolicy`, and a whole-GPU claim is allocated and prepared.
Without the probe, the publisher would rewrite the pool on every resync (unit test
tests/unit/kubelet_plugin/test_api_support.py shows the plan that would loop).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from kubelet_plugin.slice_publisher import SlicePublisher
from tests.fixtures.cluster import admin_client, node_runtime, require_binaries
from tests.fixtures.inventories import synthetic_inventory
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.cluster.flags import FEATURE_GATES
from vgpu_testbed.polling import wait_for
from vgpu_testbed.realnode.node import start_nodes
from vgpu_testbed.standin.node_agents import NodeAgents

# Longer than the 60 s default: the module starts a private cluster with a node.
pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[3]
DRIVER = "vgpu.dra.dev"
RESYNC_S = 0.5


@pytest.fixture(scope="module")
def gate_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_binaries()
    gates = {**FEATURE_GATES, "DRAConsumableCapacity": False}
    cluster = Cluster.start(
        tmp_path_factory.mktemp("gateoff"), ["a10-pcie"], gates=gates, die_with_parent=True
    )
    try:
        yield cluster
    finally:
        cluster.stop(keep_logs=True)


@pytest.fixture(scope="module")
def client(gate_off: Cluster) -> Iterator[KubeClient]:
    with admin_client(gate_off) as kc:
        yield kc


@pytest.fixture(scope="module")
def agents(gate_off: Cluster) -> Iterator[NodeAgents]:
    started = start_nodes(
        gate_off,
        ["node-1"],
        runtime=node_runtime(),
        plugin_args=["--resync-seconds", str(RESYNC_S)],
    )
    try:
        yield started["node-1"]
    finally:
        for node in started.values():
            node.stop()


def slices_of(client: KubeClient) -> list[dict[str, Any]]:
    return client.list(
        kube.path(RESOURCE_API, "resourceslices"),
        field_selector=f"spec.driver={DRIVER},spec.nodeName=node-1",
    )


def plugin_log(agents: NodeAgents) -> str:
    return (agents.cluster.root / "logs" / f"{agents.plugin_process}.log").read_text()


def test_the_server_really_drops_consumable_capacity(client: KubeClient) -> None:
    # Guards the premise: were the gate ignored, this module would prove nothing.
    from kubelet_plugin.api_support import SliceForm, probe_form

    assert probe_form(client, driver=DRIVER, node_name="node-1") is SliceForm.WHOLE


def test_whole_gpus_are_published_once_and_never_rewritten(
    client: KubeClient, agents: NodeAgents
) -> None:
    slices = wait_for("node-1's slices", lambda: slices_of(client))
    devices = [d for s in slices for d in s["spec"]["devices"]]
    assert devices
    for device in devices:
        assert "allowMultipleAllocations" not in device
        assert all("requestPolicy" not in c for c in device["capacity"].values())
    assert "Publishing every GPU as a whole device" in plugin_log(agents)
    versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices}
    # "Never rewritten" is a statement about time: let ten resync periods pass (each re-reads
    # the Node and the slices and would write on any difference), then nothing may have changed.
    time.sleep(10 * RESYNC_S)
    after = slices_of(client)
    assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in after} == versions
    assert {s["spec"]["pool"]["generation"] for s in after} == {1}
    assert plugin_log(agents).count("published pool") == 1


def test_a_whole_gpu_claim_is_allocated_and_prepared(
    client: KubeClient, agents: NodeAgents
) -> None:
    device_class = yaml.safe_load((REPO / "deploy" / "deviceclass.yaml").read_text())
    client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class)
    client.create(
        kube.path("v1", "namespaces"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "whole"}},
    )
    wait_for(
        "the default ServiceAccount",
        lambda: client.list(kube.path("v1", "serviceaccounts", namespace="whole")),
    )
    for doc in yaml.safe_load_all((REPO / "deploy" / "examples" / "whole-gpu.yaml").read_text()):
        plural = "resourceclaimtemplates" if doc["kind"] == "ResourceClaimTemplate" else "pods"
        api = RESOURCE_API if plural == "resourceclaimtemplates" else "v1"
        client.create(kube.path(api, plural, namespace="whole"), doc)

    def running() -> dict[str, Any] | None:
        pod = client.get(kube.path("v1", "pods", "whole-gpu", namespace="whole"))
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    pod = wait_for("the whole-gpu pod prepared", running)
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = client.get(
        kube.path(RESOURCE_API, "resourceclaims", status["resourceClaimName"], namespace="whole")
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert "consumedCapacity" not in result  # allocated whole, not by capacity
    assert agents.paths.cdi_spec(claim["metadata"]["uid"]).is_file()


def test_the_publisher_never_rewrites_what_the_server_alters(client: KubeClient) -> None:
    # The loop guard behind the probe: publishing the shareable form to this server (as a field
    # the probe does not know about would) is written once, then left alone until the GPUs change.
    driver = "loopguard.example.com"
    publisher = SlicePublisher(client, driver=driver, node_name="node-1")
    listed = kube.path(RESOURCE_API, "resourceslices")
    selector = f"spec.driver={driver}"
    try:
        assert publisher.sync(synthetic_inventory(2)) is True
        versions = [
            s["metadata"]["resourceVersion"] for s in client.list(listed, field_selector=selector)
        ]
        assert publisher.sync(synthetic_inventory(2)) is False
        assert publisher.sync(synthetic_inventory(2)) is False
        after = [
            s["metadata"]["resourceVersion"] for s in client.list(listed, field_selector=selector)
        ]
        assert after == versions
        # New GPUs are new content: published (once) again.
        assert publisher.sync(synthetic_inventory(3)) is True
        assert publisher.sync(synthetic_inventory(3)) is False
    finally:
        for obj in client.list(listed, field_selector=selector):
            client.delete(kube.path(RESOURCE_API, "resourceslices", obj["metadata"]["name"]))
