"""Rescheduling of pods whose claims failed to prepare, on the real control plane with a real
prepare failure.

node-1 runs the kubelet plugin on a simulated dgx-h100 and the kubelet stand-in (real gRPC). A
"hog" pod takes GPU gpu-0 whole through kube-scheduler and is prepared. A second claim is then
allocated on gpu-0 by hand, as a racing second allocator would, so its prepare is refused by the
node's overbooking guard (the plugin posts `PrepareOverbooked` on the pod). The controller
(chart RBAC, leader election, grace 2 s) then:

- deletes a Deployment's pod and deallocates its claim: the ReplicaSet's new pod is allocated
  afresh, on another GPU, prepared and Running;
- leaves a bare pod alone and tells what to do in a `PrepareFailedNotRescheduled` Event.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.fixtures.controller import (
    DRIVER,
    Account,
    Controller,
    drop_holds,
    node_with_plugin,
    started,
)
from vgpu_testbed.polling import wait_for
from vgpu_testbed.standin.node_agents import NodeAgents

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

JSON = dict[str, Any]
NODE = "node-1"
HOLD = "example.com/hold"


@pytest.fixture(scope="module")
def agents(cluster: Any, client: KubeClient) -> Iterator[NodeAgents]:
    with node_with_plugin(cluster, client, NODE) as node_agents:
        yield node_agents


@pytest.fixture
def controller(client: KubeClient, account: Account, namespace: str) -> Iterator[Controller]:
    c = Controller(account, "rescheduler", "--reschedule-grace", "2",
                   "--reschedule-per-minute", "60")  # fmt: skip
    try:
        started(client, account, c)
        yield c
    finally:
        c.kill()
        drop_holds(client, namespace)


def claim_spec(selector: str | None = None, memory: str | None = None) -> JSON:
    exactly: JSON = {"deviceClassName": DRIVER}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def pod_spec(claim: JSON) -> JSON:
    return {
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "containers": [
            {
                "name": "c",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", **claim}],
    }


def get(client: KubeClient, api: str, plural: str, ns: str, name: str) -> JSON | None:
    try:
        return client.get(kube.path(api, plural, name, namespace=ns))
    except kube.NotFound:
        return None


def running(client: KubeClient, ns: str, name: str) -> JSON | None:
    pod = get(client, "v1", "pods", ns, name)
    return pod if pod and pod.get("status", {}).get("phase") == "Running" else None


def claim_of(client: KubeClient, pod: JSON) -> JSON | None:
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    ns = pod["metadata"]["namespace"]
    return get(client, RESOURCE_API, "resourceclaims", ns, statuses[0]["resourceClaimName"])


def hog_gpu0(client: KubeClient, ns: str) -> JSON:
    """A running pod holding node-1's gpu-0 whole (allocated by kube-scheduler, prepared)."""
    index0 = f'device.attributes["{DRIVER}"].index == 0'
    client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=ns),
                  {"metadata": {"name": "hog"}, "spec": claim_spec(index0)})  # fmt: skip
    client.create(kube.path("v1", "pods", namespace=ns), {"metadata": {"name": "hog"},
                  "spec": pod_spec({"resourceClaimName": "hog"})})  # fmt: skip
    wait_for("the hog running", lambda: running(client, ns, "hog"), 90)
    claim = get(client, RESOURCE_API, "resourceclaims", ns, "hog")
    assert claim is not None
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (NODE, "gpu-0")
    return claim


