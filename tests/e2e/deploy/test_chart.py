"""The Helm chart deploy/helm/vgpu-dra with the real helm binary and the real 1.37 API server.

1. `helm lint`; `helm template` with several value sets renders what they say: the defaults are
   the whole product (kubelet plugin, leader-elected controller with its PDB, the webhook with
   self-managed certificates), and each part can be turned off; wrong values are refused by
   values.schema.json with a message naming the value; the default DeviceClass equals
   deploy/deviceclass.yaml.
2. Every object of every value set passes a server-side dry-run create.
3. Installed into the test bed with the default values (the webhook scoped to a namespace label,
   since the bed's API server cannot reach a Service): every object exists, the DaemonSet's pods
   are bound to the nodes, NOTES.txt says what runs and how to check each part. (Every part
   running for real from the product image: deploy/test_realnode_install.py.)
4. Least privilege: SubjectAccessReviews show neither ServiceAccount can do more than its
   documented rules; the controller container runs with its ServiceAccount's pod-bound token.
   (The plugin running with its own, in its DaemonSet pod on a real node, publishing slices,
   preparing claims and passing the chart's probes: deploy/test_realnode_install.py.)
5. The admission policy: node-1's plugin credentials create, update and delete node-1 slices and
   are refused for node-2 slices (and a token not bound to a pod is refused outright).
6. `helm upgrade` removes what the new values no longer render and `helm uninstall` removes
   everything (that the node keeps the CDI specs and claim directories of prepared claims when
   the chart goes: deploy/test_realnode_install.py, where the plugin pod is terminated for real).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient, KubeError
from tests.fixtures.chart import (
    CHART,
    KINDS,
    KUBE_VERSION,
    REPO,
    by_kind,
    collection_path,
    helm,
    helm_binary,
    object_path,
    render,
    request_token,
    token_kubeconfig,
    values_file,
)
from tests.fixtures.image_tree import built_tree, tree_bin, tree_env
from vgpu_testbed.cluster.flags import free_ports
from vgpu_testbed.polling import wait_for

# Longer than the 60 s default: module fixtures install the chart into the session cluster and run
# the controller from the image tree; helm runs several times per test.
pytestmark = pytest.mark.timeout(600)

JSON = dict[str, Any]
DRIVER = "vgpu.dra.dev"
RELEASE = "vgpu"
PLUGIN_SA = f"{RELEASE}-vgpu-dra-kubelet-plugin"
CONTROLLER_SA = f"{RELEASE}-vgpu-dra-controller"

VALUE_SETS: dict[str, JSON] = {
    "defaults": {},
    # Each part off: the node side alone; the controller without its webhook or PDB.
    "node-side-only": {"controller": {"enabled": False}},
    "no-webhook": {
        "webhook": {"enabled": False},
        "controller": {"podDisruptionBudget": {"enabled": False}},
    },
    "controller-hostdevices": {
        "controller": {"enabled": True},
        "kubeletPlugin": {"nvml": {"mode": "hostDevices"}, "governor": False},
        "metrics": {"enabled": True},
        "tracing": {"otlpEndpoint": "otel-collector.monitoring:4317", "sampleRatio": 0.1},
        "features": {"bindingConditions": True},
        "logFormat": "json",
        "logLevel": "debug",
    },
    "renamed-driver": {
        "driverName": "gpu.example.com",
        "deviceClasses": [
            {"name": "", "extendedResourceName": "example.com/gpu"},
            {
                "name": "a100.gpu.example.com",
                "selectors": [
                    'device.attributes["gpu.example.com"].productName.startsWith("NVIDIA A100")'
                ],
            },
        ],
        "kubeletPlugin": {
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "kubeletDir": "/var/lib/k0s/kubelet",
        },
        "nodeAdmissionPolicy": {"enabled": False},
        "defaults": {"oversubscriptionRatio": 1.5, "computePolicy": "balance"},
    },
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm_binary()
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="module")
def client(cluster: Any) -> Iterator[KubeClient]:
    kc = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    yield kc
    kc.close()


def env_of(container: JSON) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# ---------------------------------------------------------------- 1. lint and template


def test_helm_lint(home: Path) -> None:
    for values in VALUE_SETS.values():
        run = helm(
            home, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION,
            "-f", str(values_file(home, "lint", values)),
        )  # fmt: skip
        assert "0 chart(s) failed" in run.stdout


NODE_SIDE = {
    "ClusterRole",
    "ClusterRoleBinding",
    "DaemonSet",
    "DeviceClass",
    "ServiceAccount",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
CONTROLLER = {"Deployment", "Service", "PodDisruptionBudget", "Role", "RoleBinding"}
WEBHOOK = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Secret"}


def test_default_render(home: Path) -> None:
    """The default values are the whole product: node side, controller, webhook."""
    docs = render(home, VALUE_SETS["defaults"])
    assert {d["kind"] for d in docs} == NODE_SIDE | CONTROLLER | WEBHOOK
    (deploy,) = by_kind(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    ctl_pod = deploy["spec"]["template"]["spec"]
    (controller,) = ctl_pod["containers"]
    env = env_of(controller)
    assert env["VGPU_DRA_LEADER_ELECT"] == "true"
    assert env["VGPU_DRA_WEBHOOK_SECRET"] == "t-vgpu-dra-webhook-tls"  # self-managed certificates
    assert ctl_pod["securityContext"]["runAsNonRoot"] is True
    assert controller["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # The replicas prefer different nodes; the PDB keeps one through drains.
    (term,) = ctl_pod["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "vgpu-dra",
        "app.kubernetes.io/instance": "t",
        "app.kubernetes.io/component": "controller",
    }
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    (ds,) = by_kind(docs, "DaemonSet")
    for container in [controller, *ds["spec"]["template"]["spec"]["containers"]]:
        assert set(container["resources"]["requests"]) == {"cpu", "memory"}, container["name"]
        assert "memory" in container["resources"]["limits"], container["name"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["serviceAccountName"] == "t-vgpu-dra-kubelet-plugin"
    (init,) = pod["initContainers"]
    assert init["command"] == ["/usr/local/bin/vgpu-dra-install-hook", "/host-hook-dir"]
    (plugin,) = pod["containers"]
    # The image runs as 65532; the node-side containers write root-owned host directories.
    assert init["securityContext"]["runAsUser"] == plugin["securityContext"]["runAsUser"] == 0
    assert init["securityContext"]["capabilities"]["drop"] == ["ALL"]
    env = env_of(plugin)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["VGPU_DRA_PLUGIN_DIR"] == "/var/lib/kubelet/plugins/vgpu.dra.dev"
    assert env["VGPU_DRA_HOOK_PATH"] == "/usr/local/vgpu-dra/lib/libvgpu.so"
    # Rolling updates with a surge: sockets named after the pod UID, no node without a plugin.
    assert env["VGPU_DRA_INSTANCE_ID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert "--state-lock-timeout=300" in plugin["args"]
    assert plugin["livenessProbe"]["exec"]["command"][-1] == (
        "/var/lib/kubelet/plugins/vgpu.dra.dev/dra-${VGPU_DRA_INSTANCE_ID}.sock"
    )
    assert plugin["readinessProbe"]["exec"]["command"][-1] == (
        "/var/lib/kubelet/plugins_registry/vgpu.dra.dev-${VGPU_DRA_INSTANCE_ID}-reg.sock"
    )
    assert not plugin["securityContext"]["privileged"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        "plugin-dir": "/var/lib/kubelet/plugins/vgpu.dra.dev",
        "registrar-dir": "/var/lib/kubelet/plugins_registry",
        "cdi-root": "/var/run/cdi",
        "state-dir": "/var/lib/vgpu-dra",
        "hook-dir": "/usr/local/vgpu-dra/lib",
        "toolkit-cdi-0": "/etc/cdi",
    }
    # Nothing the chart owns can delete node files on upgrade or uninstall: no hooks, no Jobs.
    for doc in docs:
        assert "helm.sh/hook" not in (doc["metadata"].get("annotations") or {}), doc["kind"]


def test_each_part_can_be_turned_off(home: Path) -> None:
    assert {d["kind"] for d in render(home, VALUE_SETS["node-side-only"])} == NODE_SIDE
    docs = render(home, VALUE_SETS["no-webhook"])
    assert {d["kind"] for d in docs} == NODE_SIDE | CONTROLLER - {"PodDisruptionBudget"}
    (deploy,) = by_kind(docs, "Deployment")
    assert not [n for n in env_of(deploy["spec"]["template"]["spec"]["containers"][0]) if (
        n.startswith("VGPU_DRA_WEBHOOK_"))]  # fmt: skip
    # A chosen affinity replaces the default anti-affinity.
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "role", "operator": "In", "values": ["control"]}]}]}}}  # fmt: skip
    (deploy,) = by_kind(render(home, {"controller": {"affinity": mine}}), "Deployment")
    assert deploy["spec"]["template"]["spec"]["affinity"] == mine
    # The admission policy too (renamed-driver turns it off as well).
    docs = render(home, {"nodeAdmissionPolicy": {"enabled": False}})
    assert not by_kind(docs, "ValidatingAdmissionPolicy")


def test_deploy_deviceclass_equals_the_charts(home: Path) -> None:
    (rendered,) = by_kind(render(home, VALUE_SETS["defaults"]), "DeviceClass")
    standalone = yaml.safe_load((REPO / "deploy" / "deviceclass.yaml").read_text())
    assert rendered["metadata"]["name"] == standalone["metadata"]["name"]
    assert rendered["spec"] == standalone["spec"]


def test_controller_and_host_devices_render(home: Path) -> None:
    docs = render(home, VALUE_SETS["controller-hostdevices"])
    (deploy,) = by_kind(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = env_of(pod["containers"][0])
    assert env["VGPU_DRA_LEADER_ELECT"] == "true"
    assert env["VGPU_DRA_LOG_FORMAT"] == "json"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "otel-collector.monitoring:4317"
    assert len(by_kind(docs, "Service")) == len(by_kind(docs, "PodDisruptionBudget")) == 1
    (ds,) = by_kind(docs, "DaemonSet")
    plugin_pod = ds["spec"]["template"]["spec"]
    assert "runtimeClassName" not in plugin_pod
    assert plugin_pod["containers"][0]["securityContext"]["privileged"] is True
    assert "--no-governor" in plugin_pod["containers"][0]["args"]
    assert {v["name"] for v in plugin_pod["volumes"]} >= {"host-dev", "host-driver-lib"}


def test_renamed_driver_render(home: Path) -> None:
    docs = render(home, VALUE_SETS["renamed-driver"])
    classes = {c["metadata"]["name"]: c["spec"] for c in by_kind(docs, "DeviceClass")}
    assert classes["gpu.example.com"]["extendedResourceName"] == "example.com/gpu"
    assert [s["cel"]["expression"] for s in classes["a100.gpu.example.com"]["selectors"]] == [
        'device.driver == "gpu.example.com"',
        'device.attributes["gpu.example.com"].productName.startsWith("NVIDIA A100")',
    ]
    assert not by_kind(docs, "ValidatingAdmissionPolicy")
    (ds,) = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    env = env_of(pod["containers"][0])
    assert env["VGPU_DRA_PLUGIN_DIR"] == "/var/lib/k0s/kubelet/plugins/gpu.example.com"
    assert env["VGPU_DRA_OVERSUBSCRIPTION_RATIO"] == "1.5"
    assert env["VGPU_DRA_DEFAULT_COMPUTE_POLICY"] == "balance"


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"logLevel": "verbose"}, "/logLevel"),
        ({"defaults": {"oversubscriptionRatio": 0.5}}, "/defaults/oversubscriptionRatio"),
        ({"defaults": {"computePolicy": "fast"}}, "/defaults/computePolicy"),
        ({"kubeletPlugin": {"cdiRoot": "var/run/cdi"}}, "/kubeletPlugin/cdiRoot"),
        ({"kubeletPlugin": {"nodeSelectr": {"a": "b"}}}, "nodeSelectr"),
        ({"kubeletPlugin": {"nvml": {"mode": "magic"}}}, "/kubeletPlugin/nvml/mode"),
        ({"driverName": "Not_A_Domain"}, "/driverName"),
        ({"controller": {"replicas": "two"}}, "/controller/replicas"),
        ({"features": {"bindingConditions": "yes"}}, "/features/bindingConditions"),
        ({"deviceClasses": [{"extendedResourceName": "gpu"}]}, "/deviceClasses/0"),
    ],
)
def test_wrong_values_are_refused_naming_the_value(home: Path, values: JSON, named: str) -> None:
    run = helm(
        home, "template", "t", str(CHART), "--kube-version", KUBE_VERSION,
        "-f", str(values_file(home, "wrong", values)), check=False,
    )  # fmt: skip
    assert run.returncode != 0
    assert "values don't meet the specifications of the schema" in run.stderr
    assert named in run.stderr, run.stderr


def test_decimals_from_set_are_accepted_and_checked(home: Path) -> None:
    # `helm --set` passes decimals as strings: the schema takes numeric strings, still bounded.
    base = ["template", "t", str(CHART), "--kube-version", KUBE_VERSION]
    ok = helm(home, *base, "--set", "defaults.oversubscriptionRatio=1.5")
    assert 'value: "1.5"' in ok.stdout
    bad = helm(home, *base, "--set", "defaults.oversubscriptionRatio=0.5", check=False)
    assert bad.returncode != 0 and "/defaults/oversubscriptionRatio" in bad.stderr


# ---------------------------------------------------------------- 2. server-side dry run


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_object_passes_a_server_side_dry_run(
    home: Path, client: KubeClient, namespace: str, value_set: str
) -> None:
    docs = render(home, VALUE_SETS[value_set], namespace=namespace, release=f"dry-{value_set}")
    assert {d["kind"] for d in docs} <= set(KINDS)
    for doc in docs:
        try:
            echo = client.request(
                "POST", collection_path(doc, namespace), body=doc, query={"dryRun": "All"}
            )
        except KubeError as exc:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {exc}") from exc
        assert echo["metadata"]["name"] == doc["metadata"]["name"]


# ---------------------------------------------------------------- 3. install


# The default values, but for the webhook's scope: the bed has no Service routing, so the webhook
# the chart registers could not be called, and its fail-closed claim validation would refuse this
# module's claims. Limited to namespaces with a label no test sets (deploy/test_realnode_install.py
# calls it, unscoped, through a relay; tests/e2e/controller/test_webhook.py through the bed's URL).
INSTALL_VALUES: JSON = {
    "webhook": {"namespaceSelector": {"matchLabels": {"vgpu-dra.test/webhook": "on"}}}
}


@pytest.fixture(scope="module")
def runtime_class(client: KubeClient) -> Iterator[None]:
    """The NVIDIA runtime class the default values run the plugin in (a real GPU node has it
    from the NVIDIA container toolkit's installation)."""
    path = kube.path("node.k8s.io/v1", "runtimeclasses")
    client.create(
        path,
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
         "metadata": {"name": "nvidia"}, "handler": "nvidia"},
    )  # fmt: skip
    yield
    client.delete(kube.path("node.k8s.io/v1", "runtimeclasses", "nvidia"))


