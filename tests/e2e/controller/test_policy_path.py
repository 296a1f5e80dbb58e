"""The allocation controller (policy path) on the real control plane.

The controller runs as a subprocess with the chart's ServiceAccount and RBAC (rendered with
helm, applied into a namespace of this module, token from a TokenRequest), with leader election
on a Lease there. Stand-in nodes of three profiles publish slices of a throwaway driver:
`<p>-a10` (4 x A10, no NVLink), `<p>-a100` (a100-2x4: 8 x A100 in two NVLink islands of 4),
`<p>-h100` (8 x H100, NVLink pairs). Pods opt in with the scheduling gate; the real
kube-scheduler binds them once the controller lifted the gate.

Proves: exact placements of a scripted binpack and spread sequence; `link` keeps a 4-GPU claim in
one island; `link-strict` refuses a 5-GPU claim with an Event and the Placement condition;
include/exclude of GPU types and UUIDs (canonical names and aliases); a node kube-scheduler
refuses after the decision is replaced by the next best, and a claim the controller allocated is
deallocated once its pod is gone; two replicas are both ready (leader and standby) and, the leader
killed mid-stream, never overbook a device; a controller killed mid-allocation converges after a
restart, including a pod left with one of its two claims written (released and placed again).
"""

from __future__ import annotations

import copy
import functools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.allocator.model import parse_quantity
from dra_driver.kube import RESOURCE_API, KubeClient
from dra_driver.slices import build_slices
from tests.fixtures.allocator_cluster import SHAPES, device_class, inventory
from tests.fixtures.controller import (
    Controller,
    controller_account,
    drop_holds,
    leader,
    ready,
    remove_driver,
    started,
)
from tests.fixtures.workloads import pause_pod, resource_claim
from vgpu_testbed.cluster import boot as cluster_boot
from vgpu_testbed.cluster import nodes as cluster_nodes
from vgpu_testbed.polling import wait_for

# Longer than the 60 s default: module fixtures install the chart's RBAC and start stand-in nodes;
# tests run controller processes, kill leaders and wait for convergence.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JSON = dict[str, Any]
GATE = "vgpu.dra.dev/policy"
CLAIMS = kube.path(RESOURCE_API, "resourceclaims")
SLICES = kube.path(RESOURCE_API, "resourceslices")
# profile suffix -> (product, NVLink shape, GPUs)
PROFILES = {
    "a10": ("NVIDIA A10", "none", 4),
    "a100": ("NVIDIA A100-SXM4-40GB", "two-islands", 8),
    "h100": ("NVIDIA H100 80GB HBM3", "pairs", 8),
}


@dataclass
class Bed:
    prefix: str
    driver: str
    system_ns: str
    kubeconfig: Path  # the controller ServiceAccount's
    logs: Path

    def node(self, profile: str) -> str:
        return f"{self.prefix}-{profile}"


def _create_nodes_and_slices(client: KubeClient, cluster: Any, prefix: str, driver: str) -> None:
    api_client = cluster.api_client()
    try:
        cluster_boot.create_nodes(
            api_client,
            [cluster_nodes.NodeSpec(f"{prefix}-{p}", f"t-{p}") for p in sorted(PROFILES)],
        )
    finally:
        api_client.close()
    for n, (profile, (product, shape, gpus)) in enumerate(sorted(PROFILES.items())):
        node = f"{prefix}-{profile}"
        uid = client.get(kube.path("v1", "nodes", node))["metadata"]["uid"]
        inv = inventory(100 + n, gpus, product, SHAPES[shape])
        for obj in build_slices(inv, driver=driver, node_name=node, node_uid=uid):
            obj["spec"]["pool"]["generation"] = 1
            client.create(SLICES, obj)


@pytest.fixture(scope="module")
def bed(
    cluster: Any, client: KubeClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bed]:
    """Nodes, slices and a DeviceClass of a throwaway driver, and the controller's ServiceAccount
    with the chart's RBAC; all removed afterwards."""
    prefix = f"c{uuid.uuid4().hex[:5]}"
    driver = f"{prefix}.ctl.vgpu.dra.dev"
    home = tmp_path_factory.mktemp("controller-helm")
    with controller_account(client, cluster, home, prefix) as account:
        try:
            client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class(driver))
            _create_nodes_and_slices(client, cluster, prefix, driver)
            yield Bed(prefix, driver, account.system_ns, account.kubeconfig, account.logs)
        finally:
            remove_driver(client, driver)
            for profile in PROFILES:
                client.delete(kube.path("v1", "nodes", f"{prefix}-{profile}"))


