"""The project's Helm chart as the test bed uses it: render it with the real helm binary, know
where each rendered kind lives in the API, and hand a component the credentials of one of its
ServiceAccounts (TokenRequest + a token kubeconfig).

Why here: `vgpu-dra dev-cluster up --agents` runs the allocation controller with exactly the RBAC
a Helm install gives it, so the bed must render the chart itself (it may not import tests/); the
chart e2e tests use the same functions through tests/fixtures/chart.py. Rendering is done by helm,
never re-implemented: the chart's templates are the one definition of the controller's rights.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dra_driver import kube
from vgpu_testbed.cluster.binaries import BinariesMissingError, default_bin_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "deploy" / "helm" / "vgpu-dra"
KUBE_VERSION = "1.37.1"
JSON = dict[str, Any]

# kind -> (apiVersion, plural, namespaced): every kind the chart renders.
KINDS: dict[str, tuple[str, str, bool]] = {
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "Service": ("v1", "services", True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ValidatingAdmissionPolicy": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
    "DeviceClass": ("resource.k8s.io/v1", "deviceclasses", False),
    "Secret": ("v1", "secrets", True),
    "MutatingWebhookConfiguration": (
        "admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "ValidatingWebhookConfiguration": (
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        False,
    ),
    "DaemonSet": ("apps/v1", "daemonsets", True),
    "Deployment": ("apps/v1", "deployments", True),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets", True),
}
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


class HelmError(RuntimeError):
    """helm failed; the message carries its output."""


def helm_path() -> Path:
    """The helm binary `make controlplane` builds next to the Kubernetes binaries."""
    helm = default_bin_dir() / "helm"
    if not helm.is_file():
        raise BinariesMissingError(
            f"helm not built: {helm} missing. Run `make controlplane` (bash hack/testbed/build.sh)."
        )
    return helm


def run_helm(
    home: Path, *args: str, kubeconfig: Path | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """helm with every one of its directories inside `home` (nothing read from or written to the
    user's own helm configuration); the caller checks the return code."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [str(helm_path()), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def values_file(home: Path, name: str, values: Mapping[str, Any]) -> Path:
    path = home / f"values-{name}.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def render(
    home: Path, values: Mapping[str, Any], *, namespace: str = "vgpu-dra", release: str = "t"
) -> list[JSON]:
    """`helm template` of the chart with `values`: the objects an install would create."""
    args = (
        "template", release, str(CHART), "--namespace", namespace,
        "--kube-version", KUBE_VERSION, "-f", str(values_file(home, release, values)),
    )  # fmt: skip
    run = run_helm(home, *args)
    if run.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed:\n{run.stdout}{run.stderr}")
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc]


def by_kind(docs: Sequence[JSON], kind: str) -> list[JSON]:
    return [d for d in docs if d["kind"] == kind]


def component_rbac(docs: Sequence[JSON], component: str) -> list[JSON]:
    """The ServiceAccount and RBAC objects of one component (label
    app.kubernetes.io/component), ServiceAccount first."""
    return [
        d
        for kind in RBAC_KINDS
        for d in by_kind(docs, kind)
        if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == component
    ]


def object_path(obj: Mapping[str, Any], namespace: str | None = None) -> str:
    """REST path of the object (its namespace, else `namespace`, when the kind is namespaced)."""
    api, plural, namespaced = KINDS[str(obj["kind"])]
    ns = (obj["metadata"].get("namespace") or namespace) if namespaced else None
    return kube.path(api, plural, obj["metadata"]["name"], namespace=ns)


def collection_path(obj: Mapping[str, Any], namespace: str) -> str:
    api, plural, namespaced = KINDS[str(obj["kind"])]
    return kube.path(api, plural, namespace=namespace if namespaced else None)


def apply(client: kube.KubeClient, obj: Mapping[str, Any], namespace: str) -> None:
    """Create the object, or replace it when it exists (a restarted bed re-applies)."""
    try:
        client.create(collection_path(obj, namespace), obj)
    except kube.AlreadyExists:
        current = client.get(object_path(obj, namespace))
        updated = {**obj, "metadata": {**obj["metadata"]}}
        updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        client.replace(object_path(obj, namespace), updated)


def token_kubeconfig(path: Path, server: str, ca_cert: Path, token: str) -> Path:
    """A kubeconfig that authenticates with `token` (a ServiceAccount token), mode 0600."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "bed", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "bed", "user": "sa"}}],
        "current-context": "sa",
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(yaml.safe_dump(config))
    return path


def request_token(
    client: kube.KubeClient,
    namespace: str,
    service_account: str,
    pod: JSON | None,
    *,
    expiration_s: int = 3600,
) -> str:
    """A TokenRequest for the ServiceAccount, bound to `pod` when given (the API server then puts
    the pod's node into the token: userInfo.extra authentication.kubernetes.io/node-name)."""
    spec: JSON = {"expirationSeconds": expiration_s}
    if pod is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
    answer = client.create(
        kube.path(
            "v1", "serviceaccounts", service_account, namespace=namespace, subresource="token"
        ),
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(answer["status"]["token"])