@pytest.fixture(scope="module")
def release(
    cluster: Any, client: KubeClient, home: Path, runtime_class: None
) -> Iterator[tuple[str, list[JSON]]]:
    """The chart installed with its default values into its own namespace; uninstalled
    afterwards."""
    namespace = "vgpu-dra-system"
    values = INSTALL_VALUES
    client.create(
        kube.path("v1", "namespaces"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    try:
        installed = helm(
            home, "install", RELEASE, str(CHART), "--namespace", namespace,
            "-f", str(values_file(home, "install", values)), kubeconfig=cluster.kubeconfig,
        )  # fmt: skip
        # NOTES.txt: what runs, and a command to check each part.
        notes = installed.stdout
        for line in [
            f"kubelet plugin   DaemonSet {PLUGIN_SA}",
            f"controller       Deployment {CONTROLLER_SA}, 2 replica(s), one allocating at a time",
            "(the holder of Lease vgpu-dra-controller)",
            "webhook          served by every controller replica",
            f"-l app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=kubelet-plugin",
            "kubectl get resourceslices --field-selector spec.driver=vgpu.dra.dev",
            f"-l app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=controller",
            f"kubectl -n {namespace} get lease vgpu-dra-controller",
            f"kubectl get mutatingwebhookconfiguration {RELEASE}-vgpu-dra-webhook",
            "kubectl create --dry-run=server",
        ]:
            assert line in notes, notes
        docs = render(home, values, namespace=namespace, release=RELEASE)
        yield namespace, docs
    finally:
        helm(home, "uninstall", RELEASE, "--namespace", namespace,
             "--wait", kubeconfig=cluster.kubeconfig, check=False)  # fmt: skip
        client.request("DELETE", kube.path("v1", "pods", namespace=namespace),
                       query={"gracePeriodSeconds": 0})  # fmt: skip
        client.delete(kube.path("v1", "namespaces", namespace))


def exists(client: KubeClient, path: str) -> bool:
    try:
        client.get(path)
    except kube.NotFound:
        return False
    return True


def plugin_pods(client: KubeClient, namespace: str) -> dict[str, JSON]:
    """The DaemonSet's pods by node, once the scheduler bound one to each node."""
    pods = client.list(
        kube.path("v1", "pods", namespace=namespace),
        label_selector=f"app.kubernetes.io/instance={RELEASE},"
        "app.kubernetes.io/component=kubelet-plugin",
    )
    return {p["spec"]["nodeName"]: p for p in pods if p["spec"].get("nodeName")}


def test_install_creates_every_object(client: KubeClient, release: tuple[str, list[JSON]]) -> None:
    namespace, docs = release
    for doc in docs:
        assert exists(client, object_path(doc, namespace)), (
            f"{doc['kind']} {doc['metadata']['name']}"
        )

    def one_per_node() -> dict[str, JSON] | None:
        pods = plugin_pods(client, namespace)
        return pods if set(pods) == {"node-1", "node-2"} else None

    pods = wait_for("a plugin pod bound to each node", one_per_node)
    for node, pod in pods.items():
        assert pod["spec"]["serviceAccountName"] == PLUGIN_SA
        assert pod["spec"]["priorityClassName"] == "system-node-critical", node


# ---------------------------------------------------------------- 4. least privilege


def review(client: KubeClient, user: str, namespace: str, attrs: JSON) -> bool:
    answer = client.create(
        kube.path("authorization.k8s.io/v1", "subjectaccessreviews"),
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                           "system:authenticated"],
                "resourceAttributes": attrs,
            },
        },
    )  # fmt: skip
    return bool(answer["status"].get("allowed"))


