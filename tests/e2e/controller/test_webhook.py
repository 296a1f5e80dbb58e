"""The admission webhook on the real API server, served by a real controller process.

The controller runs as a subprocess with the chart's ServiceAccount, RBAC and (empty) certificate
Secret, rendered with helm and applied into a namespace of this module; it generates its CA and
serving certificate into that Secret and publishes the caBundle into the chart's webhook
configurations, which `vgpu_testbed.cluster.webhook.register_webhooks` registered exactly as the
chart renders them, called at https://127.0.0.1:<port>. The configurations are limited (chart
value `webhook.namespaceSelector`) to this module's tenant namespace, so other tests sharing the
session cluster never meet them.

Proves:
- for each legacy system (vgpu-manager, HAMi, gpu-manager, the device plugin whole and shared,
  vgpu-dra's own names) a pod created UNCHANGED comes back translated: legacy limits gone, one
  claim from a ResourceClaimTemplate that exists with the translated request, the policy gate
  when policy annotations ask for it; a device plugin MIG pod (`nvidia.com/mig-1g.10gb: 2`)
  reaches the webhook through the prefix in matchConditions and gets 2 MIG devices of that
  profile (translation only, no MIG node);
- a dry-run create is translated but creates no template; unused templates are collected while
  a template a live pod uses stays; the collector cannot delete a template that an admission
  touched after the collector judged it unused (the race);
- bad inputs are refused with their messages through the API server (percent memory, include and
  exclude of one type, unknown policy, a claim and a DeviceClass with a malformed VgpuConfig);
- `helm upgrade` keeps the caBundle and certificates the controller wrote (not in the manifest);
- certificate rotation (CA and serving certificate, lifetimes of seconds) during a stream of
  admissions loses none, and no key reaches the log;
- end to end on bed nodes (simulated GPUs, the kubelet plugin; real kubelet, containerd and runc
  where the host allows, else the kubelet stand-in):
  translated pods are allocated (the default path, or the policy path through this controller
  when annotations ask for it), prepared, and their vgpu.conf carries the caps (vgpu-number 1,
  vgpu-cores 10, vgpu-memory 1024 -> one GPU capped at 1 GiB and 10 %; HAMi's GPU type picks the
  A10 node; gpu-manager's soft limit becomes computePolicy balance);
- webhook down: a pod without GPU resources and a claim that only asks for our class are created
  as usual (matchConditions; the claims' capacity hook fails open), a legacy pod and a claim
  that configures our driver are refused (failurePolicy Fail).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from controller.webhook import legacy
from controller.webhook.legacy import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from controller.webhook.templates import TemplateCollector, TemplateEnsurer
from controller.webhook.translate import ClaimTemplate, Refusal, TranslationSettings, translate_pod
from dra_driver import kube
from dra_driver.allocator import parse_quantity
from dra_driver.allocator.request import RequestError, parse_claim
from dra_driver.kube import RESOURCE_API, KubeClient, KubeError
from tests.fixtures import legacy_pods
from tests.fixtures.chart import (
    CHART,
    by_kind,
    collection_path,
    helm,
    helm_binary,
    request_token,
    values_file,
)
from tests.fixtures.chart import token_kubeconfig as make_kubeconfig
from tests.fixtures.cluster import node_runtime
from tests.fixtures.workloads import REPO, deviceclass_exists, pod_claim, running_pod
from vgpu_testbed.cluster import webhook_client
from vgpu_testbed.cluster.flags import free_ports
from vgpu_testbed.cluster.webhook import register_webhooks, render_chart, unregister_webhooks
from vgpu_testbed.polling import wait_for
from vgpu_testbed.realnode.images import SHELL
from vgpu_testbed.realnode.node import start_nodes
from vgpu_testbed.standin.node_agents import NodeAgents

# Longer than the 60 s default: the module fixture renders the chart and starts the controller;
# the rotation test streams admissions across several rotations.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JSON = dict[str, Any]
GATE = "vgpu.dra.dev/policy"
LABEL = "vgpu-dra.test/webhook"
SHARED = {"nvidia.com/sharedgpu": 4, "nvidia.com/gpu.shared": 4}
SHARED_MEMORY = {"nvidia.com/sharedgpu": 4096}  # MiB per replica; gpu.shared has none
SETTINGS = TranslationSettings(shared_resources=SHARED, shared_memory_mib=SHARED_MEMORY)
LEGACY = (
    "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/vgpu-number",
    "nvidia.com/vgpu-cores", "nvidia.com/vgpu-memory", "nvidia.com/vcuda-core",
    "nvidia.com/vcuda-memory", "nvidia.com/sharedgpu",
)  # fmt: skip


def pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None,
        scheduler: str | None = None) -> JSON:  # fmt: skip
    obj: JSON = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "main", "image": SHELL, "imagePullPolicy": "Never",
                 "command": ["sleep", "3600"], "resources": {"limits": limits}}
            ]
        },
    }  # fmt: skip
    if annotations:
        obj["metadata"]["annotations"] = annotations
    if scheduler:
        obj["spec"]["schedulerName"] = scheduler
    return obj


@dataclass
class Controller:
    """One `vgpu-dra controller` process serving the webhook, with the chart's credentials."""

    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [*self.argv, *extra], stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


@dataclass
class Hook:
    client: KubeClient
    system_ns: str
    tenant: str
    secret: str
    config_name: str
    controller: Controller
    configs: list[JSON] = field(default_factory=list)

    def pods(self) -> str:
        return kube.path("v1", "pods", namespace=self.tenant)

    def template(self, name: str) -> JSON | None:
        try:
            return self.client.get(
                kube.path(RESOURCE_API, "resourceclaimtemplates", name, namespace=self.tenant)
            )
        except kube.NotFound:
            return None

    def published(self) -> bool:
        """Every webhook of both configurations carries the CA of the controller's Secret."""
        secret = self.client.get(kube.path("v1", "secrets", self.secret, namespace=self.system_ns))
        bundle = (secret.get("data") or {}).get("ca-bundle.crt")
        if not bundle:
            return False
        for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            config = self.client.get(
                kube.path("admissionregistration.k8s.io/v1", plural, self.config_name)
            )
            if any(h["clientConfig"].get("caBundle") != bundle for h in config["webhooks"]):
                return False
        return True


def _namespace(client: KubeClient, name: str, labels: dict[str, str] | None = None) -> None:
    client.create(
        kube.path("v1", "namespaces"),
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": name, "labels": labels or {}}},
    )  # fmt: skip
    wait_for(
        f"the default ServiceAccount of {name}",
        lambda: _exists(client, kube.path("v1", "serviceaccounts", "default", namespace=name)),
    )


def _exists(client: KubeClient, resource: str) -> bool:
    try:
        client.get(resource)
    except kube.NotFound:
        return False
    return True


