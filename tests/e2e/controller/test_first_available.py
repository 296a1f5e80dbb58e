"""`firstAvailable` claims: the policy path chooses the subrequest kube-scheduler chooses.

Same bed as test_selection.py: a throwaway driver publishes slices on the session nodes (node-1:
8 H100 in two NVLink islands, node-2: 4 A10) and the allocation controller runs on the session
cluster under a release of this module.

What this proves:
1. For random claims whose requests are `firstAvailable` lists (1-4 subrequests, each with a
   count or `allocationMode: All`, memory/cores capacity requests, CEL selectors from the
   vocabulary of the CEL parity test, tests/fixtures/cel_vocabulary.py), on a random cluster state
   (pre-existing allocations that take some GPUs' memory and cores, so that earlier subrequests
   often cannot fit), with the pod pinned to one node or (a third of the cases, one request
   each) left to the scheduler: kube-scheduler (an ungated pod) and the controller (a gated pod)
   choose the same subrequest for every request (the results' `request` field,
   `<request>/<subrequest>`), or both refuse the claim; and each allocation is one the API
   allows on that state (tests/fixtures/allocation_check.py). The devices may differ:
   kube-scheduler takes the first fit in slice order, the controller its device policy; so may
   the node where both allow the same subrequest (kube-scheduler's other scores, the
   controller's node policy). Across nodes kube-scheduler prefers the node where earlier
   subrequests fit (its DynamicResources score), and so does the controller.
   A claim with two requests gives them disjoint devices (even / odd index): where requests can
   share devices, a later request's choice depends on the devices an earlier one took, which is
   where the two paths legitimately differ (3.).
2. The seed and every case are printed (`pytest -s`); `VGPU_DRA_PARITY_CASES` raises the number of
   cases for a long run (docs/scheduling.md reports one).
3. The documented difference (docs/scheduling.md, "firstAvailable: the two paths"): when two
   requests of a claim compete for a device, kube-scheduler's first fit gives the first request
   the first device in slice order and the second request falls back to a later subrequest; the
   controller's default `spread` device policy gives the first request the free GPU, and the
   second request gets its first subrequest. With `device-scheduler-policy: binpack` the
   controller chooses as kube-scheduler does.

Nothing is mocked: the real apiserver validates the objects, the real kube-scheduler allocates.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.allocator.model import ClusterModel
from dra_driver.allocator.request import parse_claim
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.fixtures.allocation_check import check_allocation
from tests.fixtures.allocator_cluster import ControllerBed, controller_bed, refused, remove
from tests.fixtures.cel_vocabulary import random_selector
from tests.fixtures.workloads import claim_pod
from vgpu_testbed.cluster import controller as bed_controller
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.polling import wait_for

JSON = dict[str, Any]
SEED = 20261128
CASES = int(os.environ.get("VGPU_DRA_PARITY_CASES", "40"))
# Each case: up to four placements and three deletions, about 2 s on a quiet 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(max(600, 20 * CASES))]

GATE = bed_controller.GATE
HOLD = "example.com/hold"  # keeps kube-scheduler from binding controller-placed pods
NODES = {"node-1": ("NVIDIA H100 80GB HBM3", "two-islands", 8), "node-2": ("NVIDIA A10", "none", 4)}
# What a pre-existing allocation takes of one GPU: memory (None: all of it, as a request naming
# no memory does) and cores (None: none).
FILLER_MEMORY = {"node-1": [None, "40Gi", "70Gi", "78Gi"], "node-2": [None, "12Gi", "20Gi", "22Gi"]}
FILLER_CORES = [None, "50", "90"]


Bed = ControllerBed


@pytest.fixture(scope="module")
def bed(cluster: Cluster, client: KubeClient) -> Iterator[Bed]:
    """The throwaway driver's DeviceClass and slices, and the controller; removed afterwards."""
    with controller_bed(cluster, client, NODES, tag="first", first_id=300) as made:
        yield made


# ------------------------------------------------------------------------------ the cases


Fillers = tuple[tuple[int, str | None, str | None], ...]  # (GPU index, memory, cores) taken


