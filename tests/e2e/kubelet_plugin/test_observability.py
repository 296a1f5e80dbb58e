"""Observability on the test bed: Events for a claim that cannot be prepared, `vgpu-dra status`
against the real cluster with live figures from the plugin's /metrics.

node-1 of the session cluster (a simulated `dgx-h100`) runs for real where the host allows
(`tests.fixtures.workloads.driver_on_nodes`): the kubelet plugin runs with the node's credentials
(`system:node:node-1`, so the Node authorizer and NodeRestriction apply to every Event it
writes) and, as everywhere in the bed, metrics on a loopback port (on a real node its own,
mirrored on the host's at the same port); the real kubelet prepares the pods the real scheduler
binds there.

What this proves:
1. A claim whose opaque config is invalid is allocated by the scheduler but fails to prepare;
   the plugin writes a Warning Event on the ResourceClaim and on its Pod, with the node as
   source and a message naming the bad field (what `kubectl describe` shows the user).
2. `vgpu-dra status` (the console script, from the admin kubeconfig) lists node-1's GPUs, the
   shared example's claim with 1Gi and 10 % cores on its GPU, that GPU's free memory and cores,
   and the live columns from the plugin's metrics; `-o json` carries the same figures; the
   table has no colour codes when its output is not a terminal.
3. `vgpu-dra dev-cluster gpus` finds the bed's plugins' metrics by itself (the product's status
   knows only the chart's pods and explicit endpoints) and the claim's series name its container.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from dra_driver.status import fetch_metrics
from tests.fixtures import workloads
from vgpu_testbed.polling import wait_for
from vgpu_testbed.standin.node_agents import NodeAgents

# Longer than the 60 s default: module fixtures start node agents; tests wait for metrics, events
# and traces of real pods.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def node1(cluster: Any, client: KubeClient) -> Iterator[tuple[NodeAgents, str]]:
    """node-1's agents with metrics on a free loopback port; (agents, metrics URL)."""
    with workloads.driver_on_nodes(
        cluster, client, ["node-1"], ["--resync-seconds", "1"]
    ) as started:
        agents = started["node-1"]
        # The bed starts every plugin with metrics on a free loopback port.
        url = wait_for("the plugin's metrics URL in its log", agents.metrics_url)
        yield agents, url


def events_about(client: KubeClient, namespace: str, uid: str) -> list[dict[str, Any]]:
    """The plugin's Events about one object (the scheduler writes its own on the pod)."""
    return [
        e
        for e in client.list(kube.path("v1", "events", namespace=namespace))
        if (e.get("involvedObject") or {}).get("uid") == uid
        and (e.get("source") or {}).get("component") == "vgpu-dra-kubelet-plugin"
    ]


def test_prepare_failure_is_an_event_on_claim_and_pod(
    client: KubeClient, node1: tuple[NodeAgents, str], namespace: str
) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "bad-config"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": workloads.DRIVER}}],
                "config": [
                    {
                        "opaque": {
                            "driver": workloads.DRIVER,
                            "parameters": {
                                "apiVersion": "vgpu.dra.dev/v1alpha1",
                                "kind": "VgpuConfig",
                                "computePolicy": "max",
                            },
                        }
                    }
                ],
            }
        },
    }
    created = client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace), claim)
    pod = client.create(
        kube.path("v1", "pods", namespace=namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bad-config"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "cuda",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "bad-config"}],
            },
        },
    )
    claim_uid, pod_uid = created["metadata"]["uid"], pod["metadata"]["uid"]
    [claim_event] = wait_for(
        "a Warning Event on the claim",
        lambda: events_about(client, namespace, claim_uid),
        timeout=90,
    )
    assert claim_event["type"] == "Warning"
    assert claim_event["reason"] == "PrepareFailed"
    assert claim_event["involvedObject"]["kind"] == "ResourceClaim"
    assert claim_event["source"] == {"component": "vgpu-dra-kubelet-plugin", "host": "node-1"}
    message = claim_event["message"]
    assert message.startswith("cannot prepare this claim on node node-1")
    assert "computePolicy" in message and "max" in message  # names the field and the value
    assert "fix the claim" in message
    [pod_event] = wait_for(
        "a Warning Event on the pod", lambda: events_about(client, namespace, pod_uid)
    )
    assert pod_event["involvedObject"]["kind"] == "Pod"
    assert pod_event["message"].startswith("cannot prepare ResourceClaim bad-config")