def overbook(client: KubeClient, claim: JSON, pod: JSON, hog: JSON) -> None:
    """Allocate `claim` (1Gi) on the hog's GPU and reserve it for `pod`, as a second allocator
    that did not see the hog would."""
    allocation = copy.deepcopy(hog["status"]["allocation"])
    result = allocation["devices"]["results"][0]
    result["consumedCapacity"] = {"memory": "1Gi", "cores": "0"}
    result["shareID"] = str(uuid.uuid4())
    claim["status"] = {
        "allocation": allocation,
        "reservedFor": [
            {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        ],
    }
    meta = claim["metadata"]
    client.replace(
        kube.path(RESOURCE_API, "resourceclaims", meta["name"], namespace=meta["namespace"],
                  subresource="status"),
        claim,
    )  # fmt: skip


def lift_hold(client: KubeClient, ns: str, name: str) -> None:
    client.merge_patch(kube.path("v1", "pods", name, namespace=ns),
                       {"spec": {"schedulingGates": None}})  # fmt: skip


def events_of(client: KubeClient, ns: str, uid: str) -> list[JSON]:
    return client.list(kube.path("v1", "events", namespace=ns),
                       field_selector=f"involvedObject.uid={uid}")  # fmt: skip


def test_a_deployment_pod_that_cannot_prepare_is_recreated_and_runs_elsewhere(
    client: KubeClient, agents: NodeAgents, controller: Controller, namespace: str
) -> None:
    hog = hog_gpu0(client, namespace)
    client.create(
        kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace),
        {"metadata": {"name": "share"}, "spec": {"spec": claim_spec(memory="1Gi")}},
    )
    template = pod_spec({"resourceClaimTemplateName": "share"})
    template["schedulingGates"] = [{"name": HOLD}]  # so the test can allocate the first by hand
    client.create(
        kube.path("apps/v1", "deployments", namespace=namespace),
        {
            "metadata": {"name": "victim"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "victim"}},
                "template": {"metadata": {"labels": {"app": "victim"}}, "spec": template},
            },
        },
    )

    def victim_pod() -> JSON | None:
        pods = client.list(kube.path("v1", "pods", namespace=namespace),
                           label_selector="app=victim")  # fmt: skip
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return live[0] if len(live) == 1 and claim_of(client, live[0]) else None

    first = wait_for("the Deployment's pod and its claim", victim_pod)
    first_claim = claim_of(client, first)
    assert first_claim is not None
    overbook(client, first_claim, first, hog)
    lift_hold(client, namespace, first["metadata"]["name"])
    # The node refuses the claim (PrepareOverbooked); after the grace time the controller
    # deletes the pod and deallocates the claim; the ReplicaSet creates a new pod.
    second = wait_for(
        "a new pod of the Deployment",
        lambda: (p := victim_pod()) and p["metadata"]["uid"] != first["metadata"]["uid"] and p,
        90,
    )
    # The controller records its Event right after the deletion (the new pod may come first).
    wait_for(
        "the PrepareOverbooked and PrepareFailedRescheduled Events",
        lambda: (
            {"PrepareOverbooked", "PrepareFailedRescheduled"}
            <= {e["reason"] for e in events_of(client, namespace, first["metadata"]["uid"])}
        ),
    )
    lift_hold(client, namespace, second["metadata"]["name"])
    name = second["metadata"]["name"]
    runs = wait_for("the new pod running", lambda: running(client, namespace, name), 90)
    claim = claim_of(client, runs)
    assert claim is not None
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) != (NODE, "gpu-0")  # elsewhere: gpu-0 is full
    # Evicted: gone once its node confirmed the graceful delete (at once on the stand-in).
    wait_for(
        "the evicted pod gone",
        lambda: get(client, "v1", "pods", namespace, first["metadata"]["name"]) is None,
        60,
    )


def test_a_bare_pod_that_cannot_prepare_gets_an_event(
    client: KubeClient, agents: NodeAgents, controller: Controller, namespace: str
) -> None:
    hog = hog_gpu0(client, namespace)
    client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace),
                  {"metadata": {"name": "bare"}, "spec": claim_spec(memory="1Gi")})  # fmt: skip
    spec = pod_spec({"resourceClaimName": "bare"})
    spec["schedulingGates"] = [{"name": HOLD}]
    pod = client.create(kube.path("v1", "pods", namespace=namespace),
                        {"metadata": {"name": "bare"}, "spec": spec})  # fmt: skip
    claim = get(client, RESOURCE_API, "resourceclaims", namespace, "bare")
    assert claim is not None
    overbook(client, claim, pod, hog)
    lift_hold(client, namespace, "bare")

    def told() -> JSON | None:
        for event in events_of(client, namespace, pod["metadata"]["uid"]):
            if event["reason"] == "PrepareFailedNotRescheduled":
                return event
        return None

    event = wait_for("the PrepareFailedNotRescheduled Event", told, 60)
    assert "delete it and create it again" in event["message"] and NODE in event["message"]
    still = get(client, "v1", "pods", namespace, "bare")
    assert still is not None and still["metadata"]["uid"] == pod["metadata"]["uid"]
    assert not still["metadata"].get("deletionTimestamp")
    assert (get(client, RESOURCE_API, "resourceclaims", namespace, "bare") or {})["status"][
        "allocation"
    ]