@dataclass(frozen=True)
class Case:
    index: int
    node: str | None  # None: any node
    fillers: dict[str, Fillers]  # per node
    requests: tuple[JSON, ...]  # the claim's spec.devices.requests

    def describe(self) -> str:
        taken = "; ".join(
            f"{node} " + ", ".join(f"gpu-{i}: {m or 'all'} mem {c or 0} cores" for i, m, c in f)
            for node, f in sorted(self.fillers.items())
        )
        lines = [f"case {self.index} on {self.node or 'any node'}; taken: {taken or 'nothing'}"]
        for request in self.requests:
            for sub in request.get("firstAvailable") or [{**request["exactly"], "name": ""}]:
                amount = (sub.get("capacity") or {}).get("requests") or {}
                selectors = [s["cel"]["expression"] for s in sub.get("selectors") or []]
                name = f"{request['name']}/{sub['name']}".rstrip("/")
                lines.append(
                    f"  {name}: {sub.get('allocationMode') or sub.get('count')} x {amount} "
                    f"where {selectors}"
                )
        return "\n".join(lines)


def random_subrequest(rng: random.Random, bed: Bed, name: str, partition: str | None) -> JSON:
    """One subrequest (or `exactly` request, without the name): a count or All, capacity
    requests as the slices publish them (memory in bytes, cores of 100), CEL selectors."""
    sub: JSON = {"name": name, "deviceClassName": bed.driver}
    if rng.random() < 0.2:
        sub["allocationMode"] = "All"
    else:
        sub["count"] = rng.choice([1, 1, 1, 2, 2, 3, 4])
    amounts = {
        k: v
        for k, v in (
            ("memory", rng.choice([None, "4Gi", "10Gi", "20Gi", "30Gi", "60Gi"])),
            ("cores", rng.choice([None, None, "10", "30", "60"])),
        )
        if v is not None
    }
    if amounts:
        sub["capacity"] = {"requests": amounts}
    selectors = [s for s in (partition, random_selector(rng, bed.driver, bed.uuids)) if s]
    if selectors:
        sub["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return sub


def random_case(rng: random.Random, bed: Bed, index: int) -> Case:
    # A third of the cases leave the node to the scheduler: kube-scheduler scores nodes by the
    # subrequests they allow, the controller ranks them likewise. Those claims make one request
    # (two requests' positions add up: equal sums on two nodes leave the choice to other scores).
    node = None if rng.random() < 0.33 else rng.choice(sorted(NODES))
    fillers: dict[str, Fillers] = {}
    for on in [node] if node else sorted(NODES):
        taken = tuple(
            (i, rng.choice(FILLER_MEMORY[on]), rng.choice(FILLER_CORES))
            for i in range(NODES[on][2])
            if rng.random() < 0.5
        )
        if taken:
            fillers[on] = taken
    n_requests = 2 if node and rng.random() < 0.25 else 1
    requests: list[JSON] = []
    for k, name in enumerate(["gpu", "aux"][:n_requests]):
        # Two requests get disjoint devices, so neither's choice depends on the other's devices.
        partition = (
            f'device.attributes["{bed.driver}"].index % 2 == {k}' if n_requests > 1 else None
        )
        if k > 0 and rng.random() < 0.4:
            exactly = random_subrequest(rng, bed, "", partition)
            del exactly["name"]
            requests.append({"name": name, "exactly": exactly})
            continue
        subs = [random_subrequest(rng, bed, f"s{j}", partition) for j in range(rng.randint(1, 4))]
        if len(subs) > 1 and rng.random() < 0.7:  # a modest last resort, as users write them
            subs[-1] = {"name": subs[-1]["name"], "deviceClassName": bed.driver, "count": 1,
                        "capacity": {"requests": {"memory": "2Gi"}}}  # fmt: skip
            if partition:
                subs[-1]["selectors"] = [{"cel": {"expression": partition}}]
        requests.append({"name": name, "firstAvailable": subs})
    return Case(index, node, fillers, tuple(requests))


# ------------------------------------------------------------------------- on the cluster


def claim_obj(name: str, requests: tuple[JSON, ...] | list[JSON]) -> JSON:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": list(requests)}},
    }


