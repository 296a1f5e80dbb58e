"""The controller's /metrics on the real control plane, scraped over HTTP and parsed with the
Prometheus text parser.

Set up like test_policy_path.py, smaller: the chart's controller RBAC in a namespace of this
module, a ServiceAccount token kubeconfig, one stand-in node publishing 4 x A10 (24 GiB) of a
throwaway driver, and one controller process with leader election and `--metrics-address
127.0.0.1:0` (it logs the URL).

Proves, after a known workload (one 4 GiB pod placed, one 30 GiB pod that fits no A10): leader
1; every informer synced; one placement with its decision latency; refusals (Unschedulable)
and that pod waiting; the node's capacity and 4 GiB allocated; all its free memory stranded
for the waiting request; the admission-free registry follows the naming conventions.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from dra_driver.slices import build_slices
from tests.fixtures.allocator_cluster import MEMORY, SHAPES, device_class, inventory
from tests.fixtures.controller import Controller, controller_account, remove_driver
from tests.fixtures.scrape import Samples, scrape
from tests.fixtures.workloads import pause_pod, resource_claim
from vgpu_testbed.cluster import boot as cluster_boot
from vgpu_testbed.cluster import nodes as cluster_nodes
from vgpu_testbed.polling import wait_for

# Longer than the 60 s default: the module fixture installs RBAC and a stand-in node; the test
# runs a controller process and waits for its decisions.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

JSON = dict[str, Any]
GIB = 1 << 30
A10 = "NVIDIA A10"
GPUS = 4
GATE = "vgpu.dra.dev/policy"
SLICES = kube.path(RESOURCE_API, "resourceslices")
P = "vgpu_dra_controller_"


@dataclass
class Bed:
    node: str
    driver: str
    system_ns: str
    kubeconfig: Path
    logs: Path


@pytest.fixture(scope="module")
def bed(
    cluster: Any, client: KubeClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bed]:
    prefix = f"m{uuid.uuid4().hex[:5]}"
    driver = f"{prefix}.metrics.vgpu.dra.dev"
    node = f"{prefix}-a10"
    home = tmp_path_factory.mktemp("controller-metrics")
    with controller_account(client, cluster, home, prefix) as account:
        try:
            client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class(driver))
            api_client = cluster.api_client()
            try:
                cluster_boot.create_nodes(api_client, [cluster_nodes.NodeSpec(node, "t-a10")])
            finally:
                api_client.close()
            uid = client.get(kube.path("v1", "nodes", node))["metadata"]["uid"]
            for obj in build_slices(
                inventory(200, GPUS, A10, SHAPES["none"]),
                driver=driver,
                node_name=node,
                node_uid=uid,
            ):
                obj["spec"]["pool"]["generation"] = 1
                client.create(SLICES, obj)
            yield Bed(node, driver, account.system_ns, account.kubeconfig, account.logs)
        finally:
            remove_driver(client, driver)
            client.delete(kube.path("v1", "nodes", node))


@pytest.fixture
def controller(bed: Bed) -> Iterator[Controller]:
    c = Controller(bed, "controller", "--metrics-address", "127.0.0.1:0")
    try:
        yield c
    finally:
        assert c.stop() == 0, c.text()


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def submit(client: KubeClient, ns: str, name: str, driver: str, memory: str) -> None:
    exactly = {"deviceClassName": driver, "capacity": {"requests": {"memory": memory}}}
    claim = resource_claim(name, exactly)
    client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=ns), claim)
    pod = pause_pod(name, {"gpu": {"resourceClaimName": name}})
    # A second gate keeps kube-scheduler from binding to the stand-in node.
    pod["spec"]["schedulingGates"] = [{"name": GATE}, {"name": "example.com/keep"}]
    client.create(kube.path("v1", "pods", namespace=ns), pod)


def test_the_controllers_metrics_after_a_known_workload(
    client: KubeClient,
    bed: Bed,
    namespace: str,
    controller: Controller,
) -> None:
    proc, log = controller.proc, controller.log

    def url() -> str | None:
        assert proc.poll() is None, log.read_text()
        found = re.findall(r"metrics_url=(http://\S+)", log.read_text())
        return found[-1] if found else None

    metrics = wait_for("the controller's metrics URL in its log", url)

    def leading() -> Samples | None:
        s = scrape(metrics)
        synced = [v for (n, _), v in s.items() if n == P + "informer_synced"]
        return s if value(s, P + "leader") == 1 and synced and min(synced) == 1 else None

    samples = wait_for("leadership and synced informers", leading)
    synced = {dict(k[1])["resource"] for k in samples if k[0] == P + "informer_synced"}
    assert synced == {
        "pods",
        "nodes",
        "resourceslices",
        "resourceclaims",
        "deviceclasses",
        "devicetaintrules",
    }
    node = {"node": bed.node}
    assert value(samples, P + "node_gpus", **node) == GPUS
    assert value(samples, P + "node_memory_capacity_bytes", **node) == GPUS * MEMORY[A10]
    assert value(samples, P + "node_cores_capacity", **node) == GPUS * 100

    submit(client, namespace, "fits", bed.driver, "4Gi")
    submit(client, namespace, "too-big", bed.driver, "30Gi")

    def decided() -> Samples | None:
        s = scrape(metrics)
        # Every change of a claim, node or slice makes the waiting pod worth another decision
        # (each counted): at least one refusal.
        refused = value(s, P + "placement_failures_total", reason="refused") or 0
        return s if value(s, P + "placements_total") == 1 and refused >= 1 else None

    try:
        samples = wait_for("one placement and one refusal", decided)
    except TimeoutError as exc:
        last = {k: v for k, v in scrape(metrics).items() if "placement" in k[0]}
        raise AssertionError(f"{exc}; metrics {last}; log:\n{log.read_text()[-3000:]}") from None
    assert value(samples, P + "decision_duration_seconds_count", outcome="placed") == 1
    assert (value(samples, P + "decision_duration_seconds_sum", outcome="placed") or 0) > 0
    assert value(samples, P + "pending_pods", state="waiting") == 1
    assert value(samples, P + "node_memory_allocated_bytes", **node) == 4 * GIB
    free = GPUS * MEMORY[A10] - 4 * GIB
    # No free block of this node takes 30 GiB; GPUs of other tests' nodes may add theirs.
    assert (value(samples, P + "stranded_memory_bytes") or 0) >= free
    # 20 GiB on the used GPU, 24 GiB on each of the three others: the largest is 24 of 92.
    fragmentation = value(samples, P + "node_memory_fragmentation_ratio", **node)
    assert fragmentation == pytest.approx(1 - MEMORY[A10] / free)
    # Besides the controller's own, only the supervised loops' series (shared with the plugin).
    assert all(name.startswith((P, "vgpu_dra_loop_")) for name, _ in samples)
    loops = {dict(labels)["loop"]: v for (name, labels), v in samples.items()
             if name == "vgpu_dra_loop_failures_total"}  # fmt: skip
    assert {"worker", "reconciler", "leader-election"} <= set(loops) and not any(loops.values())