@pytest.fixture
def controllers(bed: Bed, client: KubeClient, namespace: str) -> Iterator[list[Controller]]:
    """Start controllers with `controllers.append(Controller(bed, name))`; all stopped after,
    and the holds they leave on the namespace's claims dropped (so the namespace can go)."""
    started: list[Controller] = []
    yield started
    for c in started:
        c.kill()
    drop_holds(client, namespace)


def gpu_claim(
    name: str,
    driver: str,
    *,
    count: int = 1,
    memory: str | None = None,
    cores: str | None = None,
    selector: str | None = None,
) -> JSON:
    exactly: JSON = {"deviceClassName": driver, "count": count}
    requests = {k: v for k, v in (("memory", memory), ("cores", cores)) if v}
    if requests:
        exactly["capacity"] = {"requests": requests}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return resource_claim(name, exactly)


def gated_pod(name: str, claims: list[str], annotations: dict[str, str]) -> JSON:
    pod = pause_pod(name, {c: {"resourceClaimName": c} for c in claims})
    pod["metadata"]["annotations"] = {f"vgpu.dra.dev/{k}": v for k, v in annotations.items()}
    pod["spec"]["schedulingGates"] = [{"name": GATE}, {"name": "example.com/keep"}]
    return pod


def submit(
    client: KubeClient,
    ns: str,
    name: str,
    claims: list[JSON],
    annotations: dict[str, str],
) -> None:
    for claim in claims:
        client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=ns), claim)
    pod = gated_pod(name, [c["metadata"]["name"] for c in claims], annotations)
    client.create(kube.path("v1", "pods", namespace=ns), pod)


def get_pod(client: KubeClient, ns: str, name: str) -> JSON:
    return client.get(kube.path("v1", "pods", name, namespace=ns))


def get_claim(client: KubeClient, ns: str, name: str) -> JSON:
    return client.get(kube.path(RESOURCE_API, "resourceclaims", name, namespace=ns))


def ungated(client: KubeClient, ns: str, name: str) -> JSON | None:
    pod = get_pod(client, ns, name)
    gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
    return None if GATE in gates else pod


