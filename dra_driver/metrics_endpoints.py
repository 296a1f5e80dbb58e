"""Where `vgpu-dra status` reads each node's live figures: the kubelet plugins' `/metrics`.

Why discovery: a user asking for the status of a cluster should not have to know on which
address each node's plugin serves metrics. Two sources, first match per node wins:

1. `--metrics-endpoint NODE=URL` (explicit, always wins; the test bed's
   `vgpu-dra dev-cluster gpus` passes its plugins' URLs this way);
2. the API: the pods of the chart's DaemonSet (labels `app.kubernetes.io/name=vgpu-dra`,
   `app.kubernetes.io/component=kubelet-plugin`, the driver named in their env), scraped through
   the API server's pod proxy (`pods/<name>:<port>/proxy/metrics`), so it works from outside
   the cluster with the kubeconfig alone (it needs `get` on `pods/proxy`, which cluster admins
   have). The port is the container port named `metrics`, else the one in the container's
   `VGPU_DRA_METRICS_ADDRESS`; a plugin without either serves no metrics and is skipped.

Nothing here decides anything about the figures; `dra_driver.status` parses them.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver import kube
from dra_driver.metrics_http import parse_address

JSON = dict[str, Any]
PLUGIN_SELECTOR = "app.kubernetes.io/name=vgpu-dra,app.kubernetes.io/component=kubelet-plugin"
METRICS_ENV = "VGPU_DRA_METRICS_ADDRESS"
DRIVER_ENV = "VGPU_DRA_DRIVER_NAME"


@dataclass(frozen=True)
class Endpoint:
    """One node's metrics: where (for messages) and how to read them (the exposition text)."""

    where: str
    fetch: Callable[[], str]


def url_endpoint(url: str, timeout_s: float = 5.0) -> Endpoint:
    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return str(response.read().decode())

    return Endpoint(url, fetch)


# ---- the chart's plugin pods, through the API server ---------------------------------------


def metrics_port(pod: Mapping[str, Any]) -> int | None:
    """The port the pod's plugin container serves metrics on, or None (metrics off)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "metrics" and port.get("containerPort"):
                return int(port["containerPort"])
        for env in container.get("env") or []:
            if env.get("name") == METRICS_ENV and env.get("value"):
                try:
                    return parse_address(str(env["value"]))[1] or None
                except ValueError:
                    return None
    return None


def _driver_of(pod: Mapping[str, Any]) -> str | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == DRIVER_ENV and env.get("value"):
                return str(env["value"])
    return None


def from_plugin_pods(
    client: kube.KubeClient, driver: str, timeout_s: float = 5.0
) -> dict[str, Endpoint]:
    """node -> endpoint of every running plugin pod of `driver` that serves metrics
    (KubeError when the pods cannot be listed)."""
    found: dict[str, Endpoint] = {}
    pods = client.list(kube.path("v1", "pods"), label_selector=PLUGIN_SELECTOR)
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        port = metrics_port(pod)
        if (pod.get("status") or {}).get("phase") != "Running" or not node or port is None:
            continue
        if _driver_of(pod) not in (None, driver):
            continue  # another install of the chart, for another driver name
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        path = kube.path("v1", "pods", name, namespace=namespace) + f":{port}/proxy/metrics"

        def fetch(path: str = path) -> str:
            return client.get_text(path, timeout_s=timeout_s)

        where = f"pod {namespace}/{name} port {port} via the API server"
        found[str(node)] = Endpoint(where, fetch)
    return found