def attrs(verb: str, resource: str, group: str = "", **extra: str) -> JSON:
    return {"verb": verb, "resource": resource, "group": group, **extra}


PLUGIN_ALLOWED = [
    attrs("get", "resourceclaims", "resource.k8s.io", namespace="tenant"),
    attrs("create", "resourceslices", "resource.k8s.io"),
    attrs("update", "resourceslices", "resource.k8s.io"),
    attrs("delete", "resourceslices", "resource.k8s.io"),
    attrs("list", "resourceslices", "resource.k8s.io"),
    attrs("get", "nodes"),
    attrs("create", "events", namespace="tenant"),
]
PLUGIN_DENIED = [
    attrs("list", "resourceclaims", "resource.k8s.io"),
    attrs("update", "resourceclaims", "resource.k8s.io", namespace="tenant"),
    attrs("update", "resourceclaims", "resource.k8s.io", subresource="status", namespace="t"),
    attrs("get", "secrets", namespace="kube-system"),
    attrs("list", "secrets"),
    attrs("create", "pods", namespace="tenant"),
    attrs("create", "pods", subresource="exec", namespace="tenant"),
    attrs("update", "nodes"),
    attrs("patch", "nodes", subresource="status"),
    attrs("delete", "nodes"),
    attrs("list", "nodes"),
    attrs("create", "deviceclasses", "resource.k8s.io"),
    attrs("create", "devicetaintrules", "resource.k8s.io"),
    attrs("deletecollection", "resourceslices", "resource.k8s.io"),
    attrs("create", "serviceaccounts", subresource="token", namespace="vgpu-dra-system"),
    attrs("update", "clusterroles", "rbac.authorization.k8s.io"),
]
CONTROLLER_ALLOWED = [
    attrs("list", "resourceclaims", "resource.k8s.io"),
    attrs("update", "resourceclaims", "resource.k8s.io", subresource="status", namespace="t"),
    attrs("watch", "resourceslices", "resource.k8s.io"),
    attrs("list", "deviceclasses", "resource.k8s.io"),
    # admins' device taints (`vgpu-dra drain`), honoured by its placements
    attrs("watch", "devicetaintrules", "resource.k8s.io"),
    attrs("list", "pods"),
    attrs("create", "pods", subresource="eviction", namespace="tenant"),
    attrs("update", "leases", "coordination.k8s.io", namespace="vgpu-dra-system"),
    # the delete-protection finalizer on claims it allocates
    attrs("update", "resourceclaims", "resource.k8s.io", namespace="t"),
    # the rescheduler's trigger: Warning Events about pods
    attrs("watch", "events"),
    # binding conditions: status.devices of the chart's driver
    attrs(
        "arbitrary-node:update",
        "resourceclaims",
        "resource.k8s.io",
        subresource="driver",
        name="vgpu.dra.dev",
        namespace="t",
    ),
    # the webhook: its templates, its one Secret, its two configurations
    attrs("create", "resourceclaimtemplates", "resource.k8s.io", namespace="tenant"),
    attrs("delete", "resourceclaimtemplates", "resource.k8s.io", namespace="tenant"),
    attrs("update", "secrets", namespace="vgpu-dra-system", name=f"{RELEASE}-vgpu-dra-webhook-tls"),
    attrs(
        "update",
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        name=f"{RELEASE}-vgpu-dra-webhook",
    ),
]
CONTROLLER_DENIED = [
    attrs("create", "resourceslices", "resource.k8s.io"),
    # draining is a cluster admin's act: no chart account writes DeviceTaintRules
    attrs("create", "devicetaintrules", "resource.k8s.io"),
    attrs("delete", "devicetaintrules", "resource.k8s.io"),
    attrs("delete", "resourceclaims", "resource.k8s.io", namespace="t"),
    attrs(
        "arbitrary-node:update",
        "resourceclaims",
        "resource.k8s.io",
        subresource="driver",
        name="gpu.other.example",
        namespace="t",
    ),
    attrs("update", "leases", "coordination.k8s.io", namespace="kube-system"),
    attrs("get", "secrets", namespace="vgpu-dra-system"),
    attrs("get", "secrets", namespace="vgpu-dra-system", name="another-secret"),
    attrs("update", "secrets", namespace="kube-system", name=f"{RELEASE}-vgpu-dra-webhook-tls"),
    attrs(
        "update",
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        name="someone-elses-webhook",
    ),
    attrs("delete", "pods", namespace="tenant"),
    attrs("create", "pods", subresource="exec", namespace="tenant"),
    attrs("update", "nodes"),
]