def placed(client: KubeClient, ns: str, name: str) -> tuple[str, list[str]]:
    """(node, devices) of pod `name` with its one claim `name`, once the controller lifted the
    gate; the other gate stays (so kube-scheduler does not bind yet)."""
    pod = wait_for(f"pod {name} ungated", lambda: ungated(client, ns, name))
    assert [g["name"] for g in pod["spec"]["schedulingGates"]] == ["example.com/keep"]
    status = get_claim(client, ns, name)["status"]
    uid = pod["metadata"]["uid"]
    # The pod, and the controller's hold until kube-scheduler binds the pod.
    assert status["reservedFor"] == [
        {"resource": "pods", "name": name, "uid": uid},
        {"apiGroup": "vgpu.dra.dev", "resource": "placements", "name": name,
         "uid": f"{uid}-placement"},
    ]  # fmt: skip
    terms = status["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    node = terms[0]["matchFields"][0]["values"][0]
    return node, [r["device"] for r in status["allocation"]["devices"]["results"]]


def condition(pod: JSON) -> JSON | None:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond["type"] == "vgpu.dra.dev/Placement":
            return dict(cond)
    return None


def test_binpack_then_spread_place_exactly(
    client: KubeClient, bed: Bed, namespace: str, controllers: list[Controller]
) -> None:
    controllers.append(Controller(bed, "exact"))
    started(client, bed, *controllers)
    binpack = {"node-policy": "binpack", "device-policy": "binpack"}
    spread = {"node-policy": "spread", "device-policy": "spread"}
    a10, a100, h100 = bed.node("a10"), bed.node("a100"), bed.node("h100")
    # Binpack: the first node by name (all equally empty), then always the most used node and
    # GPU: three 4Gi/10-core shares stack on one A10.
    for i in range(3):
        submit(client, namespace, f"b{i}", [gpu_claim(f"b{i}", bed.driver, memory="4Gi",
               cores="10")], binpack)  # fmt: skip
        assert placed(client, namespace, f"b{i}") == (a10, ["gpu-0"])
    # Spread: the least used node first (a100 and h100 are empty, a100 sorts first), then h100,
    # then the least used fraction: a10 has 12Gi of 96Gi, a100 4Gi of 320Gi, h100 4Gi of 640Gi
    # (same cores each) -> h100 again, on its least used GPU.
    expected = [(a100, ["gpu-0"]), (h100, ["gpu-0"]), (h100, ["gpu-1"]), (a100, ["gpu-1"])]
    for i, want in enumerate(expected):
        submit(client, namespace, f"s{i}", [gpu_claim(f"s{i}", bed.driver, memory="4Gi",
               cores="10")], spread)  # fmt: skip
        assert placed(client, namespace, f"s{i}") == want, i
    # Lifting the last gate hands the pod to kube-scheduler, which binds it to the chosen node.
    client.merge_patch(kube.path("v1", "pods", "s0", namespace=namespace),
                       {"spec": {"schedulingGates": None}})  # fmt: skip
    bound = wait_for("s0 bound", lambda: get_pod(client, namespace, "s0")["spec"].get("nodeName"))
    assert bound == a100


def island(device: str) -> int:
    return SHAPES["two-islands"][int(device.split("-")[1])] or 0


def test_topology_and_type_filters(
    client: KubeClient, bed: Bed, namespace: str, controllers: list[Controller]
) -> None:
    controllers.append(Controller(bed, "topology"))
    started(client, bed, *controllers)
    # One whole A100 taken first, so a topology-blind pick of the 4 least used GPUs would span
    # both islands.
    submit(client, namespace, "first", [gpu_claim("first", bed.driver)],
           {"gpu-type": "A100", "device-policy": "binpack"})  # fmt: skip
    node, devices = placed(client, namespace, "first")
    assert node == bed.node("a100")
    submit(client, namespace, "linked", [gpu_claim("linked", bed.driver, count=4)],
           {"gpu-type": "A100", "topology": "link"})  # fmt: skip
    node, devices = placed(client, namespace, "linked")
    assert node == bed.node("a100") and len(devices) == 4
    assert len({island(d) for d in devices}) == 1, devices

    submit(client, namespace, "five", [gpu_claim("five", bed.driver, count=5)],
           {"gpu-type": "A100", "topology": "link-strict"})  # fmt: skip
    pod = wait_for("five refused", lambda: condition(get_pod(client, namespace, "five")) and
                 get_pod(client, namespace, "five"))  # fmt: skip
    cond = condition(pod)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "Unschedulable"
    assert "NVLink" in cond["message"], cond
    # The condition is written before the Event: await the Event.
    events = wait_for(
        "the refusal Event of pod five",
        lambda: client.list(kube.path("v1", "events", namespace=namespace),
                            field_selector="involvedObject.name=five"),
    )  # fmt: skip
    assert [e["reason"] for e in events] == ["Unschedulable"]
    assert events[0]["message"] == cond["message"] and events[0]["type"] == "Warning"
    assert GATE in [g["name"] for g in pod["spec"]["schedulingGates"]]
    assert "allocation" not in (get_claim(client, namespace, "five").get("status") or {})

    submit(client, namespace, "incl", [gpu_claim("incl", bed.driver, memory="1Gi")],
           {"gpu-type": "H100"})  # fmt: skip
    assert placed(client, namespace, "incl")[0] == bed.node("h100")
    submit(client, namespace, "excl", [gpu_claim("excl", bed.driver, memory="1Gi")],
           {"exclude-gpu-type": "H100,A100"})  # fmt: skip
    assert placed(client, namespace, "excl")[0] == bed.node("a10")


def gpu_uuids(client: KubeClient, bed: Bed, node: str) -> dict[str, str]:
    """Device name -> GPU UUID as the node's slices publish them."""
    found = {}
    for obj in client.list(SLICES, field_selector=f"spec.nodeName={node}"):
        if obj["spec"]["driver"] == bed.driver:
            for device in obj["spec"]["devices"]:
                found[device["name"]] = device["attributes"]["uuid"]["string"]
    return found


def test_uuid_include_and_exclude(
    client: KubeClient, bed: Bed, namespace: str, controllers: list[Controller]
) -> None:
    """The canonical names (`include-gpu-uuid`, `exclude-gpu-uuid`) and the short alias
    (`gpu-uuid`), against binpack's own choice (the first GPU of the first node by name, then
    the most used node)."""
    controllers.append(Controller(bed, "uuid"))
    started(client, bed, *controllers)
    a10, h100 = gpu_uuids(client, bed, bed.node("a10")), gpu_uuids(client, bed, bed.node("h100"))
    binpack = {"node-scheduler-policy": "binpack", "device-scheduler-policy": "binpack"}
    submit(client, namespace, "never", [gpu_claim("never", bed.driver, memory="1Gi")],
           {**binpack, "exclude-gpu-uuid": f"{a10['gpu-0']},{a10['gpu-1']}"})  # fmt: skip
    assert placed(client, namespace, "never") == (bed.node("a10"), ["gpu-2"])
    submit(client, namespace, "only", [gpu_claim("only", bed.driver, memory="1Gi")],
           {**binpack, "include-gpu-uuid": h100["gpu-3"].lower()})  # fmt: skip
    assert placed(client, namespace, "only") == (bed.node("h100"), ["gpu-3"])
    submit(client, namespace, "alias", [gpu_claim("alias", bed.driver, memory="1Gi")],
           {**binpack, "gpu-uuid": f"{h100['gpu-5']},{h100['gpu-6']}"})  # fmt: skip
    assert placed(client, namespace, "alias") == (bed.node("h100"), ["gpu-5"])
    submit(client, namespace, "nowhere", [gpu_claim("nowhere", bed.driver, memory="1Gi")],
           {"include-gpu-uuid": "GPU-does-not-exist"})  # fmt: skip
    refused = wait_for("nowhere refused", lambda: condition(get_pod(client, namespace, "nowhere")))
    assert (refused["status"], refused["reason"]) == ("False", "Unschedulable")


def test_a_node_kube_scheduler_refuses_is_replaced(
    client: KubeClient, bed: Bed, namespace: str, controllers: list[Controller]
) -> None:
    """kube-scheduler refuses the node the controller chose for a reason the allocator does not
    model (pod anti-affinity to a pod already on it): the controller places the claim again
    without that node, with its own policy, and kube-scheduler binds the pod there."""
    controllers.append(Controller(bed, "replace"))
    started(client, bed, *controllers)
    a10, a100 = bed.node("a10"), bed.node("a100")
    blocker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "blocker", "labels": {"app": "blocker"}},
        "spec": {"nodeName": a10, "containers": [{"name": "c", "image": "pause"}]},
    }
    client.create(kube.path("v1", "pods", namespace=namespace), blocker)
    client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace),
                  gpu_claim("moved", bed.driver, memory="4Gi"))  # fmt: skip
    pod = gated_pod("moved", ["moved"], {"node-scheduler-policy": "binpack"})
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    pod["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "blocker"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    client.create(kube.path("v1", "pods", namespace=namespace), pod)
    # Binpack's first choice is a10 (all nodes empty, first by name); kube-scheduler refuses it.
    # The controller's hold keeps kube-scheduler from deallocating the claim; the controller
    # releases it and writes its new allocation at once.
    bound = wait_for(
        "moved bound", lambda: get_pod(client, namespace, "moved")["spec"].get("nodeName"), 90
    )
    assert bound != a10
    log = controllers[0].text()
    assert "claim " + namespace + "/moved released" in log  # the controller reacted
    claim = get_claim(client, namespace, "moved")
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert terms[0]["matchFields"][0]["values"] == [bound]
    if f"kube-scheduler refused node {a10}; placed again on {a100}" in log:
        assert bound == a100  # binpack's next node
        cond = condition(get_pod(client, namespace, "moved"))
        assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Replaced")
        assert f"refused {a10}" in cond["message"]
    else:
        # The documented race: kube-scheduler allocated the released claim itself between the
        # controller's two writes; the pod is on the default path from there.
        assert "was allocated by someone else; left to kube-scheduler" in log, log[-3000:]
    # Bound: the hold is gone, the pod is the claim's only consumer.
    uid = get_pod(client, namespace, "moved")["metadata"]["uid"]
    wait_for(
        "the placement hold dropped",
        lambda: (
            get_claim(client, namespace, "moved")["status"].get("reservedFor")
            == [{"resource": "pods", "name": "moved", "uid": uid}]
        ),
    )
    claim = get_claim(client, namespace, "moved")
    assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]
    # The claim outlives its pod, and is deallocated once the pod is gone (the finalizer).
    client.request("DELETE", kube.path("v1", "pods", "moved", namespace=namespace),
                   query={"gracePeriodSeconds": 0})  # fmt: skip
    wait_for(
        "moved's claim deallocated",
        lambda: "allocation" not in (get_claim(client, namespace, "moved").get("status") or {}),
    )


