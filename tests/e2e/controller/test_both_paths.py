"""Both allocation paths on one GPU at once: no double-booking reaches a container.

node-1 runs the kubelet plugin (simulated dgx-h100) and the kubelet stand-in; the controller runs
with the chart's RBAC. A storm of pods is created at once for each of three GPUs, half on the
default path (kube-scheduler allocates; a CEL selector pins them to the GPU) and half on the
policy path (gated; `include-gpu-uuid` pins them to the GPU), every claim 10Gi: 20 claims for
the 7 that fit in a GPU's 79.6 GiB.

Counted when everything has settled (every pod Running, refused, or stuck at prepare):
- double-bookings that reached a container: Running pods' claims beyond their GPU's capacity
  (must be 0; Running means the node prepared the claim);
- caught before binding: allocations the controller failed as `Overbooked` (binding conditions;
  counted in its log, as kube-scheduler clears a failed allocation at once);
- caught at prepare: claims the node's guard refused (`PrepareOverbooked` Events).

Run twice: with binding conditions published (the controller confirms every allocation before
kube-scheduler binds), and without (only the prepare-time guard protects the GPU).
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.allocator.model import parse_quantity
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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JSON = dict[str, Any]
NODE = "node-1"
GATE = "vgpu.dra.dev/policy"
PER_PATH = 10
ROUNDS = 3
SHARE = 10 * (1 << 30)


def gpus(client: KubeClient) -> dict[str, tuple[str, int]] | None:
    """Device name -> (UUID, memory capacity in bytes) on node-1 as published (None: not yet)."""
    selector = f"spec.driver={DRIVER},spec.nodeName={NODE}"
    found = {}
    for obj in client.list(kube.path(RESOURCE_API, "resourceslices"), field_selector=selector):
        for device in obj["spec"]["devices"]:
            memory = parse_quantity(device["capacity"]["memory"]["value"])
            found[device["name"]] = (device["attributes"]["uuid"]["string"], memory)
    return found or None


def storm(client: KubeClient, ns: str, gpu: int, gpu_uuid: str) -> None:
    """PER_PATH pods on each path for GPU `gpu`, created interleaved."""
    index = f'device.attributes["{DRIVER}"].index == {gpu}'
    for i in range(PER_PATH):
        for path in ("default", "policy"):
            name = f"g{gpu}-{path}-{i}"
            exactly: JSON = {
                "deviceClassName": DRIVER,
                "capacity": {"requests": {"memory": "10Gi"}},
            }
            if path == "default":
                exactly["selectors"] = [{"cel": {"expression": index}}]
            client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=ns), {
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
            })  # fmt: skip
            pod: JSON = {
                "metadata": {"name": name, "labels": {"storm": "yes"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                },
            }  # fmt: skip
            if path == "policy":
                pod["spec"]["schedulingGates"] = [{"name": GATE}]
                pod["metadata"]["annotations"] = {"vgpu.dra.dev/include-gpu-uuid": gpu_uuid}
            client.create(kube.path("v1", "pods", namespace=ns), pod)


def _condition(pod: JSON, kind: str) -> JSON:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def outcome(client: KubeClient, ns: str) -> dict[str, Any] | None:
    """The storm's counts, or None while some pod is still undecided."""
    pods = client.list(kube.path("v1", "pods", namespace=ns), label_selector="storm=yes")
    events = client.list(kube.path("v1", "events", namespace=ns))
    guard_refused = {
        e["involvedObject"]["name"]
        for e in events
        if e["reason"] == "PrepareOverbooked" and e["involvedObject"]["kind"] == "Pod"
    }
    running, refused, stuck = [], [], []
    for pod in pods:
        name = pod["metadata"]["name"]
        scheduled = _condition(pod, "PodScheduled")
        placement = _condition(pod, "vgpu.dra.dev/Placement")
        if pod["status"].get("phase") == "Running":
            running.append(name)
        elif pod["spec"].get("nodeName") and name in guard_refused:
            stuck.append(name)
        elif (scheduled.get("status"), scheduled.get("reason")) == ("False", "Unschedulable") or (
            placement.get("status") == "False"
        ):
            refused.append(name)
        else:
            return None
    claims = {c["metadata"]["name"]: c for c in
              client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=ns))}  # fmt: skip
    waited = sum(1 for e in events if e["reason"] == "BindingConditionsPending")
    prepared: dict[str, int] = {}
    for name in running:
        for result in claims[name]["status"]["allocation"]["devices"]["results"]:
            assert result["pool"] == NODE
            amount = parse_quantity(result["consumedCapacity"]["memory"])
            prepared[result["device"]] = prepared.get(result["device"], 0) + amount
    return {
        "running": len(running),
        "refused": len(refused),
        "stuck_at_prepare": sorted(stuck),
        "guard_refusals": len(guard_refused),
        "waited_in_prebind": waited,
        "prepared_bytes": dict(sorted(prepared.items())),
    }


