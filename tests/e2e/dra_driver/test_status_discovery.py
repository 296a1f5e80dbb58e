"""`vgpu-dra status` finds the chart's plugin pods through the real API server.

Pods shaped like the chart's DaemonSet pods (its labels, the driver and metrics address in the
container's env) are created on a session node and marked Running through the status
subresource, next to pods that must be ignored (another driver, metrics off, not running).
Their IP is 127.0.0.1, which the API server refuses to proxy to, so no traffic leaves the
machine: the scrape fails with the API server's own answer, which proves the proxy path names
the pod and port as the API server expects (an unknown path would be a 404).

Proves: only the running pods of the driver that serve metrics are used, keyed by their node;
the command, run with a kubeconfig outside any test-bed directory, goes through the API and
reports the failed scrape as a warning naming the pod (exit 0, the allocation figures still
shown).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dra_driver import kube
from dra_driver.kube import KubeClient
from dra_driver.metrics_endpoints import from_plugin_pods

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
LABELS = {"app.kubernetes.io/name": "vgpu-dra", "app.kubernetes.io/component": "kubelet-plugin"}
REPO = Path(__file__).resolve().parents[3]


def plugin_pod(name: str, node: str, driver: str, metrics: str | None) -> JSON:
    env = [{"name": "VGPU_DRA_DRIVER_NAME", "value": driver}]
    if metrics is not None:
        env.append({"name": "VGPU_DRA_METRICS_ADDRESS", "value": metrics})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": LABELS},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "kubelet-plugin", "image": "registry.k8s.io/pause:3.10", "env": env}
            ],
        },
    }


def create(client: KubeClient, ns: str, pod: JSON, *, running: bool) -> None:
    created = client.create(kube.path("v1", "pods", namespace=ns), pod)
    if running:
        status = {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        path = kube.path("v1", "pods", pod["metadata"]["name"], namespace=ns, subresource="status")
        client.replace(path, {**created, "status": status})


def test_plugin_pods_are_found_and_scraped_through_the_api_server(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    driver = f"{namespace}.status.vgpu.dra.dev"
    try:
        create(
            client, namespace, plugin_pod("mine", "node-1", driver, "0.0.0.0:9464"), running=True
        )
        create(client, namespace, plugin_pod("other", "node-2", "x." + driver, "0.0.0.0:9464"),
               running=True)  # fmt: skip
        create(client, namespace, plugin_pod("no-metrics", "node-2", driver, None), running=True)
        create(client, namespace, plugin_pod("pending", "node-2", driver, "0.0.0.0:9464"),
               running=False)  # fmt: skip
        found = from_plugin_pods(client, driver)
        assert set(found) == {"node-1"}
        assert found["node-1"].where == f"pod {namespace}/mine port 9464 via the API server"
        with pytest.raises(kube.KubeError) as refused:
            found["node-1"].fetch()
        # The API server resolved pod and port, then refused the loopback IP (no 404).
        assert refused.value.status == 400 and "address not allowed" in str(refused.value)
    finally:
        client.close()

    # The command with a kubeconfig outside the bed's directory: discovery through the API.
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copy(cluster.kubeconfig, kubeconfig)
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "status", "--kubeconfig", str(kubeconfig),
         "--driver-name", driver, "-o", "json"],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["live_nodes"] == []
    [error] = document["errors"]
    assert error.startswith(f"metrics of node-1 (pod {namespace}/mine port 9464"), error
