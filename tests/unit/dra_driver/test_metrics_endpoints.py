"""Where `vgpu-dra status` finds each node's plugin metrics without flags
(`dra_driver.metrics_endpoints`, `dra_driver.status.discover`).

Proves: the port of a plugin pod comes from its `metrics` container port, else from its env,
else it serves no metrics; explicit endpoints override discovered ones. (The test bed's own
cluster directory: tests/unit/vgpu_testbed/cluster/test_metrics_urls.py.)
(The API-server path runs in tests/e2e/kubelet_plugin/test_observability.py.)
"""

from __future__ import annotations

from typing import Any

from dra_driver.metrics_endpoints import metrics_port
from dra_driver.status import discover


def pod(ports: list[dict[str, Any]], env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "kubelet-plugin", "ports": ports, "env": env}]}}


def test_metrics_port_of_a_plugin_pod() -> None:
    env = [{"name": "VGPU_DRA_METRICS_ADDRESS", "value": "0.0.0.0:9464"}]
    assert metrics_port(pod([], env)) == 9464
    assert metrics_port(pod([{"name": "metrics", "containerPort": 9000}], env)) == 9000
    assert metrics_port(pod([{"name": "health", "containerPort": 51515}], [])) is None
    assert metrics_port(pod([], [{"name": "VGPU_DRA_METRICS_ADDRESS", "value": "junk"}])) is None


def test_explicit_endpoints_override_discovered_ones() -> None:
    class Api:
        def list(self, path: str, **_: Any) -> list[dict[str, Any]]:
            plugin = pod([{"name": "metrics", "containerPort": 9464}], [])
            plugin.update(metadata={"name": "p1", "namespace": "ns"}, status={"phase": "Running"})
            plugin["spec"]["nodeName"] = "node-1"
            other = {**plugin, "metadata": {"name": "p2", "namespace": "ns"}}
            other["spec"] = {**plugin["spec"], "nodeName": "node-2"}
            return [plugin, other]

    found, warnings = discover(
        Api(),  # type: ignore[arg-type]
        driver="vgpu.dra.dev",
        explicit={"node-2": "http://127.0.0.1:9/metrics"},
    )
    assert not warnings
    assert found["node-2"] == "http://127.0.0.1:9/metrics"
    assert not isinstance(found["node-1"], str) and "pod ns/p1 port 9464" in found["node-1"].where