def submit(
    client: KubeClient,
    ns: str,
    claim: JSON,
    *,
    node: str | None,
    gated: bool,
    annotations: dict[str, str] | None = None,
) -> str:
    """The claim and a pod using it, pinned to `node` (None: any); gated: placed by the
    controller."""
    name = str(claim["metadata"]["name"])
    client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=ns), claim)
    pod = claim_pod(name, {"resourceClaimName": name})
    policy = {f"vgpu.dra.dev/{k}": v for k, v in (annotations or {}).items()}
    pod["metadata"]["annotations"] = policy
    if node:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": GATE}, {"name": HOLD}]
    client.create(kube.path("v1", "pods", namespace=ns), pod)
    return name


def decision(client: KubeClient, ns: str, name: str) -> JSON | None:
    """The claim's allocation once made; None once its path refused the pod (kube-scheduler:
    PodScheduled=False Unschedulable; controller: its Placement condition False)."""

    def decided() -> tuple[JSON | None] | None:
        claim = client.get(kube.path(RESOURCE_API, "resourceclaims", name, namespace=ns))
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            return (dict(allocation),)
        pod = client.get(kube.path("v1", "pods", name, namespace=ns))
        return (None,) if refused(pod) else None

    return wait_for(f"a decision on {ns}/{name}", decided)[0]


def take(client: KubeClient, ns: str, bed: Bed, name: str, *, node: str, fillers: Fillers) -> None:
    """Pre-existing allocations: one claim with a request per GPU of `fillers`, placed by the
    controller on `node` (the pod stays gated, so it never binds)."""
    requests = []
    for i, memory, cores in fillers:
        gpu = bed.uuids[node][i]
        exactly: JSON = {
            "deviceClassName": bed.driver,
            "count": 1,
            "selectors": [{"cel": {"expression":
                           f'device.attributes["{bed.driver}"].uuid == "{gpu}"'}}],
        }  # fmt: skip
        amounts = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
        if amounts:
            exactly["capacity"] = {"requests": amounts}
        requests.append({"name": f"f{i}", "exactly": exactly})
    submit(client, ns, claim_obj(name, requests), node=node, gated=True)
    assert decision(client, ns, name) is not None, f"pre-existing allocations {fillers} refused"


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


def chosen(allocation: JSON | None) -> tuple[tuple[str, str], ...] | None:
    """Per request, the (sub)request its results name: `gpu/s1` (or `gpu` for `exactly`)."""
    if allocation is None:
        return None
    names = {str(r["request"]) for r in allocation["devices"]["results"]}
    return tuple(sorted((n.split("/")[0], n) for n in names))


def node_of(allocation: JSON | None) -> str | None:
    if allocation is None:
        return None
    return str(allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0])


def place_both(
    client: KubeClient,
    ns: str,
    requests: tuple[JSON, ...] | list[JSON],
    *,
    tag: str,
    node: str | None,
    annotations: dict[str, str] | None = None,
) -> tuple[JSON | None, JSON | None]:
    """The same claim placed by kube-scheduler, freed, then placed by the controller, freed:
    (kube-scheduler's allocation, the controller's), None for a refusal."""
    theirs_name = submit(client, ns, claim_obj(f"k{tag}", requests), node=node, gated=False)
    theirs = decision(client, ns, theirs_name)
    remove(client, ns, [theirs_name])
    ours_name = submit(client, ns, claim_obj(f"c{tag}", requests), node=node, gated=True,
                       annotations=annotations)  # fmt: skip
    ours = decision(client, ns, ours_name)
    remove(client, ns, [ours_name])
    return theirs, ours


