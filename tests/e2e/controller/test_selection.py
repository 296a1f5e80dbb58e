"""Device selection on the policy path agrees with kube-scheduler, and GPU UUID filters hold.

The allocation controller runs as `dev-cluster up --agents` runs it (vgpu_testbed.cluster.
controller: the chart's RBAC rendered by helm, a ServiceAccount token, leader election), under a
release and namespace of this module, on the session cluster. A throwaway driver publishes
slices on the session nodes: node-1 with 8 H100 in two NVLink islands, node-2 with 4 A10.

What this proves:
1. CEL selectors select the same devices on both paths. For random claims (selectors over
   product, memory, index, NUMA node, NVLink domain, compute capability and UUID, combined with
   && and ||, sometimes a capacity request) with `allocationMode: All` and the pod pinned to one
   node, kube-scheduler's allocation and the controller's are the same device set (the node's
   whole feasible set), or both refuse the claim.
2. `vgpu.dra.dev/include-gpu-uuid` places a claim on exactly the named GPUs (case-insensitive),
   `exclude-gpu-uuid` keeps it off the named ones, and excluding every candidate refuses the pod
   with an Event naming no device.

Nothing is mocked: the real apiserver validates the objects, the real kube-scheduler allocates.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.fixtures.allocator_cluster import ControllerBed, controller_bed, refused, remove
from tests.fixtures.cel_vocabulary import random_selector
from tests.fixtures.workloads import claim_pod, resource_claim
from vgpu_testbed.cluster import controller as bed_controller
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.polling import wait_for

# Longer than the 60 s default: every random claim is allocated twice on each node, then freed.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JSON = dict[str, Any]
T = TypeVar("T")
GATE = bed_controller.GATE
HOLD = "example.com/hold"  # keeps kube-scheduler from binding controller-placed pods
SLICES = kube.path(RESOURCE_API, "resourceslices")
NODES = {"node-1": ("NVIDIA H100 80GB HBM3", "two-islands", 8), "node-2": ("NVIDIA A10", "none", 4)}
RANDOM_CLAIMS = 12


Bed = ControllerBed


@pytest.fixture(scope="module")
def bed(cluster: Cluster, client: KubeClient) -> Iterator[Bed]:
    """The throwaway driver's DeviceClass and slices, and the controller; removed afterwards."""
    with controller_bed(cluster, client, NODES, tag="sel", first_id=200) as made:
        yield made


def claim_obj(name: str, driver: str, selector: str | None, **exactly: Any) -> JSON:
    request: JSON = {"deviceClassName": driver, **exactly}
    if selector:
        request["selectors"] = [{"cel": {"expression": selector}}]
    return resource_claim(name, request)


def pod_obj(name: str, *, node: str | None, gated: bool, annotations: dict[str, str]) -> JSON:
    pod = claim_pod(name, {"resourceClaimName": name})
    pod["metadata"]["annotations"] = {f"vgpu.dra.dev/{k}": v for k, v in annotations.items()}
    if node:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": GATE}, {"name": HOLD}]
    return pod


def submit(
    client: KubeClient,
    ns: str,
    claim: JSON,
    *,
    node: str | None = None,
    gated: bool,
    annotations: dict[str, str] | None = None,
) -> str:
    name = str(claim["metadata"]["name"])
    client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=ns), claim)
    pod = pod_obj(name, node=node, gated=gated, annotations=annotations or {})
    client.create(kube.path("v1", "pods", namespace=ns), pod)
    return name


def outcome(client: KubeClient, ns: str, name: str) -> tuple[str, frozenset[str]] | None:
    """(node, devices) once pod `name`'s claim is allocated; None once its path refused it
    (kube-scheduler: PodScheduled=False Unschedulable; controller: its Placement condition)."""

    def decided() -> tuple[tuple[str, frozenset[str]] | None] | None:
        claim = client.get(kube.path(RESOURCE_API, "resourceclaims", name, namespace=ns))
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            term = allocation["nodeSelector"]["nodeSelectorTerms"][0]
            node = str(term["matchFields"][0]["values"][0])
            devices = frozenset(str(r["device"]) for r in allocation["devices"]["results"])
            return ((node, devices),)
        pod = client.get(kube.path("v1", "pods", name, namespace=ns))
        return (None,) if refused(pod) else None

    return wait_for(f"a decision on {ns}/{name}", decided)[0]


