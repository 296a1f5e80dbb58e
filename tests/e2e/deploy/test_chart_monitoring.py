"""The chart's optional ServiceMonitors (monitoring.serviceMonitor), rendered by the real helm.

Proves: nothing is rendered by default, nor without metrics, nor when the cluster does not serve
monitoring.coreos.com/v1 (helm's capabilities; `--api-versions` stands for a cluster with the
Prometheus Operator's CRDs); with it, a headless Service per component whose selector matches
the pods of the DaemonSet / Deployment and whose port is the one the components serve metrics on
(taken through their own argument parsers from the env the chart gives them), and a
ServiceMonitor selecting exactly that Service; the plugin's keeps the tenants' labels; extra
labels reach the ServiceMonitors; a bad interval is refused naming the value; the API server
accepts the Services (server-side dry run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.main import build_parser as controller_parser
from dra_driver import kube
from dra_driver.kube import KubeClient
from dra_driver.metrics_http import parse_address
from kubelet_plugin.main import build_parser as plugin_parser
from tests.fixtures.chart import CHART, JSON, KUBE_VERSION, by_kind, helm, helm_binary, values_file

pytestmark = pytest.mark.timeout(180)

ON = {
    "metrics": {"enabled": True, "address": "0.0.0.0:9555"},
    "monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
}
WITH_CRD = ("--api-versions", "monitoring.coreos.com/v1")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm_binary()
    return tmp_path_factory.mktemp("helm-monitoring")


def render(home: Path, values: dict[str, Any], *extra: str) -> list[JSON]:
    run = helm(
        home, "template", "t", str(CHART), "--namespace", "gpu-system",
        "--kube-version", KUBE_VERSION, "-f", str(values_file(home, "mon", values)), *extra,
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc]


def monitors(docs: list[JSON]) -> dict[str, JSON]:
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in by_kind(docs, "ServiceMonitor")
    }


def metrics_services(docs: list[JSON]) -> dict[str, JSON]:
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in by_kind(docs, "Service")
        if d["metadata"]["labels"].get("vgpu.dra.dev/metrics") == "true"
    }


def env_of(workload: JSON) -> dict[str, str]:
    container = workload["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


@pytest.mark.parametrize(
    ("values", "extra"),
    [
        ({}, WITH_CRD),  # default: off
        ({**ON, "metrics": {"enabled": False}}, WITH_CRD),  # nothing to scrape
        (ON, ()),  # the cluster has no Prometheus Operator
    ],
)
def test_not_rendered(home: Path, values: dict[str, Any], extra: tuple[str, ...]) -> None:
    docs = render(home, values, *extra)
    assert not by_kind(docs, "ServiceMonitor")
    assert not metrics_services(docs)


def test_plugin_and_controller_monitors_select_their_pods_port(home: Path) -> None:
    docs = render(home, {**ON, "controller": {"enabled": True}}, *WITH_CRD)
    services, sms = metrics_services(docs), monitors(docs)
    assert set(services) == set(sms) == {"kubelet-plugin", "controller"}
    [daemonset] = by_kind(docs, "DaemonSet")
    [deployment] = by_kind(docs, "Deployment")
    served = {
        "kubelet-plugin": plugin_parser(env_of(daemonset))
        .parse_args(["--node-name", "n"])
        .metrics_address,
        "controller": controller_parser(env_of(deployment)).parse_args([]).metrics_address,
    }
    for component, workload in (("kubelet-plugin", daemonset), ("controller", deployment)):
        service, sm = services[component], sms[component]
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"].items() <= pod_labels.items()
        [port] = service["spec"]["ports"]
        assert port["name"] == "metrics"
        assert port["targetPort"] == parse_address(served[component])[1] == 9555
        assert sm["metadata"]["namespace"] == service["metadata"]["namespace"] == "gpu-system"
        selects = sm["spec"]["selector"]["matchLabels"].items()
        assert selects <= service["metadata"]["labels"].items()
        # ...and selects no other Service of the release (e.g. the webhook's).
        others = [s for s in by_kind(docs, "Service") if s is not service]
        assert not any(selects <= s["metadata"]["labels"].items() for s in others)
        assert sm["spec"]["namespaceSelector"] == {"matchNames": ["gpu-system"]}
        [endpoint] = sm["spec"]["endpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
        assert endpoint["interval"] == "30s"
        assert sm["metadata"]["labels"]["release"] == "prom"
    plugin = sms["kubelet-plugin"]["spec"]["endpoints"][0]
    assert plugin["honorLabels"] is True  # the tenant's namespace/pod/container win
    assert plugin["relabelings"] == [{"action": "labeldrop", "regex": "namespace|pod|container"}]
    assert "honorLabels" not in sms["controller"]["spec"]["endpoints"][0]


def test_controller_off_renders_only_the_plugins(home: Path) -> None:
    off = {**ON, "controller": {"enabled": False}}
    assert set(monitors(render(home, off, *WITH_CRD))) == {"kubelet-plugin"}
    # The default install has the controller: both are monitored.
    assert set(monitors(render(home, ON, *WITH_CRD))) == {"kubelet-plugin", "controller"}


def test_a_bad_interval_is_refused_naming_it(home: Path) -> None:
    bad = {"monitoring": {"serviceMonitor": {"enabled": True, "interval": "often"}}}
    run = helm(
        home, "template", "t", str(CHART), "--kube-version", KUBE_VERSION,
        "-f", str(values_file(home, "bad", bad)), check=False,
    )  # fmt: skip
    assert run.returncode != 0
    assert "/monitoring/serviceMonitor/interval" in run.stderr, run.stderr


def test_the_metrics_services_pass_a_server_side_dry_run(
    home: Path, cluster: Any, namespace: str
) -> None:
    """The Services are plain core objects: the 1.37 API server accepts them as rendered (the
    ServiceMonitors need the Prometheus Operator's CRDs, which the bed does not have)."""
    client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        docs = render(home, {**ON, "controller": {"enabled": True}}, *WITH_CRD)
        services = list(metrics_services(docs).values())
        assert len(services) == 2
        for service in services:
            service["metadata"]["namespace"] = namespace
            echo = client.request(
                "POST",
                kube.path("v1", "services", namespace=namespace),
                body=service,
                query={"dryRun": "All"},
            )
            assert echo["spec"]["clusterIP"] == "None"
            assert echo["spec"]["ports"][0]["port"] == 9555
    finally:
        client.close()