@pytest.fixture(scope="module")
def hook(
    cluster: Any, client: KubeClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hook]:
    helm_binary()
    prefix = f"w{uuid.uuid4().hex[:5]}"
    system_ns, tenant = f"{prefix}-system", f"{prefix}-tenant"
    home = tmp_path_factory.mktemp("webhook")
    values = {
        "webhook": {
            "sharedResources": SHARED,
            "sharedResourceMemoryMiB": SHARED_MEMORY,
            "namespaceSelector": {"matchLabels": {LABEL: prefix}},
        }
    }
    docs = render_chart(values, namespace=system_ns, release=prefix)
    mine = [
        d
        for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                     "Secret")
        for d in by_kind(docs, kind)
        if d["metadata"]["labels"].get("app.kubernetes.io/component") in ("controller", "webhook")
    ]  # fmt: skip
    (secret,) = by_kind(mine, "Secret")
    (mutating,) = by_kind(docs, "MutatingWebhookConfiguration")
    (deploy,) = by_kind(docs, "Deployment")
    env = {
        e["name"]: e["value"] for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }  # fmt: skip
    _namespace(client, system_ns)
    _namespace(client, tenant, {LABEL: prefix})
    (port,) = free_ports(1)
    controller: Controller | None = None
    configs: list[JSON] = []
    try:
        for doc in mine:
            client.create(collection_path(doc, system_ns), doc)
        account = by_kind(mine, "ServiceAccount")[0]["metadata"]["name"]
        token = request_token(client, system_ns, account, None)
        kubeconfig = make_kubeconfig(
            home / "controller.kubeconfig", cluster.server, cluster.ca_cert, token
        )
        configs = register_webhooks(
            cluster, port, None, namespace=system_ns, release=prefix, values=values
        )
        controller = Controller(
            [
                sys.executable, "-m", "dra_driver.cli", "controller",
                "--kubeconfig", str(kubeconfig),
                "--health-address", "127.0.0.1:0",
                "--leader-elect", "--lease-namespace", system_ns, "--lease-duration", "3",
                "--webhook-port", str(port),
                "--webhook-bind", "127.0.0.1",
                "--webhook-cert-ips", "127.0.0.1",
                "--webhook-namespace", system_ns,
                "--webhook-service", env["VGPU_DRA_WEBHOOK_SERVICE"],
                "--webhook-secret", env["VGPU_DRA_WEBHOOK_SECRET"],
                "--webhook-config-names", env["VGPU_DRA_WEBHOOK_CONFIG_NAMES"],
                "--webhook-cert-sync", "0.5s",
                "--webhook-ca-propagation", "1s",
                "--webhook-template-grace", "4s",
                "--webhook-gc-interval", "1s",
                "--webhook-facts-interval", "1s",
                "--metrics-address", "127.0.0.1:0",
                "--shared-resource", env["VGPU_DRA_SHARED_RESOURCES"],
                "--shared-memory", env["VGPU_DRA_SHARED_MEMORY"],
                "--log-level", "debug",
            ],
            home / "controller.log",
        )  # fmt: skip
        controller.start()
        result = Hook(
            client, system_ns, tenant, secret["metadata"]["name"],
            mutating["metadata"]["name"], controller, configs,
        )  # fmt: skip
        wait_for(
            "the webhook serving",
            lambda: f"webhook on https://127.0.0.1:{port}" in controller.text(),
        )
        wait_for("the caBundle published", result.published)
        yield result
    finally:
        if controller is not None:
            controller.stop()
        unregister_webhooks(cluster, configs)
        client.request("DELETE", kube.path("v1", "pods", namespace=tenant),
                       query={"gracePeriodSeconds": 0})  # fmt: skip
        for ns in (tenant, system_ns):
            client.delete(kube.path("v1", "namespaces", ns))
        for doc in mine:
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                client.delete(collection_path(doc, system_ns) + "/" + doc["metadata"]["name"])


# ---------------------------------------------------------------- translation per system

# name -> (pod as its system's README writes it, expected `exactly` of the template's request,
# gate expected)
EXAMPLES: dict[str, tuple[JSON, JSON, bool]] = {
    "vgpu-manager": (
        pod("vgpu-manager",
            {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "10",
             "nvidia.com/vgpu-memory": "1024"},
            {"nvidia.com/node-scheduler-policy": "binpack"}, scheduler="vgpu-scheduler"),
        {"count": 1, "capacity": {"requests": {"memory": "1024Mi", "cores": "10"}}},
        True,
    ),
    "hami": (
        pod("hami", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000",
                     "nvidia.com/gpucores": "30"},
            {"nvidia.com/use-gputype": "A100"}),
        {"count": 1, "capacity": {"requests": {"memory": "3000Mi", "cores": "30"}},
         "selectors": [{"cel": {"expression":
             'device.attributes["vgpu.dra.dev"].productName.matches("(?i)(A100)")'}}]},
        False,
    ),
    "gpu-manager": (
        pod("gpu-manager", {"nvidia.com/vcuda-core": "50", "nvidia.com/vcuda-memory": "2048"}),
        {"count": 1, "capacity": {"requests": {"memory": "2048Mi", "cores": "50"}}},
        False,
    ),
    "device-plugin": (
        pod("device-plugin", {"nvidia.com/gpu": "2"}),
        {"count": 2},
        False,
    ),
    "device-plugin-shared": (
        pod("device-plugin-shared", {"nvidia.com/sharedgpu": "1"}),
        {"count": 1, "capacity": {"requests": {"cores": "25", "memory": "4096Mi"}}},
        False,
    ),
    "vgpu-dra": (
        pod("vgpu-dra", {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "2048"},
            {"vgpu.dra.dev/device-policy": "spread"}),
        {"count": 1, "capacity": {"requests": {"memory": "2048Mi"}}},
        True,
    ),
}  # fmt: skip


def _quantities(exactly: JSON) -> JSON:
    """Capacity requests as numbers (the API server canonicalises quantity strings)."""
    out = dict(exactly)
    if "capacity" in out:
        requests = out["capacity"]["requests"]
        out["capacity"] = {k: parse_quantity(str(v)) for k, v in requests.items()}
    return out


