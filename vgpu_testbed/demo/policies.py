"""The policy-path step of `vgpu-dra demo`: the allocation controller places pods by policy.

The controller is started as `dev-cluster up --agents` starts it (the chart's RBAC, its own
token, leader election: vgpu_testbed.cluster.controller). Then:
- binpack vs spread: the same four pods (each a 4 GiB / 10-core share) are placed once with
  `node-scheduler-policy` and `device-scheduler-policy` binpack, removed, and placed again with
  both spread; a table shows the GPU each got under each policy. These pods keep a second
  scheduling gate, so nothing binds or runs them: the table is the controller's decision alone.
- NVLink: on a node with several NVLink islands (a100-2x4: two islands of 4) one whole GPU is
  taken first, so a topology-blind pick of 4 GPUs could span both islands; a 4-GPU claim with
  `device-topology-mode: link` lands inside one island, a 5-GPU claim with `link-strict` is
  refused with an Event, and the 4-GPU pod is then released to kube-scheduler, bound, and
  prepared by the node's kubelet plugin.
Tables are vgpu_testbed.demo.report's; docs/demo.md shows the output.
"""

from __future__ import annotations

import json
import time
from typing import Any

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from vgpu_testbed.cluster.controller import GATE, start_controller
from vgpu_testbed.demo import report
from vgpu_testbed.demo.steps import NAMESPACE, DemoContext
from vgpu_testbed.polling import wait_for

JSON = dict[str, Any]
PREFIX = "vgpu.dra.dev/"
# Keeps a placed pod away from kube-scheduler (it binds only pods without gates).
HOLD_GATE = "vgpu.dra.dev/demo-hold"
CLASS = "vgpu.dra.dev"
POLICY_PODS = ("p1", "p2", "p3", "p4")
SHARE = {"memory": "4Gi", "cores": "10"}
RUNS = {
    "binpack": {"node-scheduler-policy": "binpack", "device-scheduler-policy": "binpack"},
    "spread": {"node-scheduler-policy": "spread", "device-scheduler-policy": "spread"},
}
LINKED = 4  # GPUs of the NVLink-aware claim: one island of a100-2x4


def claim(name: str, *, count: int = 1, requests: dict[str, str] | None = None) -> JSON:
    exactly: JSON = {"deviceClassName": CLASS, "count": count}
    if requests:
        exactly["capacity"] = {"requests": dict(requests)}
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def gated_pod(name: str, annotations: dict[str, str]) -> JSON:
    """A pod on the policy path (the gate opts it in) whose claim has its name; held back from
    kube-scheduler by a second gate until the demo lifts it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {PREFIX + k: v for k, v in annotations.items()},
        },
        "spec": {
            "restartPolicy": "Never",
            "schedulingGates": [{"name": GATE}, {"name": HOLD_GATE}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }


def submit(client: KubeClient, name: str, claim_obj: JSON, annotations: dict[str, str]) -> None:
    client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=NAMESPACE), claim_obj)
    client.create(kube.path("v1", "pods", namespace=NAMESPACE), gated_pod(name, annotations))


def placement_condition(pod: JSON) -> JSON | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "vgpu.dra.dev/Placement":
            return dict(cond)
    return None


def wait_placed(client: KubeClient, name: str, timeout: float) -> tuple[str, list[str]]:
    """(node, devices) once the controller allocated pod `name`'s claim and lifted its gate;
    RuntimeError with the controller's reason when it refused the pod."""

    def check() -> tuple[str, list[str]] | None:
        pod = client.get(kube.path("v1", "pods", name, namespace=NAMESPACE))
        refused = placement_condition(pod)
        if refused and refused.get("status") == "False":
            raise RuntimeError(f"the controller refused pod {name}: {refused.get('message')}")
        if GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]:
            return None
        status = client.get(
            kube.path(RESOURCE_API, "resourceclaims", name, namespace=NAMESPACE)
        ).get("status")
        allocation = (status or {}).get("allocation")
        if not allocation:
            return None
        term = allocation["nodeSelector"]["nodeSelectorTerms"][0]
        node = str(term["matchFields"][0]["values"][0])
        return node, [str(r["device"]) for r in allocation["devices"]["results"]]

    return wait_for(f"the controller to place pod {name}", check, timeout)


def wait_refused(client: KubeClient, name: str, timeout: float) -> str:
    """The message of the Event the controller recorded for refusing pod `name`."""

    def check() -> str | None:
        events = client.list(
            kube.path("v1", "events", namespace=NAMESPACE),
            field_selector=f"involvedObject.name={name}",
        )
        refusals = [e for e in events if e.get("reason") == "Unschedulable"]
        return str(refusals[-1].get("message")) if refusals else None

    return wait_for(f"the controller's Event refusing pod {name}", check, timeout)


def remove(client: KubeClient, names: list[str], timeout: float) -> None:
    """Delete the pods and their claims; wait until the claims are gone (capacity free)."""
    for name in names:
        client.request(
            "DELETE",
            kube.path("v1", "pods", name, namespace=NAMESPACE),
            query={"gracePeriodSeconds": 0},
        )
        client.delete(kube.path(RESOURCE_API, "resourceclaims", name, namespace=NAMESPACE))

    def gone() -> bool:
        left = {
            c["metadata"]["name"]
            for c in client.list(kube.path(RESOURCE_API, "resourceclaims", namespace=NAMESPACE))
        }
        return not left & set(names)

    wait_for(f"claims {', '.join(names)} to be deleted", gone, timeout)