@pytest.mark.parametrize("binding_conditions", [True, False], ids=["binding-conditions", "guard"])
def test_a_storm_of_both_paths_never_double_books_a_container(
    cluster: Any,
    client: KubeClient,
    account: Account,
    namespace: str,
    binding_conditions: bool,
) -> None:
    args = ["--binding-conditions"] if binding_conditions else ["--no-binding-conditions"]
    with node_with_plugin(cluster, client, NODE, plugin_args=args):
        published = wait_for("node-1's GPUs published", lambda: gpus(client), 60)
        controller = Controller(account, f"storm-{binding_conditions}")
        try:
            started(client, account, controller)
            begin = time.monotonic()
            for gpu in range(ROUNDS):  # one GPU per round: no leftovers between rounds
                storm(client, namespace, gpu, published[f"gpu-{gpu}"][0])

            def settled() -> dict[str, Any] | None:
                first = outcome(client, namespace)
                if first is None:
                    return None
                time.sleep(3)  # stable across two looks: nothing was still on its way
                return first if outcome(client, namespace) == first else None

            counts = wait_for("the storm settled", settled, 400)
        finally:
            controller.kill()
            drop_holds(client, namespace)
        # The confirmer's decisions, from its log: kube-scheduler clears a failed allocation
        # (status.devices included) at once, so the claims no longer show them.
        log = controller.text()
        counts["overbooked_before_binding"] = log.count(": Overbooked (")
        counts["confirmed"] = log.count(": CapacityConfirmed (")
        counts["seconds"] = round(time.monotonic() - begin, 1)
        double_booked = 0
        fits = 0
        for gpu in range(ROUNDS):
            capacity = published[f"gpu-{gpu}"][1]
            used = counts["prepared_bytes"].get(f"gpu-{gpu}", 0)
            double_booked += max(0, used - capacity + SHARE - 1) // SHARE
            fits += capacity // SHARE
        counts["double_bookings_reaching_a_container"] = double_booked
        print(f"storm (binding conditions {binding_conditions}): {json.dumps(counts)}")
        assert double_booked == 0, counts
        assert set(counts["prepared_bytes"]) <= {f"gpu-{g}" for g in range(ROUNDS)}
        # The GPUs are used: as many shares run as fit (none lost to a refusal that stuck).
        assert counts["running"] == fits, counts
        if binding_conditions:
            assert counts["stuck_at_prepare"] == [], counts  # caught before binding instead
            assert counts["confirmed"] >= 1, counts  # default-path pods bound only confirmed


def test_a_default_path_allocation_over_capacity_it_did_not_see_is_failed_before_binding(
    cluster: Any, client: KubeClient, account: Account, namespace: str
) -> None:
    """The race made certain: kube-scheduler allocates 50Gi of gpu-3 for pod "d" and waits in
    PreBind (no controller yet); another allocator's 50Gi on the same GPU ("p", written by hand as
    the policy path writes, without conditions) lands meanwhile. The controller, started then,
    fails "d" as Overbooked: kube-scheduler deallocates it and never binds the pod there; once
    "p" is gone, "d" is allocated again, confirmed and runs."""
    claims = kube.path(RESOURCE_API, "resourceclaims", namespace=namespace)
    with node_with_plugin(cluster, client, NODE, plugin_args=["--binding-conditions"]):
        wait_for("node-1's GPUs published", lambda: gpus(client), 60)
        index3 = f'device.attributes["{DRIVER}"].index == 3'
        for name in ("d", "p"):
            exactly: JSON = {
                "deviceClassName": DRIVER,
                "capacity": {"requests": {"memory": "50Gi"}},
                "selectors": [{"cel": {"expression": index3}}],
            }
            requests = [{"name": "gpu", "exactly": exactly}]
            client.create(claims, {"metadata": {"name": name},
                                   "spec": {"devices": {"requests": requests}}})  # fmt: skip
        client.create(kube.path("v1", "pods", namespace=namespace), {
            "metadata": {"name": "d"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "d"}],
            },
        })  # fmt: skip

        def allocated(name: str) -> JSON | None:
            claim = client.get(kube.path(RESOURCE_API, "resourceclaims", name,
                                         namespace=namespace))  # fmt: skip
            return claim if claim.get("status", {}).get("allocation") else None

        d = wait_for("kube-scheduler's allocation of d", lambda: allocated("d"), 60)
        (result,) = d["status"]["allocation"]["devices"]["results"]
        assert result["bindingConditions"] == ["vgpu.dra.dev/CapacityConfirmed"]
        pod = client.get(kube.path("v1", "pods", "d", namespace=namespace))
        assert not pod["spec"].get("nodeName")  # waiting in PreBind for the condition
        p = client.get(kube.path(RESOURCE_API, "resourceclaims", "p", namespace=namespace))
        theirs = copy.deepcopy(d["status"]["allocation"])
        mine = theirs["devices"]["results"][0]
        for key in ("bindingConditions", "bindingFailureConditions"):
            mine.pop(key, None)
        mine["shareID"] = str(uuid.uuid4())
        p["status"] = {"allocation": theirs}
        client.replace(kube.path(RESOURCE_API, "resourceclaims", "p", namespace=namespace,
                                 subresource="status"), p)  # fmt: skip
        controller = Controller(account, "overbooked")
        try:
            started(client, account, controller)
            wait_for("d failed as Overbooked", lambda: "claim " + namespace + "/d: Overbooked"
                   in controller.text(), 60)  # fmt: skip
            # kube-scheduler clears the failed allocation and does not bind the pod.
            wait_for("d deallocated", lambda: not allocated("d"), 60)
            pod = client.get(kube.path("v1", "pods", "d", namespace=namespace))
            assert not pod["spec"].get("nodeName") and pod["status"].get("phase") == "Pending"
            # With "p" gone the GPU has room: allocated again, confirmed, bound and prepared.
            client.delete(kube.path(RESOURCE_API, "resourceclaims", "p", namespace=namespace))
            running = wait_for(
                "d running",
                lambda: (
                    (q := client.get(kube.path("v1", "pods", "d", namespace=namespace)))
                    and q["status"].get("phase") == "Running"
                    and q
                ),
                90,
            )
            assert running["spec"]["nodeName"] == NODE
            assert "claim " + namespace + "/d: CapacityConfirmed" in controller.text()
        finally:
            controller.kill()
            drop_holds(client, namespace)