@pytest.mark.parametrize("system", sorted(EXAMPLES))
def test_a_legacy_pod_is_created_unchanged_and_comes_back_translated(
    hook: Hook, system: str
) -> None:
    legacy_pod, exactly, gated = EXAMPLES[system]
    created = hook.client.create(hook.pods(), legacy_pod)
    (container,) = created["spec"]["containers"]
    resources = container.get("resources") or {}
    for where in ("limits", "requests"):
        assert not set(resources.get(where) or {}) & set(LEGACY), resources
    (claim_ref,) = resources["claims"]
    (pod_claim,) = created["spec"]["resourceClaims"]
    assert pod_claim["name"] == claim_ref["name"]
    template = hook.template(pod_claim["resourceClaimTemplateName"])
    assert template is not None, "the webhook did not create the template"
    assert template["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY_VALUE
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    got = {k: request["exactly"].get(k) for k in exactly}
    assert _quantities(got) == _quantities(exactly)  # the server writes 2048Mi as 2Gi
    assert request["exactly"]["deviceClassName"] == "vgpu.dra.dev"
    gates = [g["name"] for g in created["spec"].get("schedulingGates") or []]
    assert (GATE in gates) == gated
    assert created["spec"]["schedulerName"] == "default-scheduler"
    # The source is the system of the resources (vgpu-dra names only annotations).
    source = {"device-plugin-shared": "device-plugin", "vgpu-dra": "vgpu-manager"}
    assert created["metadata"]["annotations"]["vgpu.dra.dev/translated-from"] == (
        source.get(system, system)
    )


@pytest.mark.parametrize("name", legacy_pods.names())
def test_every_readme_example_pod_is_admitted_as_the_translation_says(
    hook: Hook, name: str
) -> None:
    """The source systems' documented example pods (tests/fixtures/legacy_pods), created as
    written: the stored pod is the pod with the translation's patch applied (so the API server
    applied exactly our patch), its templates exist; a refused one carries the refusal."""
    legacy = legacy_pods.load(name)
    legacy["metadata"].pop("namespace", None)
    legacy["metadata"]["name"] = f"readme-{name}"
    try:
        translation = translate_pod(legacy, SETTINGS)
    except Refusal as refusal:
        with pytest.raises(KubeError) as refused:
            hook.client.create(hook.pods(), legacy)
        assert str(refusal) in refused.value.message
        return
    assert translation is not None
    expected = jsonpatch.apply_patch(legacy, translation.patch)
    created = hook.client.create(hook.pods(), legacy)
    for key in ("resourceClaims", "schedulingGates", "schedulerName"):
        assert created["spec"].get(key) == expected["spec"].get(key, created["spec"].get(key)), key
    annotations = created["metadata"].get("annotations") or {}
    assert expected["metadata"].get("annotations", {}).items() <= annotations.items()
    for field_name in ("initContainers", "containers"):
        for got, want in zip(
            created["spec"].get(field_name) or [],
            expected["spec"].get(field_name) or [],
            strict=True,
        ):
            resources, wanted = got.get("resources") or {}, want.get("resources") or {}
            assert resources.get("claims") == wanted.get("claims")
            limits = set(wanted.get("limits") or {})
            assert set(resources.get("limits") or {}) == limits
            # The API server defaults requests from limits before admission; none legacy.
            requests = set(resources.get("requests") or {})
            assert (
                set(wanted.get("requests") or {})
                <= requests
                <= limits | set(wanted.get("requests") or {})
            )
    for template in translation.templates:
        assert hook.template(template.name) is not None, template.name


def test_a_device_plugin_mig_pod_is_admitted_with_a_claim_of_its_profile(hook: Hook) -> None:
    """The mixed strategy's `nvidia.com/mig-1g.10gb: 2` (issue 26, item 4): the real API server's
    matchConditions route it by the `nvidia.com/mig-` prefix, and the pod comes back without the
    extended resource and with a template of 2 MIG devices of profile 1g.10gb, whose CEL (with
    its `has()` guard) the API server accepted. Translation only: no MIG node is needed."""
    resource = f"{legacy.MIG_RESOURCE_PREFIX}1g.10gb"
    name = f"mig-{uuid.uuid4().hex[:6]}"
    created = hook.client.create(hook.pods(), pod(name, {resource: "2", "cpu": "100m"}))
    (container,) = created["spec"]["containers"]
    resources = container.get("resources") or {}
    assert resources["limits"] == {"cpu": "100m"}
    assert resource not in (resources.get("requests") or {})
    (claim_ref,) = resources["claims"]
    (pod_claim,) = created["spec"]["resourceClaims"]
    assert pod_claim["name"] == claim_ref["name"]
    template = hook.template(pod_claim["resourceClaimTemplateName"])
    assert template is not None, "the webhook did not create the template"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    attribute = 'device.attributes["vgpu.dra.dev"].profile'
    assert request["exactly"]["count"] == 2
    assert request["exactly"]["selectors"] == [
        {"cel": {"expression": f'has({attribute}) && {attribute} == "1g.10gb"'}}
    ]
    assert created["metadata"]["annotations"][legacy.TRANSLATED_FROM] == "device-plugin"


def test_the_compute_policy_of_gpu_manager_reaches_the_template(hook: Hook) -> None:
    created = hook.client.create(
        hook.pods(),
        pod("gm-hard", {"nvidia.com/vcuda-core": "30", "nvidia.com/vcuda-memory": "512"},
            {"nvidia.com/vcuda-core-limit": "30"}),
    )  # fmt: skip
    template = hook.template(created["spec"]["resourceClaims"][0]["resourceClaimTemplateName"])
    assert template is not None
    (config,) = template["spec"]["spec"]["devices"]["config"]
    assert config["opaque"]["parameters"]["computePolicy"] == "fixed"


def test_the_webhooks_histogram_is_on_the_controllers_metrics_endpoint(hook: Hook) -> None:
    """With --metrics-address the webhook registers on the controller's registry: one scrape."""
    hook.client.create(hook.pods(), pod("scraped", {"nvidia.com/gpu": "1"}))
    match = re.search(r"metrics on (http://[\d.]+:\d+/metrics)", hook.controller.text())
    assert match is not None
    url = match.group(1)

    def scraped_with_the_admission() -> str | None:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text: str = answer.read().decode()
        counts = re.findall(
            r'vgpu_dra_webhook_admission_duration_seconds_count\{decision="patched",'
            r'operation="mutate"\} ([\d.]+)',
            text,
        )
        return text if counts and float(counts[0]) >= 1 else None

    # The webhook observes an admission after its answer is written (the duration includes the
    # write), so the pod may exist a moment before the histogram counts it.
    text = wait_for("the admission in the controller's scrape", scraped_with_the_admission, 20)
    assert "vgpu_dra_controller_" in text  # the controller's own families, same endpoint


# ---------------------------------------------------------------- dry run and collection


def test_a_dry_run_is_translated_but_creates_no_template(hook: Hook) -> None:
    shape = pod("dry", {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1234"})
    echo = hook.client.request("POST", hook.pods(), body=shape, query={"dryRun": "All"})
    (pod_claim,) = echo["spec"]["resourceClaims"]
    assert hook.template(pod_claim["resourceClaimTemplateName"]) is None
    assert not _exists(hook.client, kube.path("v1", "pods", "dry", namespace=hook.tenant))
    # The same pod for real: now the template exists, under the same name.
    created = hook.client.create(hook.pods(), shape)
    assert created["spec"]["resourceClaims"] == [pod_claim]
    assert hook.template(pod_claim["resourceClaimTemplateName"]) is not None


def test_unused_templates_are_collected_and_used_ones_stay(hook: Hook) -> None:
    kept = hook.client.create(
        hook.pods(),
        pod("gc-kept", {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1501"}),
    )
    gone = hook.client.create(
        hook.pods(),
        pod("gc-gone", {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1502"}),
    )
    kept_name = kept["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    gone_name = gone["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    assert hook.template(gone_name) is not None
    hook.client.request(
        "DELETE", kube.path("v1", "pods", "gc-gone", namespace=hook.tenant),
        query={"gracePeriodSeconds": 0},
    )  # fmt: skip
    wait_for("the unused template collected", lambda: hook.template(gone_name) is None, timeout=60)
    # Well past the 4 s grace: the template of the live pod is still there.
    assert hook.template(kept_name) is not None
    assert "deleted unused ResourceClaimTemplate" in hook.controller.text()


def test_an_admission_touching_a_template_wins_over_the_collector(
    hook: Hook, client: KubeClient
) -> None:
    """The race, step by step with the real classes: the collector judges a template unused,
    an admission then ensures it (touch: new resourceVersion), the collector's delete fails its
    precondition. Without the touch the same delete succeeds."""
    template = ClaimTemplate(
        name=f"vgpu-race{uuid.uuid4().hex[:15]}",
        # With opaque parameters: a touch must not re-encode them (an immutable spec whose raw
        # JSON changed byte-wise is refused).
        spec={"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.dra.dev"}}],
            "config": [{"requests": ["gpu"], "opaque": _vgpu_config(computePolicy="balance")}]}}},
        labels={MANAGED_BY_LABEL: MANAGED_BY_VALUE, "race": hook.tenant},
    )  # fmt: skip
    collector = TemplateCollector(client, f"race={hook.tenant}", grace_s=0)
    TemplateEnsurer(client, grace_s=600).ensure(hook.tenant, [template])
    (judged,) = collector.candidates()  # grace 0, no pod uses it: a candidate
    # An admission on another replica (fresh cache) ensures it meanwhile.
    TemplateEnsurer(client, grace_s=600).ensure(hook.tenant, [template])
    assert collector.delete([judged]) == []
    assert hook.template(template.name) is not None
    # Judged again and left alone: deleted.
    (judged,) = collector.candidates()
    assert collector.delete([judged]) == [(hook.tenant, template.name)]
    assert hook.template(template.name) is None
    # An ensure after the delete creates it again (the touch finds nothing, creates).
    TemplateEnsurer(client, grace_s=600).ensure(hook.tenant, [template])
    assert hook.template(template.name) is not None


# ---------------------------------------------------------------- two replicas


class Relay:
    """A TCP relay on loopback in front of the webhook replicas, standing in for the Service
    (the bed's API server cannot reach Services): each new connection goes to the next replica
    that accepts it; a stopped replica refuses, as an endpoint that left the Service. TLS
    passes through untouched, so the API server verifies each replica's certificate itself."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.pinned: int | None = None
        self.connections = {port: 0 for port in ports}
        self._open: list[tuple[int, socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._next = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="relay", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._connect, args=(downstream,), daemon=True).start()

    def _connect(self, downstream: socket.socket) -> None:
        with self._lock:
            self._next += 1
            order = self.ports[self._next % 2 :] + self.ports[: self._next % 2]
            if self.pinned is not None:
                order = [self.pinned]
        for port in order:
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                continue
            upstream.settimeout(None)
            with self._lock:
                self.connections[port] += 1
                self._open.append((port, downstream, upstream))
            for a, b in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()
            return
        downstream.close()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def pin(self, port: int) -> None:
        """Only `port` from now on; open connections to the others are closed (idle ones: the
        API server reconnects, through the relay, to `port`)."""
        with self._lock:
            self.pinned = port
            others = [(d, u) for p, d, u in self._open if p != port]
        for pair in others:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._listener.close()
        self._thread.join(timeout=5)
        self.pin(-1)  # every relayed connection ends, and its two threads


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _replaced(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def _point_configs(hook: Hook, port: int) -> None:
    """Every webhook of both configurations called at https://127.0.0.1:<port> (same paths)."""
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        resource = kube.path("admissionregistration.k8s.io/v1", plural, hook.config_name)
        config = hook.client.get(resource)
        for webhook in config["webhooks"]:
            url = webhook["clientConfig"]["url"]
            webhook["clientConfig"]["url"] = re.sub(r":\d+/", f":{port}/", url, count=1)
        hook.client.request("PUT", resource, body=config)


def _admissions(controller: Controller) -> int:
    return controller.text().count("admission mutate Pod")


def _serving_lines(controller: Controller, port: int) -> int:
    return controller.text().count(f"webhook on https://127.0.0.1:{port}")


class Stream:
    """Legacy pods admitted one after the other from a thread (dry run: admitted and translated,
    nothing stored) until stopped; every refusal is kept."""

    def __init__(self, hook: Hook) -> None:
        self.hook = hook
        self.admitted = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        shape = pod("stream", {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1300"})
        while not self._stop.is_set():
            try:
                self.hook.client.request(
                    "POST", self.hook.pods(), body=shape, query={"dryRun": "All"}
                )
                self.admitted += 1
            except KubeError as exc:
                self.failures.append(exc.message or str(exc))
            time.sleep(0.05)  # pacing: a steady stream, not a flood

    def until(self, what: str, done: Any, timeout: float = 60) -> None:
        wait_for(what, done, timeout=timeout)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_two_replicas_admit_while_either_is_stopped_and_gc_spares_the_others_templates(
    hook: Hook, client: KubeClient, tmp_path: Path
) -> None:
    """Two more controller replicas, B and C (same Secret, Lease and configurations as the
    module's), behind one relay: a stream of admissions loses
    none while B stops (SIGTERM: it drains) and comes back, and then while C does. Then
    admissions go to a replica that does not lead only, and the leader's template collection
    leaves the template they keep using alone (touch stamps on the object, not the admitting
    replica's memory), while it collects another unused one meanwhile, and collects this one
    too once the admissions stop."""
    a = hook.controller
    port_a = int(_flag(a.argv, "--webhook-port"))
    port_b, port_c = free_ports(2)
    b = Controller(_replaced(a.argv, "--webhook-port", str(port_b)), tmp_path / "replica-b.log")
    c = Controller(_replaced(a.argv, "--webhook-port", str(port_c)), tmp_path / "replica-c.log")
    relay = Relay([port_b, port_c])
    stream: Stream | None = None
    try:
        for replica, port in ((b, port_b), (c, port_c)):
            replica.start()
            wait_for("a replica serving", lambda: _serving_lines(replica, port) == 1)  # noqa: B023
        _point_configs(hook, relay.port)
        stream = Stream(hook)
        stream.until("admissions through the relay", lambda: stream.admitted >= 10)
        _stop_and_start(stream, b, port_b, c)
        _stop_and_start(stream, c, port_c, b)
        stream.until("admissions after both came back", lambda: stream.admitted >= 60)
        stream.stop()
        assert stream.failures == []
        assert min(relay.connections.values()) > 0  # each replica served through the relay
        # Which replica leads: the Lease names one of the identities the three logged.
        lease = client.get(kube.path("coordination.k8s.io/v1", "leases", "vgpu-dra-controller",
                                     namespace=hook.system_ns))  # fmt: skip
        holder = lease["spec"]["holderIdentity"]
        (leader,) = [r for r in (a, b, c) if holder in r.text()]
        follower, follower_port = (c, port_c) if leader is b else (b, port_b)
        relay.pin(follower_port)
        follower_before = _admissions(follower)
        admitted = _keep_using_while_the_leader_collects(hook)
        assert _admissions(follower) - follower_before >= admitted  # the follower admitted all
        assert "deleted unused ResourceClaimTemplate" in leader.text()
    finally:
        if stream is not None:
            stream.stop()
        _point_configs(hook, port_a)
        relay.close()
        b.stop()
        c.stop()


def _stop_and_start(stream: Stream, stopped: Controller, port: int, other: Controller) -> None:
    """Stop a replica while the stream runs, let the other admit alone, start it again."""
    served_before = _serving_lines(stopped, port)
    seen = _admissions(other)
    stopped.stop()  # SIGTERM: it drains (answers, closing each connection after), then exits
    stream.until("admissions by the other replica alone", lambda: _admissions(other) >= seen + 20)
    stopped.start()
    wait_for("the replica serving again", lambda: (
        _serving_lines(stopped, port) == served_before + 1))  # fmt: skip


def _keep_using_while_the_leader_collects(hook: Hook) -> int:
    """Pods of one shape, each deleted at once (only touches protect its template), admitted
    until the leader has collected another unused template and for one grace period (4 s)
    more: the template is never deleted meanwhile (same uid), and is collected once unused.
    Returns how many pods were admitted."""
    used = pod("gc-used", {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1777"})
    other = pod("gc-other", {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1778"})

    def create_and_delete(shape: JSON, name: str) -> str:
        created = hook.client.create(hook.pods(), {**shape, "metadata": {"name": name}})
        hook.client.request("DELETE", kube.path("v1", "pods", name, namespace=hook.tenant),
                            query={"gracePeriodSeconds": 0})  # fmt: skip
        return str(created["spec"]["resourceClaims"][0]["resourceClaimTemplateName"])

    other_name = create_and_delete(other, "gc-other-0")
    used_name = create_and_delete(used, "gc-used-0")
    first = hook.template(used_name)
    assert first is not None
    uid = first["metadata"]["uid"]
    n = 1
    other_gone_at: float | None = None
    while other_gone_at is None or time.monotonic() - other_gone_at < 4.0:
        assert create_and_delete(used, f"gc-used-{n}") == used_name
        current = hook.template(used_name)
        assert current is not None and current["metadata"]["uid"] == uid
        if other_gone_at is None and hook.template(other_name) is None:
            other_gone_at = time.monotonic()
        n += 1
        assert n < 400, "the leader never collected the other template"
        time.sleep(0.3)  # pacing of the pods that keep using the template
    wait_for("the template collected once unused", lambda: hook.template(used_name) is None)
    return n + 1


def test_a_webhook_requiring_the_api_servers_client_certificate(
    hook: Hook, cluster: Any, tmp_path: Path
) -> None:
    """A second replica with --webhook-client-ca: the bed's API server presents a certificate
    signed by that CA (vgpu_testbed.cluster.webhook_client), so admissions pass; a client
    without it is refused during the handshake, before any request is read."""
    (port,) = free_ports(1)
    ca = webhook_client.client_ca(cluster.layout.pki)
    alone = Controller([*_replaced(hook.controller.argv, "--webhook-port", str(port)),
                        "--webhook-client-ca", str(ca)], tmp_path / "webhook.log")  # fmt: skip
    try:
        alone.start()
        wait_for("the webhook serving", lambda: _serving_lines(alone, port) == 1)
        _point_configs(hook, port)
        shape = pod("client-cert", {"nvidia.com/vgpu-number": "1"})
        # Admitted by it once the API server calls the new address (the controller still
        # serves the old one meanwhile).
        wait_for("an admission by the webhook alone", lambda: (
            _dry_run(hook, shape) is not None and _admissions(alone) >= 1))  # fmt: skip
        echo = _dry_run(hook, shape)
        assert echo is not None and echo["spec"]["resourceClaims"]
        secret = hook.client.get(kube.path("v1", "secrets", hook.secret, namespace=hook.system_ns))
        context = ssl.create_default_context(
            cadata=base64.b64decode(secret["data"]["ca-bundle.crt"]).decode()
        )
        stranger = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            stranger.request("GET", "/healthz")
            stranger.getresponse()
        stranger.close()
    finally:
        _point_configs(hook, int(_flag(hook.controller.argv, "--webhook-port")))
        alone.stop()


def _dry_run(hook: Hook, shape: JSON) -> JSON | None:
    """The admitted pod of a dry-run create; None when refused."""
    try:
        return hook.client.request("POST", hook.pods(), body=shape, query={"dryRun": "All"})
    except KubeError:
        return None


# ---------------------------------------------------------------- bad inputs


BAD_PODS = {
    "percent-and-absolute-memory": pod(
        "pct", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
        {"vgpu.dra.dev/memory-percentage": "50"},
    ),
    "include-and-exclude": pod(
        "inex", {"nvidia.com/vgpu-number": "1"},
        {"nvidia.com/include-gpu-type": "A100", "nvidia.com/exclude-gpu-type": "A100"},
    ),
    "unknown-policy": pod(
        "pol", {"nvidia.com/vgpu-number": "1"}, {"nvidia.com/node-scheduler-policy": "fastest"}
    ),
}  # fmt: skip
BAD_POD_WORDS = {
    "percent-and-absolute-memory": (
        "GPU memory 1000 MiB",
        "vgpu.dra.dev/memory-percentage=50",
        "cannot be used together",
    ),
    "include-and-exclude": ("include-gpu-type", "exclude-gpu-type", "remove it from one"),
    "unknown-policy": ("node-scheduler-policy='fastest'", "allowed values are binpack, spread"),
}


@pytest.mark.parametrize("case", sorted(BAD_PODS))
def test_a_bad_pod_is_refused_with_its_message(hook: Hook, case: str) -> None:
    with pytest.raises(Refusal) as refusal:
        translate_pod(BAD_PODS[case], SETTINGS)
    with pytest.raises(KubeError) as refused:
        hook.client.create(hook.pods(), BAD_PODS[case])
    assert refused.value.status == 400
    assert str(refusal.value) in refused.value.message  # the translation's words, unaltered
    for word in BAD_POD_WORDS[case]:
        assert word in refused.value.message


def _vgpu_config(**fields: str) -> JSON:
    parameters = {"apiVersion": "vgpu.dra.dev/v1alpha1", "kind": "VgpuConfig", **fields}
    return {"driver": "vgpu.dra.dev", "parameters": parameters}


def test_a_claim_and_a_device_class_with_a_malformed_config_are_refused(
    hook: Hook, client: KubeClient
) -> None:
    claim = {
        "apiVersion": RESOURCE_API, "kind": "ResourceClaim", "metadata": {"name": "turbo"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.dra.dev"}}],
            "config": [{"requests": ["gpu"], "opaque": _vgpu_config(computePolicy="turbo")}]}},
    }  # fmt: skip
    with pytest.raises(KubeError) as refused:
        client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=hook.tenant), claim)
    assert refused.value.status == 422
    assert "spec.devices.config[0].opaque.parameters" in refused.value.message
    assert "field 'computePolicy' has invalid value 'turbo'; allowed: fixed|balance|none" in (
        refused.value.message
    )
    claim["spec"]["devices"]["config"][0]["opaque"] = _vgpu_config(computePolicy="balance")
    client.create(kube.path(RESOURCE_API, "resourceclaims", namespace=hook.tenant), claim)
    name = f"{hook.tenant}-bad-class"
    device_class = {
        "apiVersion": RESOURCE_API, "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"config": [{"opaque": _vgpu_config(memoryLimit="lots")}]},
    }  # fmt: skip
    try:
        with pytest.raises(KubeError) as refused:
            client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class)
        assert "unknown field 'memoryLimit'" in refused.value.message
        assert "known fields: apiVersion, kind, computePolicy" in refused.value.message
    finally:
        client.delete(kube.path(RESOURCE_API, "deviceclasses", name))


# ---------------------------------------------------------------- hostile input (issue 27)


def _refused(hook: Hook, obj: JSON) -> KubeError:
    with pytest.raises(KubeError) as refused:
        hook.client.create(hook.pods(), obj)
    return refused.value


def test_a_100_kib_gpu_type_list_is_a_clear_refusal_not_a_500(hook: Hook) -> None:
    """The issue's pod: before, the translated CEL selector (over the API's 10 KiB) made the
    template's create fail and the webhook answer 500."""
    legacy = pod("long-type", {"nvidia.com/gpu": "1"}, {"nvidia.com/use-gputype": "A" * 102400})
    refused = _refused(hook, legacy)
    assert refused.status == 400, refused
    assert "annotation nvidia.com/use-gputype: 102400 bytes" in refused.message
    assert "at most 10240 bytes and 256 items" in refused.message


def test_a_translated_selector_is_held_to_the_api_servers_own_limit(hook: Hook) -> None:
    """A list within our bounds whose selector exceeds 10 KiB is refused by name; one whose
    selector is exactly 10240 bytes is admitted, and the API server takes its template: our
    limit is the API server's."""
    dotted = ",".join(f"{i}{'a.' * 20}"[:39] for i in range(200))  # each dot becomes `[.]`
    refused = _refused(hook, pod("dotted", {"nvidia.com/gpu": "1"},
                                 {"nvidia.com/use-gputype": dotted}))  # fmt: skip
    assert refused.status == 400, refused
    assert "annotation nvidia.com/use-gputype: its 200 GPU types become a CEL selector of" in (
        refused.message
    )
    assert "above the API's limit of 10240 bytes per selector expression" in refused.message
    prefix = 'device.attributes["vgpu.dra.dev"].productName.matches("(?i)('
    room = 10240 - len(prefix) - len(')")')
    types = ",".join(["A" * 99] * (room // 100) + ["B" * (room % 100)])
    created = hook.client.create(
        hook.pods(), pod("edge", {"nvidia.com/gpu": "1"}, {"nvidia.com/use-gputype": types})
    )
    template = hook.template(created["spec"]["resourceClaims"][0]["resourceClaimTemplateName"])
    assert template is not None
    (selector,) = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert len(selector["cel"]["expression"]) == 10240


@pytest.mark.parametrize(
    "limits",
    [{"nvidia.com/gpu": "0"}, {"nvidia.com/vgpu-number": "0"}, {"nvidia.com/vcuda-core": "0"}],
    ids=["device-plugin", "vgpu-manager", "gpu-manager"],
)
def test_a_zero_gpu_pod_is_admitted_with_no_claim(hook: Hook, limits: dict[str, str]) -> None:
    """`nvidia.com/gpu: 0` (and the other systems' zero): the container gets no GPU, as each
    system gives it none: no claim, no template, the legacy resource gone."""
    name = f"zero-{uuid.uuid4().hex[:6]}"
    created = hook.client.create(hook.pods(), pod(name, {**limits, "cpu": "100m"}))
    assert not created["spec"].get("resourceClaims")
    (container,) = created["spec"]["containers"]
    resources = container.get("resources") or {}
    assert "claims" not in resources
    for where in ("limits", "requests"):
        assert not set(resources.get(where) or {}) & set(LEGACY), resources
    assert resources["limits"] == {"cpu": "100m"}
    assert GATE not in [g["name"] for g in created["spec"].get("schedulingGates") or []]
    system = legacy.RESOURCES[next(iter(limits))]
    assert created["metadata"]["annotations"][legacy.TRANSLATED_FROM] == system
    stored = hook.client.get(kube.path("v1", "pods", name, namespace=hook.tenant))
    assert not stored["spec"].get("resourceClaims")
    assert not (stored.get("status") or {}).get("resourceClaimStatuses")


def test_a_count_of_zero_is_one_device_as_the_api_defaults_it(
    hook: Hook, client: KubeClient
) -> None:
    """`count: 0` in an ExactCount request: the API server stores 1 (its defaulting), which is
    what kube-scheduler allocates and what the allocation controller reads; a negative count is
    refused by the API server; the allocation controller's parser refuses any 0 it could still
    meet (unit tests)."""
    claims = kube.path(RESOURCE_API, "resourceclaims", namespace=hook.tenant)

    def claim(name: str, count: int) -> JSON:
        return {
            "apiVersion": RESOURCE_API, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "vgpu.dra.dev", "allocationMode": "ExactCount",
                "count": count}}]}},
        }  # fmt: skip

    stored = client.create(claims, claim("count-zero", 0))
    assert stored["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    classes = {"vgpu.dra.dev": {"metadata": {"name": "vgpu.dra.dev"}, "spec": {}}}
    (request,) = parse_claim(stored, classes).requests
    assert request.alternatives[0].count == 1 and not request.alternatives[0].all_devices
    with pytest.raises(KubeError) as refused:
        client.create(claims, claim("count-negative", -1))
    assert refused.value.status == 422
    assert "must be greater than zero" in refused.value.message
    bypassed = claim("count-zero-bypassed", 0)  # as if the API had not defaulted it
    with pytest.raises(RequestError, match="count 0: an ExactCount request needs at least 1"):
        parse_claim(bypassed, classes)


def test_a_vgpu_config_nested_too_deeply_is_refused_by_name(hook: Hook, client: KubeClient) -> None:
    """The API server takes a config nesting 3,000 levels (6 KB, within its 10 KiB); before, the
    AdmissionReview carrying it could not be decoded (a 400, so the API server's 'failed
    calling webhook'); now the webhook answers, refusing the VgpuConfig by name."""
    nested: Any = 1
    for _ in range(3000):
        nested = [nested]
    claim = {
        "apiVersion": RESOURCE_API, "kind": "ResourceClaim", "metadata": {"name": "deep"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.dra.dev"}}],
            "config": [{"requests": ["gpu"], "opaque": _vgpu_config()}]}},
    }  # fmt: skip
    claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["x"] = "__DEEP__"
    text = json.dumps(claim).replace('"__DEEP__"', "[" * 3000 + "1" + "]" * 3000)
    claims = kube.path(RESOURCE_API, "resourceclaims", namespace=hook.tenant)
    with pytest.raises(KubeError) as refused:
        # As text (JSON is YAML): the client's own encoder would refuse the depth.
        client.request("POST", claims, body=text, content_type="application/yaml")  # type: ignore[arg-type]
    assert refused.value.status == 422, refused.value
    assert "spec.devices.config[0].opaque.parameters: nested too deeply" in refused.value.message


# ---------------------------------------------------------------- end to end on bed nodes


@pytest.fixture(scope="module")
def nodes(cluster: Any, client: KubeClient, hook: Hook) -> Iterator[dict[str, NodeAgents]]:
    """node-1 (dgx-h100) and node-2 (a10-pcie) with their kubelet plugin, run for real where
    the host allows (`node_runtime`), and the repo's DeviceClass; all removed afterwards (as
    tests/e2e/kubelet_plugin does)."""
    device_class = yaml.safe_load((REPO / "deploy" / "deviceclass.yaml").read_text())
    name = device_class["metadata"]["name"]
    client.delete(kube.path(RESOURCE_API, "deviceclasses", name))  # a leftover of another module
    wait_for("an old DeviceClass to go", lambda: not deviceclass_exists(client, name))
    client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class)
    started = start_nodes(cluster, ["node-1", "node-2"], runtime=node_runtime())
    try:
        yield started
    finally:
        for node_agents in started.values():
            try:
                node_agents.drain()
            finally:
                node_agents.stop()
        for obj in client.list(
            kube.path(RESOURCE_API, "resourceslices"), field_selector="spec.driver=vgpu.dra.dev"
        ):
            client.delete(kube.path(RESOURCE_API, "resourceslices", obj["metadata"]["name"]))
        client.delete(kube.path(RESOURCE_API, "deviceclasses", name))


def vgpu_conf(node_agents: NodeAgents, claim_uid: str) -> list[dict[str, str]]:
    text = (node_agents.paths.claim_dir(claim_uid) / "vgpu.conf").read_text()
    return [
        dict(token.split("=", 1) for token in line.split()[1:])
        for line in text.splitlines()
        if line.startswith("device ")
    ]


# name -> (legacy pod, node it must land on or None, (memory bytes, cores, policy) in vgpu.conf)
ON_NODES: dict[str, tuple[JSON, str | None, tuple[int, str, str]]] = {
    # The acceptance: one GPU capped at 1 GiB and 10 %, default path.
    "vgpu-manager": (
        pod("n-vgpu-manager", {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "10",
                               "nvidia.com/vgpu-memory": "1024"}),
        None, (1 << 30, "10", "fixed"),
    ),
    # The same with a scheduling policy and vgpu-scheduler: gated, placed by the controller.
    "vgpu-manager-policy": (
        pod("n-vgpu-manager-policy",
            {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "10",
             "nvidia.com/vgpu-memory": "1024"},
            {"nvidia.com/node-scheduler-policy": "binpack"}, scheduler="vgpu-scheduler"),
        None, (1 << 30, "10", "fixed"),
    ),
    # HAMi asking for an A10: only node-2 has one.
    "hami": (
        pod("n-hami", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000",
                       "nvidia.com/gpucores": "30"}, {"nvidia.com/use-gputype": "A10"}),
        "node-2", (3000 << 20, "30", "fixed"),
    ),
    # gpu-manager without a hard limit annotation: a soft (balance) cap.
    "gpu-manager": (
        pod("n-gpu-manager", {"nvidia.com/vcuda-core": "50", "nvidia.com/vcuda-memory": "2048"}),
        None, (2048 << 20, "50", "balance"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ON_NODES))
def test_a_translated_pod_is_allocated_prepared_and_capped(
    hook: Hook, client: KubeClient, nodes: dict[str, NodeAgents], case: str
) -> None:
    legacy_pod, node, (memory, cores, policy) = ON_NODES[case]
    hook.client.create(hook.pods(), legacy_pod)
    running = running_pod(client, hook.tenant, legacy_pod["metadata"]["name"])
    assert node is None or running["spec"]["nodeName"] == node
    claim = pod_claim(client, running)
    node_agents = nodes[running["spec"]["nodeName"]]
    uid = claim["metadata"]["uid"]
    assert node_agents.paths.cdi_spec(uid).is_file()
    (device,) = vgpu_conf(node_agents, uid)
    assert (int(device["memory"]), device["cores"], device["policy"]) == (memory, cores, policy)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"]["memory"] and result["driver"] == "vgpu.dra.dev"


def test_a_hami_memory_percentage_caps_at_that_share_of_the_chosen_gpu(
    hook: Hook, client: KubeClient, nodes: dict[str, NodeAgents]
) -> None:
    """`nvidia.com/gpumem-percentage: 50`: the claim carries vgpu.dra.dev/memory-percentage, the
    gate sends the pod to the allocation controller, which gives it half of the memory of the
    GPU it chose (rounded up by the device's request policy); vgpu.conf caps exactly that."""
    legacy_pod = pod("n-hami-percent", {"nvidia.com/gpu": "1",
                                        "nvidia.com/gpumem-percentage": "50"})  # fmt: skip
    created = hook.client.create(hook.pods(), legacy_pod)
    assert {"name": GATE} in created["spec"]["schedulingGates"]
    running = running_pod(client, hook.tenant, "n-hami-percent")
    claim = pod_claim(client, running)
    assert claim["metadata"]["annotations"]["vgpu.dra.dev/memory-percentage"] == "50"
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    (device,) = [
        d
        for s in client.list(kube.path(RESOURCE_API, "resourceslices"),
                             field_selector=f"spec.nodeName={running['spec']['nodeName']}")
        for d in s["spec"]["devices"]
        if s["spec"]["driver"] == "vgpu.dra.dev" and s["spec"]["pool"]["name"] == result["pool"]
        and d["name"] == result["device"]
    ]  # fmt: skip
    memory = device["capacity"]["memory"]
    total = parse_quantity(memory["value"])
    step = parse_quantity(
        ((memory.get("requestPolicy") or {}).get("validRange") or {}).get("step") or "1"
    )
    granted = parse_quantity(result["consumedCapacity"]["memory"])
    half = -(-total // 2)
    assert half <= granted < half + step, (total, step, granted)
    node_agents = nodes[running["spec"]["nodeName"]]
    (conf,) = vgpu_conf(node_agents, claim["metadata"]["uid"])
    assert int(conf["memory"]) == granted


def test_more_memory_than_any_gpu_is_refused_once_the_inventory_is_known(
    hook: Hook, nodes: dict[str, NodeAgents]
) -> None:
    """The nodes' slices bound the validation: the largest GPU here is an H100 (80 GB)."""
    shape = pod("too-big", {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "200000"})

    def refused() -> str | None:
        try:
            hook.client.request("POST", hook.pods(), body=shape, query={"dryRun": "All"})
        except KubeError as exc:
            return exc.message
        return None  # the inventory is not read yet

    message = wait_for("the refusal", refused, timeout=60)
    # The API server hands the webhook the canonical quantity (200000 -> "200k").
    assert "spec.containers[0].resources.limits[nvidia.com/vgpu-memory]=200k MiB" in message
    assert "more memory than any GPU in the cluster has (largest: 81559 MiB)" in message


# ---------------------------------------------------------------- helm upgrade


def test_helm_upgrade_keeps_the_published_ca_bundle_and_certificates(
    cluster: Any, client: KubeClient, tmp_path: Path
) -> None:
    """What the controller wrote (caBundle, the Secret's data) is not in the chart's manifest:
    a `helm upgrade` changes what the values change and leaves those alone."""
    home = tmp_path / "helm"
    home.mkdir()
    release = f"u{uuid.uuid4().hex[:5]}"
    namespace = f"{release}-system"
    values: JSON = {
        "driverName": f"{release}.vgpu.dra.dev",  # cluster-scoped names of its own
        "controller": {"enabled": True},
        "webhook": {"namespaceSelector": {"matchLabels": {LABEL: release}}},
    }
    _namespace(client, namespace)
    name, secret = f"{release}-vgpu-dra-webhook", f"{release}-vgpu-dra-webhook-tls"
    mutating = kube.path("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", name)
    secret_path = kube.path("v1", "secrets", secret, namespace=namespace)
    try:
        chosen = str(values_file(home, "install", values))
        helm(home, "install", release, str(CHART), "--namespace", namespace, "-f", chosen,
             kubeconfig=cluster.kubeconfig)  # fmt: skip
        bundle = base64.b64encode(b"a CA bundle the controller published").decode()
        config = client.get(mutating)
        for hook in config["webhooks"]:
            hook["clientConfig"]["caBundle"] = bundle
        client.replace(mutating, config)
        filled = client.get(secret_path)
        filled["data"] = {"tls.crt": base64.b64encode(b"certificate").decode()}
        client.replace(secret_path, filled)
        values["webhook"]["timeoutSeconds"] = 12
        chosen = str(values_file(home, "upgrade", values))
        helm(home, "upgrade", release, str(CHART), "--namespace", namespace, "-f", chosen,
             kubeconfig=cluster.kubeconfig)  # fmt: skip
        (hook,) = client.get(mutating)["webhooks"]
        assert hook["timeoutSeconds"] == 12  # the upgrade applied
        assert hook["clientConfig"]["caBundle"] == bundle  # the controller's, kept
        assert client.get(secret_path)["data"] == filled["data"]
    finally:
        helm(home, "uninstall", release, "--namespace", namespace, "--wait",
             kubeconfig=cluster.kubeconfig, check=False)  # fmt: skip
        client.request("DELETE", kube.path("v1", "pods", namespace=namespace),
                       query={"gracePeriodSeconds": 0})  # fmt: skip
        client.delete(kube.path("v1", "namespaces", namespace))
    assert not _exists(client, mutating)  # uninstall removes the configurations


# ---------------------------------------------------------------- certificates


def _digest(data: str | None) -> str:
    return hashlib.sha256((data or "").encode()).hexdigest()[:12]


def test_rotation_during_a_stream_of_admissions_loses_none(hook: Hook) -> None:
    """Lifetimes of seconds: a new CA is staged, published, promoted and a serving certificate
    signed by it every ~10 s; dry-run admissions (each a real webhook call) never fail. Runs a
    controller of its own, stopped at the end (the tests after it want no webhook)."""
    secret_path = kube.path("v1", "secrets", hook.secret, namespace=hook.system_ns)
    hook.controller.stop()
    try:
        _stream_through_rotations(hook, secret_path)
    finally:
        hook.controller.stop()


def _stream_through_rotations(hook: Hook, secret_path: str) -> None:
    secret = hook.client.get(secret_path)
    secret["data"] = {}  # start over with short-lived certificates
    hook.client.replace(secret_path, secret)
    hook.controller.start(
        "--webhook-cert-lifetime", "12s", "--webhook-ca-lifetime", "16s",
        "--webhook-ca-propagation", "2s",
    )  # fmt: skip
    wait_for("new certificates published", hook.published, timeout=60)
    stop = threading.Event()
    outcomes: list[str] = []
    lock = threading.Lock()

    def admit(worker: int) -> None:
        shape = pod(f"stream-{worker}", {"nvidia.com/vgpu-number": "1",
                                         "nvidia.com/vgpu-memory": "1100"})  # fmt: skip
        while not stop.is_set():
            try:
                echo = hook.client.request("POST", hook.pods(), body=shape, query={"dryRun": "All"})
                ok = bool(echo["spec"].get("resourceClaims"))
                outcome = "ok" if ok else "untranslated"
            except KubeError as exc:
                outcome = f"error: {exc}"
            with lock:
                outcomes.append(outcome)

    workers = [threading.Thread(target=admit, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    cas: set[str] = set()
    serving: set[str] = set()
    deadline = time.monotonic() + 40
    try:
        while time.monotonic() < deadline and (len(cas) < 3 or len(serving) < 3):
            data = hook.client.get(secret_path).get("data") or {}
            cas.add(_digest(data.get("ca.crt")))
            serving.add(_digest(data.get("tls.crt")))
            time.sleep(0.5)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    failures = [o for o in outcomes if o != "ok"]
    assert len(cas) >= 3 and len(serving) >= 3, (cas, serving)  # two full rotations seen
    assert len(outcomes) > 50
    assert failures == [], failures[:5]
    log = hook.controller.text()
    assert "CA promoted, serving certificate reissued" in log
    key = base64.b64decode((hook.client.get(secret_path)["data"])["tls.key"]).decode()
    assert "PRIVATE KEY" not in log
    assert key.splitlines()[1] not in log


# ---------------------------------------------------------------- webhook down (last)


def test_webhook_down_plain_pods_and_claims_pass_and_legacy_pods_are_refused(hook: Hook) -> None:
    hook.controller.stop()
    plain = hook.client.create(
        hook.pods(),
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
         "spec": {"containers": [{"name": "main", "image": "busybox",
                                  "resources": {"limits": {"cpu": "1"}}}]}},
    )  # fmt: skip
    assert "resourceClaims" not in plain["spec"]
    with pytest.raises(KubeError) as refused:
        hook.client.create(hook.pods(), pod("legacy-down", {"nvidia.com/gpu": "1"}))
    assert 'failed calling webhook "legacy-pods.vgpu.dra.dev"' in refused.value.message
    # The default path needs no controller: a claim that only asks for our class is created (its
    # capacity check fails open); one that configures our driver cannot be checked and is refused.
    claims = kube.path(RESOURCE_API, "resourceclaims", namespace=hook.tenant)
    devices = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.dra.dev"}}]}
    claim = {"apiVersion": RESOURCE_API, "kind": "ResourceClaim",
             "metadata": {"name": "plain-down"}, "spec": {"devices": devices}}  # fmt: skip
    hook.client.create(claims, claim)
    config = [{"requests": ["gpu"], "opaque": _vgpu_config(computePolicy="fixed")}]
    configured = {**claim, "metadata": {"name": "configured-down"},
                  "spec": {"devices": {**devices, "config": config}}}  # fmt: skip
    with pytest.raises(KubeError) as refused:
        hook.client.create(claims, configured)
    assert 'failed calling webhook "resourceclaims.vgpu.dra.dev"' in refused.value.message