def device_use(client: KubeClient, ns: str) -> dict[str, int]:
    """Memory allocated per device (bytes) over every claim in the namespace."""
    use: dict[str, int] = {}
    for claim in client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=ns)):
        allocation = (claim.get("status") or {}).get("allocation")
        for r in (allocation or {}).get("devices", {}).get("results", []):
            key = f"{r['pool']}/{r['device']}"
            use[key] = use.get(key, 0) + parse_quantity(r["consumedCapacity"]["memory"])
    return use


A10_SELECTOR = 'device.attributes["{d}"].productName == "NVIDIA A10"'
A10_MEMORY = 24 * 1024**3


def test_two_replicas_never_overbook_when_the_leader_dies(
    client: KubeClient, bed: Bed, namespace: str, controllers: list[Controller]
) -> None:
    controllers += [Controller(bed, "replica-a"), Controller(bed, "replica-b")]
    first = started(client, bed, *controllers)
    # Leader and standby are both ready (the standby reaches the Lease and keeps its model).
    for c in controllers:
        wait_for(f"{c.log.stem} ready", functools.partial(ready, c))
    # Eight pods for four A10s at 20Gi each: exactly four fit, one per GPU.
    for i in range(8):
        claim = gpu_claim(f"p{i}", bed.driver, memory="20Gi",
                          selector=A10_SELECTOR.format(d=bed.driver))  # fmt: skip
        submit(client, namespace, f"p{i}", [claim], {})
        if i == 2:  # kill the leader mid-stream (after its first placement), lease held
            wait_for("p0 placed", functools.partial(ungated, client, namespace, "p0"))
            victims = [c for c in controllers if f" as {first}" in c.text()]
            assert len(victims) == 1, first
            victims[0].kill()
    wait_for("a new leader", lambda: (leader(client, bed) or first) != first, timeout=30)

    def settled() -> list[str] | None:
        done = []
        for i in range(8):
            pod = get_pod(client, namespace, f"p{i}")
            gated = GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]
            if not gated:
                done.append(f"p{i}")
            elif (condition(pod) or {}).get("status") != "False":
                return None
        return done

    done = wait_for("all eight decided", settled, timeout=60)
    assert len(done) == 4, done
    use = device_use(client, namespace)
    assert len(use) == 4 and all(v <= A10_MEMORY for v in use.values()), use


