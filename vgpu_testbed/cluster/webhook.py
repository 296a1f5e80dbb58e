"""The admission webhook registered with the test bed's API server, exactly as the chart does.

Why: the bed's API server runs on loopback without kube-proxy, so it cannot reach a webhook
through a Service. The configurations are therefore rendered from the chart itself
(deploy/helm/vgpu-dra, with the bed's helm: `vgpu_testbed.cluster.chart.render`) and only their
`clientConfig` is rewritten from the Service to `https://127.0.0.1:<port><path>`: rules,
matchConditions, failure policies and timeouts cannot drift from what a real install gets.

Call `register_webhooks(cluster, port, ca_bundle)` after starting a controller with
`--webhook-port <port> --webhook-bind 127.0.0.1 --webhook-cert-ips 127.0.0.1`. With
`ca_bundle=None` the caBundle already registered is kept (the controller publishes its own CA
into the configurations it is told about, `--webhook-config-names`).
"""

from __future__ import annotations

import base64
import copy
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver import kube
from vgpu_testbed.cluster import chart

JSON = dict[str, Any]
ADMISSION_API = "admissionregistration.k8s.io/v1"
PLURALS = {
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
}
DEFAULT_NAMESPACE = "vgpu-dra-system"
DEFAULT_RELEASE = "vgpu"


def render_chart(values: Mapping[str, Any], *, namespace: str, release: str) -> list[JSON]:
    """`helm template` of the chart with `values` (the controller and its webhook on)."""
    merged = _merge({"controller": {"enabled": True}}, values)
    with tempfile.TemporaryDirectory(prefix="vgpu-dra-helm-") as home:
        return chart.render(Path(home), merged, namespace=namespace, release=release)


def bed_configurations(docs: list[JSON], port: int, ca_bundle: bytes | None) -> list[JSON]:
    """The chart's webhook configurations, called at https://127.0.0.1:<port> instead."""
    configs = []
    for doc in docs:
        if doc.get("kind") not in PLURALS:
            continue
        config = copy.deepcopy(doc)
        for hook in config.get("webhooks") or []:
            service = hook["clientConfig"].pop("service")
            hook["clientConfig"]["url"] = f"https://127.0.0.1:{port}{service.get('path', '/')}"
            if ca_bundle is not None:
                hook["clientConfig"]["caBundle"] = base64.b64encode(ca_bundle).decode()
        configs.append(config)
    return configs


def register_webhooks(
    cluster: Any,
    port: int,
    ca_bundle: bytes | None,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    release: str = DEFAULT_RELEASE,
    values: Mapping[str, Any] | None = None,
) -> list[JSON]:
    """Create (or replace) the chart's webhook configurations pointing at 127.0.0.1:`port`;
    returns them as registered. `values` are chart values (e.g. `webhook.sharedResources`)."""
    docs = render_chart(values or {}, namespace=namespace, release=release)
    api_client = cluster.api_client()
    client = kube.KubeClient(api_client)
    registered = []
    try:
        for config in bed_configurations(docs, port, ca_bundle):
            plural = PLURALS[config["kind"]]
            try:
                registered.append(client.create(kube.path(ADMISSION_API, plural), config))
                continue
            except kube.AlreadyExists:
                pass
            resource = kube.path(ADMISSION_API, plural, config["metadata"]["name"])
            current = client.get(resource)
            config["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            if ca_bundle is None:  # keep what the controller published
                bundles = [h.get("clientConfig", {}).get("caBundle") for h in current["webhooks"]]
                for hook, bundle in zip(config["webhooks"], bundles, strict=False):
                    if bundle:
                        hook["clientConfig"]["caBundle"] = bundle
            registered.append(client.replace(resource, config))
    finally:
        api_client.close()
    return registered


def unregister_webhooks(cluster: Any, configs: list[JSON]) -> None:
    """Delete configurations `register_webhooks` returned (absent ones are fine)."""
    api_client = cluster.api_client()
    client = kube.KubeClient(api_client)
    try:
        for config in configs:
            client.delete(
                kube.path(ADMISSION_API, PLURALS[config["kind"]], config["metadata"]["name"])
            )
    finally:
        api_client.close()


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> JSON:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def controller_flags(port: int, *, namespace: str, release: str) -> list[str]:
    """The controller's webhook flags for serving on 127.0.0.1:`port` in the bed, with the
    Service, Secret and configuration names the chart gives that release."""
    docs = render_chart({}, namespace=namespace, release=release)
    (deploy,) = chart.by_kind(docs, "Deployment")
    env = {
        e["name"]: e["value"]
        for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }
    return [
        "--webhook-port", str(port),
        "--webhook-bind", "127.0.0.1",
        "--webhook-cert-ips", "127.0.0.1",
        "--webhook-namespace", namespace,
        "--webhook-service", env["VGPU_DRA_WEBHOOK_SERVICE"],
        "--webhook-secret", env["VGPU_DRA_WEBHOOK_SECRET"],
        "--webhook-config-names", env["VGPU_DRA_WEBHOOK_CONFIG_NAMES"],
        # The bed stops a controller with SIGTERM and SIGKILLs it 5 s later (procs.stop_all);
        # one replica per bed, so the drain (2 s by default) would only delay every stop.
        "--webhook-drain", "0.5s",
    ]  # fmt: skip


def certificate_secret(namespace: str, release: str) -> JSON:
    """The chart's (empty) certificate Secret, which the controller fills: its RBAC may update
    that Secret but not create one."""
    (secret,) = chart.by_kind(render_chart({}, namespace=namespace, release=release), "Secret")
    return secret


def published_ca_bundle(cluster: Any, namespace: str, secret: str) -> bytes | None:
    """The CA bundle the controller keeps in its Secret (None before it wrote one)."""
    api_client = cluster.api_client()
    client = kube.KubeClient(api_client)
    try:
        data = client.get(kube.path("v1", "secrets", secret, namespace=namespace)).get("data")
    finally:
        api_client.close()
    bundle = (data or {}).get("ca-bundle.crt")
    return base64.b64decode(bundle) if bundle else None