def run_cli(*argv: str) -> str:
    """`vgpu-dra ARGV...` as a user runs it; its standard output."""
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=workloads.REPO,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_status(cluster: Any, *args: str) -> str:
    return run_cli("status", f"--kubeconfig={cluster.kubeconfig}", *args)


def test_status_shows_the_shared_claim_with_live_figures(
    cluster: Any, client: KubeClient, node1: tuple[NodeAgents, str], namespace: str
) -> None:
    _, url = node1
    workloads.apply(client, workloads.EXAMPLES / "shared-gpu.yaml", namespace)
    pod = workloads.running_pod(client, namespace, "shared-gpu")
    claim = workloads.pod_claim(client, pod)
    [allocated] = claim["status"]["allocation"]["devices"]["results"]
    endpoint = f"--metrics-endpoint=node-1={url}"
    document = json.loads(run_status(cluster, "-o", "json", endpoint))
    assert document["live_nodes"] == ["node-1"] and not document["errors"]
    gpus = {g["device"]: g for g in document["gpus"] if g["node"] == "node-1"}
    assert len(gpus) == 8  # the dgx-h100 profile
    gpu = gpus[allocated["device"]]
    assert gpu["claims"] >= 1
    mine = [
        c
        for c in document["claims"]
        if c["namespace"] == namespace and c["claim"] == claim["metadata"]["name"]
    ]
    assert mine == [
        {
            "namespace": namespace,
            "claim": claim["metadata"]["name"],
            "node": "node-1",
            "device": allocated["device"],
            "memory": workloads.GIB,
            "cores": 10,
            "pods": ["shared-gpu"],
            "memory_used": 0,  # live from the plugin's region reading: no process runs yet
            "utilization": 0.0,
        }
    ]
    assert gpu["memory_free"] == gpu["memory_total"] - gpu["memory_allocated"]
    assert gpu["cores_free"] == 100 - gpu["cores_allocated"]
    assert gpu["memory_used"] is not None  # NVML of the simulated GPU, via the plugin

    table = run_status(cluster, endpoint)
    assert "\033[" not in table  # not a terminal: no colour
    row = next(line.split() for line in table.splitlines() if line.startswith(f"{namespace} "))
    assert row[:6] == [
        namespace, claim["metadata"]["name"], "node-1", allocated["device"], "1Gi", "10%"
    ]  # fmt: skip
    wide = run_status(cluster, "-o", "wide")
    assert "shared-gpu" in wide and "UUID" in wide


def run_bed_gpus(cluster: Any, *args: str) -> str:
    """`vgpu-dra dev-cluster gpus`: the product's status with the bed's plugins' URLs."""
    return run_cli("dev-cluster", "gpus", f"--dir={cluster.kubeconfig.parent}", *args)


def test_the_bed_finds_its_plugins_metrics_without_flags(
    cluster: Any, client: KubeClient, node1: tuple[NodeAgents, str], namespace: str
) -> None:
    """`vgpu-dra dev-cluster gpus` reads the plugins' metrics URLs from the bed's cluster
    directory and hands them to `vgpu-dra status`; --no-discover (a status flag) turns live
    figures off. The claim's series carry the container of the pod that uses it."""
    assert (cluster.kubeconfig.parent / "state.json").is_file()
    workloads.apply(client, workloads.EXAMPLES / "shared-gpu.yaml", namespace)
    pod = workloads.running_pod(client, namespace, "shared-gpu")
    claim = workloads.pod_claim(client, pod)
    document = json.loads(run_bed_gpus(cluster, "-o", "json"))
    assert "node-1" in document["live_nodes"] and not document["errors"]
    [mine] = [c for c in document["claims"] if c["claim"] == claim["metadata"]["name"]]
    assert mine["memory_used"] == 0 and mine["utilization"] == 0.0  # live, not "-"
    # The plugin read the pod (node credentials: its own node's pods) for the container label.
    _, url = node1

    def containers() -> set[str] | None:
        found = {
            labels.get("container", "")
            for name, labels, _ in fetch_metrics(url)
            if name == "vgpu_dra_claim_memory_limit_bytes"
            and labels.get("claim") == claim["metadata"]["name"]
        }
        return found if found == {"cuda"} else None

    wait_for("the claim's series to name container cuda", containers)
    offline = json.loads(run_bed_gpus(cluster, "-o", "json", "--no-discover"))
    assert offline["live_nodes"] == []
    [mine] = [c for c in offline["claims"] if c["claim"] == claim["metadata"]["name"]]
    assert mine["memory_used"] is None
