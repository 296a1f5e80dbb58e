"""The chart's webhook objects (templates/webhook.yaml, _webhook.tpl) rendered by the real helm.

Proves: the mutating webhook's matchConditions are exactly
`controller.webhook.translate.match_conditions()` for the same settings (default values and with
a shared resource), so chart and code route the same pods; the validating pods hook uses the
same condition; the webhook is fail-closed, CREATE-only, NoneOnDryRun, never reinvoked; the
environment the chart gives the controller parses with the controller's own flags into the
intended webhook settings; RBAC names its one Secret and its two configurations; cert-manager
mode renders Certificate, Issuer, cainjector annotation and the mounted certificate instead of
the Secret; the default values have the webhook with self-managed certificates;
webhook.enabled=false (or no controller) renders no webhook at all.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from cel_expr_python import cel

from controller.main import build_parser
from controller.webhook.translate import TranslationSettings, match_conditions
from tests.fixtures.chart import by_kind, helm_binary, render

JSON = dict[str, Any]
SHARED = {"nvidia.com/sharedgpu": 4, "example.com/quarter-gpu": 4}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm_binary()
    return tmp_path_factory.mktemp("helm-webhook")


def controller_env(docs: list[JSON], fields: dict[str, str]) -> dict[str, str]:
    (deploy,) = by_kind(docs, "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"].replace("$(POD_IP)", fields["status.podIP"])
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@pytest.mark.parametrize("shared", [{}, SHARED])
def test_match_conditions_equal_the_codes(home: Path, shared: dict[str, int]) -> None:
    values = {"controller": {"enabled": True}, "webhook": {"sharedResources": shared}}
    docs = render(home, values)
    (mutating,) = by_kind(docs, "MutatingWebhookConfiguration")
    (hook,) = mutating["webhooks"]
    expected = match_conditions(TranslationSettings(shared_resources=shared))
    assert hook["matchConditions"] == expected
    (validating,) = by_kind(docs, "ValidatingWebhookConfiguration")
    pods = next(h for h in validating["webhooks"] if h["rules"][0]["resources"] == ["pods"])
    assert [c["expression"] for c in pods["matchConditions"]] == [expected[0]["expression"]]


def test_mutating_webhook_is_fail_closed_create_only_and_dry_run_safe(home: Path) -> None:
    docs = render(home, {"controller": {"enabled": True}}, namespace="gpu-system", release="r")
    (mutating,) = by_kind(docs, "MutatingWebhookConfiguration")
    (hook,) = mutating["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
         "resources": ["pods"], "scope": "Namespaced"}
    ]  # fmt: skip
    assert hook["clientConfig"]["service"] == {
        "name": "r-vgpu-dra-controller",
        "namespace": "gpu-system",
        "path": "/mutate-pods",
        "port": 443,
    }
    (validating,) = by_kind(docs, "ValidatingWebhookConfiguration")
    hooks = {h["name"]: h["failurePolicy"] for h in validating["webhooks"]}
    assert hooks == {
        "resourceclaims.vgpu.dra.dev": "Fail",
        "resourceclaims-capacity.vgpu.dra.dev": "Ignore",  # the default path needs no controller
        "resourceclaimtemplates.vgpu.dra.dev": "Fail",
        "resourceclaimtemplates-capacity.vgpu.dra.dev": "Ignore",
        "deviceclasses.vgpu.dra.dev": "Fail",
        "pods.vgpu.dra.dev": "Fail",
    }
    for h in validating["webhooks"]:
        assert h["clientConfig"]["service"]["path"] == "/validate"
        assert h["sideEffects"] == "None"
        assert "caBundle" not in h["clientConfig"]  # the controller's (helm leaves it alone)
    assert mutating["metadata"]["name"] == validating["metadata"]["name"] == "r-vgpu-dra-webhook"


def test_the_controller_parses_the_charts_environment(home: Path) -> None:
    values = {
        "controller": {"enabled": True},
        "webhook": {
            "sharedResources": SHARED,
            "sharedResourceMemoryMiB": {"nvidia.com/sharedgpu": 6144},
        },
    }
    docs = render(home, values, namespace="gpu-system", release="r")
    env = controller_env(docs, {"status.podIP": "10.0.0.7", "metadata.namespace": "gpu-system"})
    args = build_parser(env).parse_args([])
    assert args.webhook_port == 9443
    assert args.webhook_bind == "10.0.0.7"  # the pod IP, like the probes
    assert args.webhook_namespace == "gpu-system"
    assert args.webhook_service == "r-vgpu-dra-controller"
    assert args.webhook_secret == "r-vgpu-dra-webhook-tls"
    assert args.webhook_config_names == "r-vgpu-dra-webhook"
    assert args.webhook_cert_dir == ""
    assert args.webhook_ca_lifetime == dt.timedelta(days=1825)
    assert args.webhook_cert_lifetime == dt.timedelta(days=365)
    assert args.webhook_template_grace == dt.timedelta(minutes=10)
    assert dict(args.shared_resource) == SHARED
    assert dict(args.shared_memory) == {"nvidia.com/sharedgpu": 6144}
    assert args.driver_name == "vgpu.dra.dev"
    (secret,) = by_kind(docs, "Secret")
    assert secret["metadata"]["name"] == args.webhook_secret
    assert "data" not in secret  # the controller fills it


def rules(docs: list[JSON], kind: str) -> list[JSON]:
    return [
        r
        for d in by_kind(docs, kind)
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "controller"
        for r in d["rules"]
    ]


def test_rbac_names_its_secret_and_configurations(home: Path) -> None:
    docs = render(home, {"controller": {"enabled": True}}, namespace="gpu-system", release="r")
    cluster = rules(docs, "ClusterRole")
    assert {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": ["r-vgpu-dra-webhook"],
        "verbs": ["get", "update"],
    } in cluster
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaimtemplates"],
        "verbs": ["create", "update", "delete"],
    } in cluster
    assert not any("secrets" in r["resources"] for r in cluster)
    namespaced = rules(docs, "Role")
    assert {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["r-vgpu-dra-webhook-tls"],
        "verbs": ["get", "update"],
    } in namespaced


def test_cert_manager_mode(home: Path) -> None:
    values = {"controller": {"enabled": True}, "webhook": {"certManager": {"enabled": True}}}
    docs = render(home, values, namespace="gpu-system", release="r")
    (certificate,) = by_kind(docs, "Certificate")
    (issuer,) = by_kind(docs, "Issuer")
    assert certificate["spec"]["secretName"] == "r-vgpu-dra-webhook-tls"
    assert certificate["spec"]["dnsNames"] == [
        "r-vgpu-dra-controller.gpu-system.svc",
        "r-vgpu-dra-controller.gpu-system.svc.cluster.local",
    ]
    assert certificate["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
    }
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (config,) = by_kind(docs, kind)
        assert config["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": "gpu-system/r-vgpu-dra-webhook"
        }
    assert by_kind(docs, "Secret") == []
    assert not any("secrets" in r["resources"] for r in rules(docs, "Role"))
    env = controller_env(docs, {"status.podIP": "10.0.0.7", "metadata.namespace": "gpu-system"})
    args = build_parser(env).parse_args([])
    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (mount,) = pod["containers"][0]["volumeMounts"]
    assert mount["mountPath"] == args.webhook_cert_dir and mount["readOnly"] is True
    (volume,) = pod["volumes"]
    assert volume["secret"]["secretName"] == "r-vgpu-dra-webhook-tls"
    # An issuer of the operator's instead of the self-signed one.
    values["webhook"]["certManager"]["issuerRef"] = {"name": "corp-ca", "kind": "ClusterIssuer"}
    docs = render(home, values, namespace="gpu-system", release="r")
    assert by_kind(docs, "Issuer") == []
    (certificate,) = by_kind(docs, "Certificate")
    assert certificate["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


def test_the_default_install_has_the_webhook_with_self_managed_certificates(home: Path) -> None:
    docs = render(home, {})
    kinds = {d["kind"] for d in docs}
    assert {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Secret"} <= kinds
    assert not kinds & {"Certificate", "Issuer"}
    env = controller_env(docs, {"status.podIP": "10.0.0.9", "metadata.namespace": "vgpu-dra"})
    assert env["VGPU_DRA_WEBHOOK_SECRET"] == "t-vgpu-dra-webhook-tls"


@pytest.mark.parametrize(
    "values",
    [{"webhook": {"enabled": False}}, {"controller": {"enabled": False}}],
)
def test_no_webhook_without_it_or_without_the_controller(home: Path, values: JSON) -> None:
    docs = render(home, values)
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Secret"}
    for deploy in by_kind(docs, "Deployment"):
        names = {e["name"] for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert not any(n.startswith("VGPU_DRA_WEBHOOK_") for n in names)


def test_drain_and_client_ca(home: Path) -> None:
    """webhook.drain reaches the controller's flag; webhook.clientCA mounts the ConfigMap's CA
    read-only and points --webhook-client-ca at it."""
    values: JSON = {}
    fields = {"status.podIP": "10.0.0.7", "metadata.namespace": "ns"}
    args = build_parser(controller_env(render(home, values, namespace="ns", release="r"),
                                       fields)).parse_args([])  # fmt: skip
    assert args.webhook_drain.total_seconds() == 2.0
    assert args.webhook_client_ca == ""
    values["webhook"] = {"drain": "1s", "clientCA": {"configMap": "apiserver-client-ca"}}
    docs = render(home, values, namespace="ns", release="r")
    args = build_parser(controller_env(docs, fields)).parse_args([])
    assert args.webhook_drain.total_seconds() == 1.0
    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (mount,) = pod["containers"][0]["volumeMounts"]
    assert args.webhook_client_ca == mount["mountPath"] + "/ca.crt" and mount["readOnly"] is True
    (volume,) = pod["volumes"]
    assert volume["configMap"] == {
        "name": "apiserver-client-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }


def _claim(devices: JSON, annotations: dict[str, str] | None = None) -> JSON:
    meta: JSON = {"name": "c"}
    if annotations:
        meta["annotations"] = annotations
    return {"kind": "ResourceClaim", "metadata": meta, "spec": {"devices": devices}}


def _template(claim: JSON) -> JSON:
    return {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": claim["spec"]},
    }


PLAIN = _claim({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.dra.dev"}}]})
FIRST_AVAILABLE = _claim(
    {
        "requests": [
            {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "vgpu.dra.dev"}]}
        ]
    }
)
CONFIGURED = _claim(
    {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.dra.dev"}}],
        "config": [{"opaque": {"driver": "vgpu.dra.dev", "parameters": {}}}],
    }
)
PERCENT = _claim(PLAIN["spec"]["devices"], {"vgpu.dra.dev/memory-percentage": "50"})
FOREIGN = _claim({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]})


@pytest.mark.parametrize(
    ("obj", "hooks"),
    [
        (PLAIN, {"resourceclaims-capacity": "Ignore"}),
        (FIRST_AVAILABLE, {"resourceclaims-capacity": "Ignore"}),
        (CONFIGURED, {"resourceclaims": "Fail"}),
        (PERCENT, {"resourceclaims": "Fail"}),
        (FOREIGN, {}),
        (_template(PLAIN), {"resourceclaimtemplates-capacity": "Ignore"}),
        (_template(CONFIGURED), {"resourceclaimtemplates": "Fail"}),
        (_template(FOREIGN), {}),
    ],
)
def test_only_claims_that_configure_the_driver_fail_closed(
    home: Path, obj: JSON, hooks: dict[str, str]
) -> None:
    """With no controller replica up, a claim that only asks for our class is still created (the
    default path needs no controller): its hook fails open. One that configures our driver, or
    carries our memory-percentage annotation, fails closed. Each object reaches one hook at most."""
    (config,) = by_kind(
        render(home, {"controller": {"enabled": True}}), "ValidatingWebhookConfiguration"
    )
    resource = "resourceclaims" if obj["kind"] == "ResourceClaim" else "resourceclaimtemplates"
    env = cel.NewEnv(variables={"object": cel.Type.DYN})
    matched = {}
    for hook in config["webhooks"]:
        if hook["rules"][0]["resources"] != [resource]:
            continue
        (condition,) = hook["matchConditions"]
        result = env.compile(condition["expression"]).eval(data={"object": obj})
        assert result.type() == cel.Type.BOOL, result.value()
        if result.value():
            matched[hook["name"].removesuffix(".vgpu.dra.dev")] = hook["failurePolicy"]
    assert matched == hooks