def test_a_controller_killed_mid_allocation_converges(
    client: KubeClient, bed: Bed, namespace: str, controllers: list[Controller]
) -> None:
    controllers.append(Controller(bed, "victim"))
    started(client, bed, *controllers)
    names = [f"k{i}" for i in range(6)]
    for name in names:  # two claims per pod: a crash can fall between their writes
        claims = [gpu_claim(f"{name}-{j}", bed.driver, memory="2Gi") for j in range(2)]
        submit(client, namespace, name, claims, {"node-policy": "spread"})

    def any_allocated() -> bool:
        return any(
            (c.get("status") or {}).get("allocation")
            for c in client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace))
        )

    wait_for("a first allocation", any_allocated)
    controllers[0].kill()
    # Make the crash between two claim writes certain for one more pod: its first claim is
    # allocated for it (on a GPU next to k0's, as a dead controller would have written it), its
    # second is not, and its gate is still on.
    template = get_claim(client, namespace, "k0-0")["status"]["allocation"]
    half = [gpu_claim(f"h-{j}", bed.driver, memory="2Gi") for j in range(2)]
    submit(client, namespace, "h", half, {"node-policy": "spread"})
    h_uid = get_pod(client, namespace, "h")["metadata"]["uid"]
    first = get_claim(client, namespace, "h-0")
    allocation = copy.deepcopy(template)
    allocation["devices"]["results"][0]["shareID"] = str(uuid.uuid4())
    first["status"] = {
        "allocation": allocation,
        "reservedFor": [{"resource": "pods", "name": "h", "uid": h_uid}],
    }
    client.replace(
        kube.path(RESOURCE_API, "resourceclaims", "h-0", namespace=namespace, subresource="status"),
        first,
    )
    names.append("h")
    controllers.append(Controller(bed, "successor"))
    for name in names:
        pod = wait_for(f"{name} ungated", functools.partial(ungated, client, namespace, name), 60)
        nodes = set()
        for j in range(2):
            status = get_claim(client, namespace, f"{name}-{j}")["status"]
            # (plus the controller's hold while the pod is unbound: the successor follows the
            # pod from it)
            pods = [r for r in status["reservedFor"] if r["resource"] == "pods"]
            assert pods == [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}]
            term = status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
            nodes.add(term["matchFields"][0]["values"][0])
        assert len(nodes) == 1, (name, nodes)  # both claims of a pod on one node