@pytest.mark.parametrize(
    ("account", "allowed", "denied"),
    [(PLUGIN_SA, PLUGIN_ALLOWED, PLUGIN_DENIED),
     (CONTROLLER_SA, CONTROLLER_ALLOWED, CONTROLLER_DENIED)],
)  # fmt: skip
def test_service_accounts_can_do_no_more_than_they_need(
    client: KubeClient,
    release: tuple[str, list[JSON]],
    account: str,
    allowed: list[JSON],
    denied: list[JSON],
) -> None:
    namespace, _ = release
    user = f"system:serviceaccount:{namespace}:{account}"
    assert [a for a in allowed if not review(client, user, namespace, a)] == []
    assert [a for a in denied if review(client, user, namespace, a)] == []


@pytest.fixture(scope="module")
def node1_token(client: KubeClient, release: tuple[str, list[JSON]]) -> str:
    """The plugin ServiceAccount's token bound to its DaemonSet pod on node-1: what the kubelet
    mounts into that pod."""
    namespace, _ = release
    pods = wait_for(
        "the plugin pod on node-1", lambda: plugin_pods(client, namespace).get("node-1")
    )
    return request_token(client, namespace, PLUGIN_SA, pods)


@pytest.fixture(scope="module")
def tree() -> Path:
    """The image's file tree (what the chart's containers run), from `make image-tree`."""
    return built_tree()


