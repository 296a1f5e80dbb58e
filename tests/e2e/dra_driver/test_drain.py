"""`vgpu-dra drain` / `undrain` on the test bed: a DeviceTaintRule takes one GPU out of service
for the real kube-scheduler, kube-controller-manager's device-taint eviction controller and the
policy path's controller alike.

node-2 (a simulated `a10-pcie`, 4 GPUs) runs for real (kubelet, containerd, runc, the kubelet
plugin); one `vgpu-dra controller` runs with the chart's RBAC (so its DeviceTaintRule read right
is the chart's). GPUs are chosen by UUID (the profile is the ground truth); the commands run as
a user would run them, `python -m dra_driver.cli drain ...` with the admin kubeconfig.

What this proves:
1. NoExecute: the pod holding a share on GPU X is evicted; the pod on GPU Y of the same node keeps
   running on the same allocation; new default-path claims land on other GPUs and one pinned to X
   is unschedulable; a policy-path pod avoids X and one pinned to X is refused by the controller;
   `vgpu-dra drains` shows the rule with kube-controller-manager's EvictionInProgress condition;
   `undrain` lets both pinned pods run on X.
2. NoSchedule: the running pod stays (after kube-controller-manager evaluated the rule), a new
   claim pinned to its GPU waits until `undrain`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from tests.fixtures.controller import Controller, controller_account, drop_holds, started
from tests.fixtures.workloads import (
    DRIVER,
    claim_pod,
    driver_on_nodes,
    gpu_pod,
    gpu_request,
    pod_claim,
    pod_gone,
    resource_claim,
    running_pod,
)
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.polling import wait_for

# Longer than the 60 s default: the module starts a real node and a controller; evictions go
# through kube-controller-manager and the kubelet.
pytestmark = pytest.mark.timeout(300)

JSON = dict[str, Any]
NODE = "node-2"
GATE = "vgpu.dra.dev/policy"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bed(
    cluster: Cluster, client: KubeClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controller]:
    """node-2 with the driver, and a controller (the chart's RBAC) as leader; afterwards every
    DeviceTaintRule a test left is removed, so later modules see untainted GPUs."""
    home = tmp_path_factory.mktemp("drain")
    with (
        controller_account(client, cluster, home, "drain") as account,
        driver_on_nodes(cluster, client, [NODE], ["--no-governor"]),
    ):
        controller = Controller(account, "drain")
        try:
            started(client, account, controller)
            yield controller
        finally:
            controller.kill()
            for rule in client.list(kube.path(RESOURCE_API, "devicetaintrules")):
                if rule["metadata"]["name"].startswith("drain."):
                    name = rule["metadata"]["name"]
                    client.delete(kube.path(RESOURCE_API, "devicetaintrules", name))


@pytest.fixture
def ns(bed: Controller, client: KubeClient, namespace: str) -> Iterator[str]:
    yield namespace
    drop_holds(client, namespace)  # what the controller may still hold, so the namespace goes


def uuid_of(index: int) -> str:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    return str(fakegpu.load_profile("a10-pcie").gpus[index].uuid)


def device_names(client: KubeClient) -> dict[str, str]:
    """UUID -> device name on node-2, as published (waits until all four are)."""

    def published() -> dict[str, str] | None:
        objs = client.list(
            kube.path(RESOURCE_API, "resourceslices"),
            field_selector=f"spec.driver={DRIVER},spec.nodeName={NODE}",
        )
        found = {
            d["attributes"]["uuid"]["string"]: d["name"]
            for o in objs
            for d in o["spec"].get("devices") or []
        }
        return found if len(found) == 4 else None

    return wait_for("node-2's four GPUs published", published)


def vgpu_dra(cluster: Cluster, *args: str) -> str:
    """Run the command as an admin would; its stdout (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", *args, "--kubeconfig", str(cluster.kubeconfig)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def device_of(client: KubeClient, ns: str, pod: str) -> str:
    """The device the pod's one claim got, once the pod runs (prepared on the node)."""
    running = running_pod(client, ns, pod)
    (source,) = running["spec"]["resourceClaims"]
    if "resourceClaimName" in source:  # its own claim (the policy pods)
        path = kube.path(RESOURCE_API, "resourceclaims", source["resourceClaimName"], namespace=ns)
        claim = client.get(path)
    else:  # from its template
        claim = pod_claim(client, running)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == NODE
    return str(result["device"])


def unschedulable(client: KubeClient, ns: str, name: str) -> bool:
    pod = client.get(kube.path("v1", "pods", name, namespace=ns))
    return any(
        (c.get("type"), c.get("status"), c.get("reason"))
        == ("PodScheduled", "False", "Unschedulable")
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def policy_pod(client: KubeClient, ns: str, name: str, annotations: dict[str, str]) -> None:
    """A pod on the policy path (our scheduling gate) with one 1Gi claim of its own."""
    claim = resource_claim(name, gpu_request(memory="1Gi"))
    client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=ns), claim)
    pod = claim_pod(name, {"resourceClaimName": name})
    pod["metadata"]["annotations"] = {f"vgpu.dra.dev/{k}": v for k, v in annotations.items()}
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    client.create(kube.path("v1", "pods", namespace=ns), pod)


def refused(client: KubeClient, ns: str, name: str) -> str | None:
    """The controller's refusal message for a gated pod, or None while it has none."""
    pod = client.get(kube.path("v1", "pods", name, namespace=ns))
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond["type"] == "vgpu.dra.dev/Placement" and cond["status"] == "False":
            return str(cond.get("message") or "")
    return None


def eviction_condition(cluster: Cluster, node_device: str) -> JSON | None:
    """The EvictionInProgress condition `vgpu-dra drains -o json` shows for the rule (None:
    not set yet by kube-controller-manager)."""
    node, device = node_device.split("/")
    rows = json.loads(vgpu_dra(cluster, "drains", "-o", "json"))["drains"]
    (row,) = [r for r in rows if (r["node"], r["device"]) == (node, device)]
    assert row["ours"] and row["effect"] in ("NoExecute", "NoSchedule")
    return None if row["eviction"] == "-" else row


def test_no_execute_evicts_only_that_gpus_pods_and_both_paths_avoid_it_until_undrained(
    cluster: Cluster, client: KubeClient, bed: Controller, ns: str
) -> None:
    names = device_names(client)
    x, y = uuid_of(0), uuid_of(1)
    gpu_pod(client, ns, "victim", uuid=x, memory="1Gi")
    gpu_pod(client, ns, "bystander", uuid=y, memory="1Gi")
    assert device_of(client, ns, "victim") == names[x]
    bystander = pod_claim(client, running_pod(client, ns, "bystander"))
    target = f"{NODE}/{names[x]}"

    out = vgpu_dra(cluster, "drain", target, "--reason", "e2e: fan failure")
    assert out.startswith(f"drained {target} (NoExecute)")
    wait_for("the pod on the drained GPU evicted", lambda: pod_gone(client, ns, "victim"))
    # The node's other GPU and its pod: untouched, the same allocation, still running.
    assert pod_claim(client, running_pod(client, ns, "bystander"))["status"] == bystander["status"]

    # Default path: fresh claims go elsewhere (gpu-0, the first device, is empty now), a claim
    # that can only have X waits.
    for name in ("fresh-0", "fresh-1"):
        gpu_pod(client, ns, name, memory="1Gi")
    gpu_pod(client, ns, "pinned", uuid=x, memory="1Gi")
    assert {device_of(client, ns, n) for n in ("fresh-0", "fresh-1")} & {names[x]} == set()
    wait_for("the pod pinned to X unschedulable", lambda: unschedulable(client, ns, "pinned"))
    # Policy path: placed elsewhere; pinned to X, refused by the controller.
    policy_pod(client, ns, "policy-any", {})
    policy_pod(client, ns, "policy-x", {"include-gpu-uuid": x})
    assert device_of(client, ns, "policy-any") != names[x]
    wait_for("the policy pod pinned to X refused", lambda: refused(client, ns, "policy-x"))
    row = wait_for(
        "kube-controller-manager's EvictionInProgress on the rule",
        lambda: eviction_condition(cluster, target),
    )
    print(f"drains: {row}")
    assert running_pod(client, ns, "bystander")

    assert vgpu_dra(cluster, "undrain", target).startswith(f"undrained {target}")
    assert device_of(client, ns, "pinned") == names[x]
    assert device_of(client, ns, "policy-x") == names[x]
    assert "was not drained" in vgpu_dra(cluster, "undrain", target)


def test_no_schedule_keeps_running_pods_and_places_no_new_claim(
    cluster: Cluster, client: KubeClient, bed: Controller, ns: str
) -> None:
    names = device_names(client)
    gpu = uuid_of(2)
    gpu_pod(client, ns, "stays", uuid=gpu, memory="1Gi")
    held = pod_claim(client, running_pod(client, ns, "stays"))
    target = f"{NODE}/{names[gpu]}"
    vgpu_dra(cluster, "drain", target, "--effect", "NoSchedule")
    # kube-controller-manager has seen the rule once its condition is there (NoSchedule: it
    # evicts nothing, and says so).
    row = wait_for("the rule evaluated", lambda: eviction_condition(cluster, target))
    assert row["effect"] == "NoSchedule" and row["eviction"].startswith("False")
    gpu_pod(client, ns, "waits", uuid=gpu, memory="1Gi")
    wait_for("the new pod unschedulable", lambda: unschedulable(client, ns, "waits"))
    stays = running_pod(client, ns, "stays")
    assert "deletionTimestamp" not in stays["metadata"]
    assert pod_claim(client, stays)["status"] == held["status"]
    vgpu_dra(cluster, "undrain", target)
    assert device_of(client, ns, "waits") == names[gpu]