def step_policy_path(ctx: DemoContext) -> None:
    cluster, client = ctx.need_cluster(), ctx.need_client()
    timeout = float(ctx.args.wait_timeout)
    started = time.monotonic()
    handle = start_controller(cluster)
    ctx.say(
        f"vgpu-dra controller pid {handle.process.pid} ready in "
        f"{time.monotonic() - started:.1f}s: ServiceAccount "
        f"{handle.namespace}/{handle.service_account} with the chart's RBAC, leader of Lease "
        f"{handle.namespace}/{handle.lease}"
    )
    ctx.say(
        f"the same {len(POLICY_PODS)} pods ({SHARE['memory']}, {SHARE['cores']} cores each; "
        f"gate {GATE}), placed one by one under each policy:"
    )
    runs: dict[str, dict[str, tuple[str, str]]] = {}
    for policy, wanted in RUNS.items():
        placed: dict[str, tuple[str, str]] = {}
        for name in POLICY_PODS:
            submit(client, name, claim(name, requests=SHARE), wanted)
            node, devices = wait_placed(client, name, timeout)
            placed[name] = (node, devices[0])
        runs[policy] = placed
        remove(client, list(POLICY_PODS), timeout)
    for line in report.policy_table(POLICY_PODS, runs):
        ctx.say(line)
    for policy, placed in runs.items():
        ctx.say(f"{policy}: {report.spread_summary(placed)}")
    ctx.results["policy_runs"] = {
        p: {k: "/".join(v) for k, v in r.items()} for p, r in runs.items()
    }
    show_nvlink(ctx, client, timeout)


def show_nvlink(ctx: DemoContext, client: KubeClient, timeout: float) -> None:
    rows = list(ctx.devices.values())
    node = report.island_node(rows, LINKED)
    if node is None:
        ctx.say(
            f"NVLink-aware placement SKIPPED: no node with several NVLink islands of {LINKED} "
            "GPUs (add a100-2x4 to --nodes)"
        )
        return
    domains = report.islands(rows, node)
    product = next(r.product for r in rows if r.node == node)
    only_here = {"include-gpu-type": product}
    ctx.say(
        f"{node} ({product}): NVLink islands "
        + "; ".join(f"{d}: {','.join(devs)}" for d, devs in sorted(domains.items()))
    )
    submit(client, "one-gpu", claim("one-gpu"), {**only_here, "device-scheduler-policy": "binpack"})
    _, (taken,) = wait_placed(client, "one-gpu", timeout)
    ctx.say(f"pod one-gpu takes a whole {taken} first (binpack)")
    submit(
        client,
        "linked",
        claim("linked", count=LINKED),
        {**only_here, "device-topology-mode": "link"},
    )
    where, devices = wait_placed(client, "linked", timeout)
    by_device = {r.device: r.nvlink for r in rows if r.node == node}
    spanned = sorted({str(by_device.get(d)) for d in devices})
    ctx.say(
        f"pod linked ({LINKED} GPUs, device-topology-mode: link): {where} "
        f"{','.join(devices)}, NVLink island {', '.join(spanned)}"
    )
    if where != node or len(spanned) != 1:
        raise RuntimeError(f"the {LINKED}-GPU link claim spans islands {spanned} on {where}")
    submit(
        client,
        "five",
        claim("five", count=LINKED + 1),
        {**only_here, "device-topology-mode": "link-strict"},
    )
    message = wait_refused(client, "five", timeout)
    ctx.say(f"pod five ({LINKED + 1} GPUs, link-strict): refused, Event: {message}")
    # Hand the linked pod to kube-scheduler: it binds it to the node the claim is allocated on,
    # and that node's kubelet plugin prepares the 4 GPUs.
    client.merge_patch(
        kube.path("v1", "pods", "linked", namespace=NAMESPACE), {"spec": {"schedulingGates": None}}
    )
    cdi = wait_prepared_devices(ctx, client, "linked", timeout)
    ctx.say(
        f"gate lifted: kube-scheduler bound pod linked to {node}, the plugin prepared "
        f"{cdi} CDI devices"
    )
    ctx.results["linked"] = {"node": where, "devices": devices, "islands": spanned}


def wait_prepared_devices(ctx: DemoContext, client: KubeClient, name: str, timeout: float) -> int:
    """CDI device count once pod `name` is bound and its node's kubelet stand-in prepared it."""

    def check() -> int | None:
        pod = client.get(kube.path("v1", "pods", name, namespace=NAMESPACE))
        node = pod["spec"].get("nodeName")
        agents = ctx.agents.get(node or "")
        if agents is None:
            return None
        try:
            record = json.loads(agents.paths.pod_record(NAMESPACE, name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        errors = [c.get("error") for c in record.get("claims") or [] if c.get("error")]
        if errors:
            raise RuntimeError(f"kubelet plugin on {node} failed to prepare {name}: {errors}")
        if not record.get("ready"):
            return None
        return sum(
            len(d.get("cdiDeviceIDs") or [])
            for c in record.get("claims") or []
            for d in c.get("devices") or []
        )

    return wait_for(f"pod {name} to be bound and prepared", check, timeout)