def resolved_env(container: JSON, fields: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet would give it: downward-API `fields`
    (fieldPath -> value) filled in, `$(VAR)` references to earlier variables expanded."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            value = str(item["value"])
            for name, known in env.items():
                value = value.replace(f"$({name})", known)
            env[item["name"]] = value
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def test_the_controller_runs_with_its_charts_service_account(
    *,
    cluster: Any,
    client: KubeClient,
    home: Path,
    release: tuple[str, list[JSON]],
    tree: Path,
    tmp_path: Path,
) -> None:
    """The controller container of the chart's Deployment, run from the image tree with its
    rendered command and environment and a token bound to one of its pods: credentials load,
    /readyz answers on the pod IP (here loopback), it stops cleanly."""
    namespace, _ = release
    port, webhook_port = free_ports(2)
    values = {**INSTALL_VALUES, "controller": {"healthPort": port, "webhookPort": webhook_port}}
    (deploy,) = by_kind(render(home, values, namespace=namespace, release=RELEASE), "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]

    def controller_pod() -> JSON | None:
        pods = client.list(
            kube.path("v1", "pods", namespace=namespace),
            label_selector=f"app.kubernetes.io/instance={RELEASE},"
            "app.kubernetes.io/component=controller",
        )
        return next((p for p in pods if p["spec"].get("nodeName")), None)

    token = request_token(
        client, namespace, CONTROLLER_SA, wait_for("a controller pod", controller_pod)
    )
    kubeconfig = token_kubeconfig(tmp_path / "kc", cluster.server, Path(cluster.ca_cert), token)
    fields = {"status.podIP": "127.0.0.1", "metadata.namespace": namespace}
    env = {**resolved_env(container, fields), **tree_env(tree), "KUBECONFIG": str(kubeconfig)}
    argv = [str(tree_bin(tree) / container["command"][0]), *container["command"][1:]]
    cluster.spawn("chart-controller", argv, env=env, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/readyz"
        wait_for("the controller's /readyz", lambda: http_status(url) == 200)
    finally:
        assert cluster.stop_process("chart-controller")
    log = (cluster.root / "logs" / "chart-controller.log").read_text()
    assert "allocation controller running" in log and "stopped" in log
    assert "acquired leadership of lease" in log  # leader election on, Lease in its namespace
    # The webhook served with certificates in the chart's Secret, caBundle published (its RBAC).
    assert f"webhook on https://127.0.0.1:{webhook_port}" in log
    assert "caBundle published into MutatingWebhookConfiguration" in log


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status)
    except (OSError, urllib.error.HTTPError):
        return 0


def node_slices(client: KubeClient, node: str) -> list[JSON]:
    return client.list(
        kube.path(RESOURCE_API, "resourceslices"),
        field_selector=f"spec.driver={DRIVER},spec.nodeName={node}",
    )


# ---------------------------------------------------------------- 5. the admission policy


def probe_slice(name: str, node: str) -> JSON:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": f"{node}-policy-test", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


@pytest.fixture
def as_node1(cluster: Any, node1_token: str, tmp_path: Path) -> Iterator[KubeClient]:
    kc = KubeClient.from_kubeconfig(
        str(token_kubeconfig(tmp_path / "kc", cluster.server, Path(cluster.ca_cert), node1_token))
    )
    yield kc
    kc.close()


def forbidden(action: Callable[[], object]) -> str:
    with pytest.raises(KubeError) as caught:
        action()
    assert caught.value.status == 403, caught.value
    return caught.value.message


def test_node1_plugin_writes_only_node1_slices(client: KubeClient, as_node1: KubeClient) -> None:
    slices = kube.path(RESOURCE_API, "resourceslices")
    own, other = "policy-test-node-1", "policy-test-node-2"
    try:
        # Its own node: create, update, delete all pass.
        created = as_node1.create(slices, probe_slice(own, "node-1"))
        created["spec"]["devices"].append({"name": "gpu-1"})
        as_node1.replace(kube.path(RESOURCE_API, "resourceslices", own), created)
        # (Moving a slice to another node is impossible anyway: spec.nodeName is immutable.)
        as_node1.delete(kube.path(RESOURCE_API, "resourceslices", own), missing_ok=False)

        # Another node's slice: no create, and none that exists can be changed or deleted.
        message = forbidden(lambda: as_node1.create(slices, probe_slice(other, "node-2")))
        assert "plugin on node node-1" in message and "node node-2" in message
        theirs = client.create(slices, probe_slice(other, "node-2"))
        theirs["spec"]["devices"] = []
        forbidden(
            lambda: as_node1.replace(kube.path(RESOURCE_API, "resourceslices", other), theirs)
        )
        forbidden(lambda: as_node1.delete(kube.path(RESOURCE_API, "resourceslices", other)))
        assert exists(client, kube.path(RESOURCE_API, "resourceslices", other))
    finally:
        for name in (own, other):
            client.delete(kube.path(RESOURCE_API, "resourceslices", name))


def test_a_token_not_bound_to_a_pod_writes_no_slice(
    cluster: Any, client: KubeClient, release: tuple[str, list[JSON]], tmp_path: Path
) -> None:
    namespace, _ = release
    token = request_token(client, namespace, PLUGIN_SA, None)
    kc = KubeClient.from_kubeconfig(
        str(token_kubeconfig(tmp_path / "kc", cluster.server, Path(cluster.ca_cert), token))
    )
    try:
        message = forbidden(
            lambda: kc.create(
                kube.path(RESOURCE_API, "resourceslices"), probe_slice("unbound", "node-1")
            )
        )
        assert "token bound to a pod" in message
        # RBAC still lets it read what it needs: the refusal is the policy's, not RBAC's.
        kc.get(kube.path("v1", "nodes", "node-1"))
    finally:
        kc.close()
        client.delete(kube.path(RESOURCE_API, "resourceslices", "unbound"))


# ---------------------------------------------------------------- 6. upgrade and uninstall


def release_objects(client: KubeClient, namespace: str) -> set[tuple[str, str]]:
    """Every object of every chart kind labelled with our release, as (kind, name)."""
    found = set()
    for kind, (api, plural, namespaced) in KINDS.items():
        path = kube.path(api, plural, namespace=namespace if namespaced else None)
        for obj in client.list(path, label_selector=f"app.kubernetes.io/instance={RELEASE}"):
            found.add((kind, obj["metadata"]["name"]))
    return found


def test_upgrade_and_uninstall_leave_no_orphans_and_keep_node_files(
    *,
    cluster: Any,
    client: KubeClient,
    home: Path,
    release: tuple[str, list[JSON]],
) -> None:
    namespace, docs = release
    assert release_objects(client, namespace) == {(d["kind"], d["metadata"]["name"]) for d in docs}

    # Upgrade to values without the controller and with a second DeviceClass.
    values = {
        "controller": {"enabled": False},
        "deviceClasses": [{"name": ""}, {"name": "second.vgpu.dra.dev"}],
    }
    helm(
        home, "upgrade", RELEASE, str(CHART), "--namespace", namespace,
        "-f", str(values_file(home, "upgrade", values)), kubeconfig=cluster.kubeconfig,
    )  # fmt: skip
    expected = {
        (d["kind"], d["metadata"]["name"])
        for d in render(home, values, namespace=namespace, release=RELEASE)
    }
    assert ("Deployment", CONTROLLER_SA) not in expected
    assert ("DeviceClass", "second.vgpu.dra.dev") in expected
    wait_for("exactly the upgraded objects", lambda: release_objects(client, namespace) == expected)

    helm(home, "uninstall", RELEASE, "--namespace", namespace, "--wait",
         kubeconfig=cluster.kubeconfig)  # fmt: skip
    wait_for("no object of the release", lambda: not release_objects(client, namespace))
    # The fixture's own uninstall must not fail on an absent release: reinstall for it.
    helm(home, "install", RELEASE, str(CHART), "--namespace", namespace,
         "-f", str(values_file(home, "reinstall", INSTALL_VALUES)),
         kubeconfig=cluster.kubeconfig)  # fmt: skip
