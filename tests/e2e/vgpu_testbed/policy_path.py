"""Checks shared by the `dev-cluster up --agents` tests (stand-in and real nodes): the allocation
controller runs as an install would, and the example the CLI prints places a gated pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import kube
from dra_driver.allocator.model import parse_quantity
from dra_driver.kube import RESOURCE_API, KubeClient
from vgpu_testbed.cluster import controller as bed_controller
from vgpu_testbed.cluster.control_plane import Cluster
from vgpu_testbed.cluster.status import CONTROLLER_PROCESS
from vgpu_testbed.polling import wait_for

JSON = dict[str, Any]


def check_controller_identity(cluster: Cluster) -> None:
    """The controller's kubeconfig is its ServiceAccount's token, limited by the chart's RBAC;
    it holds the Lease; its flags carry leader election."""
    record = next(p for p in cluster.processes if p.name == CONTROLLER_PROCESS)
    argv = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    assert b"--leader-elect" in argv
    kubeconfig = cluster.layout.component_kubeconfig(CONTROLLER_PROCESS)
    assert kubeconfig.stat().st_mode & 0o077 == 0, "the token kubeconfig must be private"
    assert str(kubeconfig).encode() in argv
    own = KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        review = own.create(
            kube.path("authentication.k8s.io/v1", "selfsubjectreviews"),
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        username = review["status"]["userInfo"]["username"]
        assert username == "system:serviceaccount:vgpu-dra:vgpu-dra-controller", username
        # Least privilege: no secrets.
        with pytest.raises(kube.KubeError) as refused:
            own.list(kube.path("v1", "secrets", namespace="vgpu-dra"))
        assert refused.value.status == 403, refused.value
    finally:
        own.close()
    admin = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        holder = bed_controller.lease_holder(admin)
    finally:
        admin.close()
    log = (cluster.root / "controller" / f"{CONTROLLER_PROCESS}.log").read_text()
    assert holder is not None and f" as {holder}" in log, (holder, log[-2000:])


def place_example(cluster: Cluster, up_stdout: str, *, running: bool = False) -> tuple[str, str]:
    """Apply the example `up` printed (as a user would with kubectl); returns (node, device)
    once the controller lifted the gate, wrote the allocation and kube-scheduler bound the pod
    there (and, with `running`, the node started it)."""
    example = cluster.root / "controller" / "example-policy-pod.yaml"
    assert f"kubectl apply -f {example}" in up_stdout
    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        for doc in yaml.safe_load_all(example.read_text()):
            plural = "pods" if doc["kind"] == "Pod" else "resourceclaimtemplates"
            api = "v1" if doc["kind"] == "Pod" else RESOURCE_API
            client.create(kube.path(api, plural, namespace="default"), doc)
        pod_path = kube.path("v1", "pods", "policy-example", namespace="default")
        pod: JSON = client.get(pod_path)
        assert [g["name"] for g in pod["spec"]["schedulingGates"]] == [bed_controller.GATE]

        def bound() -> JSON | None:
            current: JSON = client.get(pod_path)
            if not current["spec"].get("nodeName"):
                return None
            if running and (current.get("status") or {}).get("phase") != "Running":
                return None
            return current

        pod = wait_for("policy-example placed, bound (and running)", bound, timeout=120)
        assert not pod["spec"].get("schedulingGates")
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = client.get(
            kube.path(
                RESOURCE_API, "resourceclaims", status["resourceClaimName"], namespace="default"
            )
        )
        allocation = claim["status"]["allocation"]
        term = allocation["nodeSelector"]["nodeSelectorTerms"][0]
        node = term["matchFields"][0]["values"][0]
        assert node == pod["spec"]["nodeName"]
        (result,) = allocation["devices"]["results"]
        assert parse_quantity(result["consumedCapacity"]["memory"]) == 2 * 1024**3, result
        events = client.list(
            kube.path("v1", "events", namespace="default"),
            field_selector="involvedObject.name=policy-example",
        )
        # The controller placed it (kube-scheduler alone never lifts a gate); no refusal.
        assert not [e for e in events if e["reason"] == "Unschedulable"], events
        return node, str(result["device"])
    finally:
        client.close()