def test_template_claims_are_placed_and_a_refused_pod_is_retried_on_change(
    client: KubeClient, bed: Bed, namespace: str, controllers: list[Controller]
) -> None:
    """A claim generated from a ResourceClaimTemplate (found through the pod's
    resourceClaimStatuses) is placed; a pod refused for lack of capacity is placed once a claim
    is deleted and frees it."""
    controllers.append(Controller(bed, "template"))
    started(client, bed, *controllers)
    only_a10 = A10_SELECTOR.format(d=bed.driver)
    client.create(
        kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace),
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "whole-a10"},
            "spec": {"spec": gpu_claim("x", bed.driver, count=4, selector=only_a10)["spec"]},
        },
    )
    pod = gated_pod("tpl", [], {})
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "whole-a10"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    client.create(kube.path("v1", "pods", namespace=namespace), pod)
    placed_pod = wait_for("tpl ungated", functools.partial(ungated, client, namespace, "tpl"))
    (status,) = placed_pod["status"]["resourceClaimStatuses"]
    claim = get_claim(client, namespace, status["resourceClaimName"])
    assert len(claim["status"]["allocation"]["devices"]["results"]) == 4
    # All four A10s are taken whole: the next A10 pod is refused ...
    submit(client, namespace, "late", [gpu_claim("late", bed.driver, selector=only_a10)], {})
    wait_for("late refused", lambda: condition(get_pod(client, namespace, "late")))
    assert GATE in [
        g["name"] for g in get_pod(client, namespace, "late")["spec"]["schedulingGates"]
    ]
    # ... and placed as soon as the template pod and its claim are gone.
    client.request("DELETE", kube.path("v1", "pods", "tpl", namespace=namespace),
                   query={"gracePeriodSeconds": 0})  # fmt: skip
    client.delete(
        kube.path(RESOURCE_API, "resourceclaims", status["resourceClaimName"], namespace=namespace)
    )
    assert placed(client, namespace, "late")[0] == bed.node("a10")


def test_watch_streams_events_from_a_listed_version(client: KubeClient, namespace: str) -> None:
    """`KubeClient.watch` on the real API server: a change after the listed version arrives as
    a dict event. (The server replays old versions from etcd until it compacts, so 410 Gone
    cannot be provoked here; tests/unit/controller/test_informers.py covers it.)"""
    path = kube.path("v1", "configmaps", namespace=namespace)
    _, version = client.list_versioned(path)
    client.create(path, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}})
    events = client.watch(path, version, timeout_s=5)
    event = next(e for e in events if e["type"] != "BOOKMARK")
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "w")
    events.close()
