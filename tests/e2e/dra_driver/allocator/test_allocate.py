"""The allocator against the real kube-scheduler: same cluster, same random claims.

Slices of a throwaway driver name are published for the session nodes (node-1: 8 H100 in two
NVLink islands; node-2: 4 A10 without NVLink), then random claims (CEL selectors, capacity
requests, matchAttribute/distinctAttribute) are submitted one at a time, each with a pod. Before
each submission the allocator decides on a model built from what the API server holds; then:

- every allocation kube-scheduler makes must pass the allocator's acceptance check
  (tests/fixtures/allocation_check.py) on that model;
- every claim the allocator refuses must stay unallocated (its pod is marked Unschedulable).

Nothing is mocked: the real apiserver validates the objects and the real scheduler allocates.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.allocator.allocate import Allocator, Unschedulable
from dra_driver.allocator.model import ClusterModel
from dra_driver.allocator.request import Policy, parse_claim
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.fixtures.allocation_check import check_allocation
from tests.fixtures.allocator_cluster import device_class, publish_slices
from tests.fixtures.workloads import claim_pod

# Longer than the 60 s default: the module fixtures load many nodes' slices into the session cluster
# and the test waits for kube-scheduler on each claim.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CLAIMS = 14
SLICES = kube.path(RESOURCE_API, "resourceslices")
NODES = {"node-1": ("NVIDIA H100 80GB HBM3", "two-islands", 8), "node-2": ("NVIDIA A10", "none", 4)}


@pytest.fixture(scope="module")
def driver(client: KubeClient) -> Iterator[str]:
    """A throwaway driver: its DeviceClass and slices on the session nodes, removed afterwards."""
    name = f"t{uuid.uuid4().hex[:6]}.alloc.vgpu.dra.dev"
    client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class(name))
    created: list[str] = []
    try:
        publish_slices(client, name, NODES, created)
        yield name
    finally:
        for slice_name in created:
            client.delete(kube.path(RESOURCE_API, "resourceslices", slice_name))
        client.delete(kube.path(RESOURCE_API, "deviceclasses", name))


def random_claim(rng: random.Random, driver: str, name: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": driver, "count": rng.choice([1, 1, 2, 3])}
    requests = {}
    memory = rng.choice([None, "1000", "4Gi", "20Gi", "40Gi"])
    cores = rng.choice([None, "10", "50"])
    if memory:
        requests["memory"] = memory
    if cores:
        requests["cores"] = cores
    if requests:
        exactly["capacity"] = {"requests": requests}
    selector = rng.choice(
        [
            None,
            f'device.attributes["{driver}"].productName.startsWith("NVIDIA H100")',
            f'device.capacity["{driver}"].memory.compareTo(quantity("30Gi")) < 0',
            f'device.attributes["{driver}"].index >= 2',
            f'device.attributes["{driver}"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))',
        ]
    )
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    constraint = rng.choice([None, "match-link", "distinct-numa"])
    if constraint == "match-link":
        devices["constraints"] = [{"matchAttribute": f"{driver}/nvlinkDomain"}]
    elif constraint == "distinct-numa":
        devices["constraints"] = [{"distinctAttribute": f"{driver}/numaNode"}]
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def snapshot(client: KubeClient) -> tuple[ClusterModel, dict[str, Any]]:
    """The allocator's model of everything the API server holds now, and the DeviceClasses."""
    model = ClusterModel()
    for kind, plural, api in (
        ("Node", "nodes", "v1"),
        ("ResourceSlice", "resourceslices", RESOURCE_API),
        ("Pod", "pods", "v1"),
        ("ResourceClaim", "resourceclaims", RESOURCE_API),
    ):
        for obj in client.list(kube.path(api, plural)):
            model.apply(kind, obj)
    classes = {
        c["metadata"]["name"]: c for c in client.list(kube.path(RESOURCE_API, "deviceclasses"))
    }
    return model, classes


def settle(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    """Wait until the scheduler allocated the claim (-> allocation) or gave up on the pod."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        claim = client.get(kube.path(RESOURCE_API, "resourceclaims", name, namespace=namespace))
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            return dict(allocation)
        pod = client.get(kube.path("v1", "pods", name, namespace=namespace))
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                return None
        time.sleep(0.2)
    raise AssertionError(f"claim {namespace}/{name}: neither allocated nor unschedulable in 30s")


def test_scheduler_allocations_are_feasible_and_refusals_agree(
    client: KubeClient, driver: str, namespace: str
) -> None:
    rng = random.Random(20261123)
    outcomes = {"both": 0, "allocator-only": 0, "neither": 0}
    for i in range(CLAIMS):
        name = f"c{i}"
        obj = random_claim(rng, driver, name)
        model, classes = snapshot(client)
        claim = parse_claim({**obj, "metadata": {"name": name, "namespace": namespace}}, classes)
        try:
            Allocator(model).place({"spec": {}}, [claim], Policy())
            ours = True
        except Unschedulable:
            ours = False
        client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace), obj)
        pod = claim_pod(name, {"resourceClaimName": name})
        client.create(kube.path("v1", "pods", namespace=namespace), pod)
        allocation = settle(client, namespace, name)
        if allocation is not None:
            problems = check_allocation(model, claim, allocation)
            assert problems == [], f"{obj['spec']}: scheduler allocated {allocation}: {problems}"
            assert ours, f"the allocator refused {obj['spec']}, kube-scheduler allocated it"
            outcomes["both"] += 1
        else:
            outcomes["allocator-only" if ours else "neither"] += 1
    # The random sequence must exercise both sides, or it proves little.
    assert outcomes["both"] >= 3 and outcomes["neither"] >= 1, outcomes