def test_first_available_chooses_what_kube_scheduler_chooses(
    client: KubeClient, bed: Bed, namespace: str
) -> None:
    rng = random.Random(SEED)
    print(f"\nfirstAvailable parity: seed {SEED}, {CASES} cases")
    seen = {"first": 0, "later": 0, "refused": 0}
    for i in range(CASES):
        case = random_case(rng, bed, i)
        print(case.describe())
        for on, fillers in sorted(case.fillers.items()):
            take(client, namespace, bed, f"taken{i}-{on}", node=on, fillers=fillers)
        model, classes = snapshot(client)
        claim = parse_claim(
            {**claim_obj(f"case{i}", case.requests), "metadata": {"name": f"case{i}",
                                                                  "namespace": namespace}},
            classes,
        )  # fmt: skip
        theirs, ours = place_both(client, namespace, case.requests, tag=str(i), node=case.node)
        remove(client, namespace, [f"taken{i}-{on}" for on in case.fillers])
        print(
            f"  -> kube-scheduler {chosen(theirs)} on {node_of(theirs)}, "
            f"controller {chosen(ours)} on {node_of(ours)}"
        )
        assert chosen(ours) == chosen(theirs), (
            f"{case.describe()}\nkube-scheduler chose {chosen(theirs)}, "
            f"the controller {chosen(ours)}"
        )
        for path, allocation in (("kube-scheduler", theirs), ("controller", ours)):
            if allocation is not None:
                problems = check_allocation(model, claim, allocation)
                assert problems == [], f"{case.describe()}\n{path}: {allocation}: {problems}"
        picked = chosen(ours)
        if picked is None:
            seen["refused"] += 1
        elif all(n == r or n.endswith("/s0") for r, n in picked):
            seen["first"] += 1
        else:
            seen["later"] += 1
    print(f"outcomes: {seen}")
    # The random sequence must exercise every outcome, or it proves little.
    if CASES >= 25:
        assert min(seen.values()) >= 3, seen


def test_a_later_requests_choice_follows_the_earlier_requests_devices(
    client: KubeClient, bed: Bed, namespace: str
) -> None:
    """docs/scheduling.md, "firstAvailable: the two paths": on node-2 (4 A10 of 24Gi), gpu-0 has
    10Gi free, gpu-1 all 24Gi. Request `a` takes 10Gi of gpu-0 or gpu-1; request `b` prefers
    10Gi of gpu-0 (`b/s0`), else 1Gi anywhere (`b/s1`). kube-scheduler gives `a` the first
    fitting device, gpu-0, so `b` gets `b/s1`; the controller's spread policy gives `a` the
    unused gpu-1, so `b` gets `b/s0`; its binpack policy, like first fit, gpu-0 and `b/s1`."""
    attr = f'device.attributes["{bed.driver}"]'
    requests: list[JSON] = [
        {"name": "a", "exactly": {"deviceClassName": bed.driver, "count": 1,
                                  "capacity": {"requests": {"memory": "10Gi"}},
                                  "selectors": [{"cel": {"expression": f"{attr}.index <= 1"}}]}},
        {"name": "b", "firstAvailable": [
            {"name": "s0", "deviceClassName": bed.driver, "count": 1,
             "capacity": {"requests": {"memory": "10Gi"}},
             "selectors": [{"cel": {"expression": f"{attr}.index == 0"}}]},
            {"name": "s1", "deviceClassName": bed.driver, "count": 1,
             "capacity": {"requests": {"memory": "1Gi"}}},
        ]},
    ]  # fmt: skip
    take(client, namespace, bed, "taken", node="node-2", fillers=((0, "14Gi", None),))
    model, classes = snapshot(client)
    claim = parse_claim(
        {**claim_obj("x", requests), "metadata": {"name": "x", "namespace": namespace}}, classes
    )
    theirs, spread = place_both(client, namespace, requests, tag="-spread", node="node-2",
                                annotations={"device-scheduler-policy": "spread"})  # fmt: skip
    _, binpack = place_both(client, namespace, requests, tag="-binpack", node="node-2",
                            annotations={"device-scheduler-policy": "binpack"})  # fmt: skip
    assert theirs is not None and spread is not None and binpack is not None
    for allocation in (theirs, spread, binpack):
        assert check_allocation(model, claim, allocation) == [], allocation

    def devices(allocation: JSON) -> dict[str, str]:
        return {str(r["request"]): str(r["device"]) for r in allocation["devices"]["results"]}

    assert devices(theirs) == {"a": "gpu-0", "b/s1": devices(theirs)["b/s1"]}, theirs
    assert devices(spread) == {"a": "gpu-1", "b/s0": "gpu-0"}, spread
    assert devices(binpack) == {"a": "gpu-0", "b/s1": devices(binpack)["b/s1"]}, binpack