def test_cel_selectors_select_what_kube_scheduler_selects(
    client: KubeClient, bed: Bed, namespace: str
) -> None:
    rng = random.Random(20261124)
    seen = {"both-allocate": 0, "both-refuse": 0}
    for i in range(RANDOM_CLAIMS):
        selector = random_selector(rng, bed.driver, bed.uuids)
        extra: JSON = {"allocationMode": "All"}
        if rng.random() < 0.3:  # a share of each matched device: all must have room
            extra["capacity"] = {"requests": {"memory": rng.choice(["10Gi", "30Gi"])}}
        for node in sorted(NODES):
            by_scheduler = submit(client, namespace, claim_obj(f"k{i}-{node}", bed.driver,
                                  selector, **extra), node=node, gated=False)  # fmt: skip
            theirs = outcome(client, namespace, by_scheduler)
            remove(client, namespace, [by_scheduler])
            by_controller = submit(client, namespace, claim_obj(f"c{i}-{node}", bed.driver,
                                   selector, **extra), node=node, gated=True)  # fmt: skip
            ours = outcome(client, namespace, by_controller)
            remove(client, namespace, [by_controller])
            assert ours == theirs, (
                f"claim {i} on {node}, selector {selector!r}, {extra}: "
                f"kube-scheduler {theirs}, controller {ours}"
            )
            seen["both-allocate" if ours else "both-refuse"] += 1
    # The random sequence must exercise both sides, or it proves little.
    assert seen["both-allocate"] >= 3 and seen["both-refuse"] >= 3, seen


def test_gpu_uuid_include_and_exclude(client: KubeClient, bed: Bed, namespace: str) -> None:
    a10 = bed.uuids["node-2"]
    h100 = bed.uuids["node-1"]
    # Include: exactly the two named GPUs, on two different nodes' lists -> only one node can
    # hold both of a 2-GPU claim, and the names are matched case-insensitively.
    submit(client, namespace, claim_obj("incl", bed.driver, None, count=2), gated=True,
           annotations={"include-gpu-uuid": f"{h100[5].upper()},{h100[2]},{a10[0]}"})  # fmt: skip
    assert outcome(client, namespace, "incl") == ("node-1", frozenset({"gpu-2", "gpu-5"}))
    # Exclude: three of the four A10s named, an A10-only claim lands on the fourth.
    only_a10 = f'device.attributes["{bed.driver}"].productName == "NVIDIA A10"'
    submit(client, namespace, claim_obj("excl", bed.driver, only_a10, count=1), gated=True,
           annotations={"exclude-gpu-uuid": ",".join([a10[0], a10[1], a10[3]])})  # fmt: skip
    assert outcome(client, namespace, "excl") == ("node-2", frozenset({"gpu-2"}))
    # Excluding every A10: refused, with an Event, and nothing allocated.
    submit(client, namespace, claim_obj("none", bed.driver, only_a10, count=1), gated=True,
           annotations={"exclude-gpu-uuid": ",".join(a10)})  # fmt: skip
    assert outcome(client, namespace, "none") is None
    # The Placement condition can be seen before the Event is recorded: await the Event.
    events = wait_for(
        "the refusal Event of pod none",
        lambda: client.list(kube.path("v1", "events", namespace=namespace),
                            field_selector="involvedObject.name=none"),
    )  # fmt: skip
    assert [e["reason"] for e in events] == ["Unschedulable"], events
    pod = client.get(kube.path("v1", "pods", "none", namespace=namespace))
    assert GATE in [g["name"] for g in pod["spec"]["schedulingGates"]]
    # Include and exclude together: the included GPU that is also excluded is not used.
    submit(client, namespace, claim_obj("both", bed.driver, None, count=1), gated=True,
           annotations={"include-gpu-uuid": f"{h100[0]},{h100[7]}",
                        "exclude-gpu-uuid": h100[0]})  # fmt: skip
    assert outcome(client, namespace, "both") == ("node-1", frozenset({"gpu-7"}))
