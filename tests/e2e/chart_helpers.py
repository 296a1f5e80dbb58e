"""Helpers of the chart's e2e tests (tests/e2e/test_chart.py): the real helm binary the test bed
builds, rendering, where each rendered kind lives in the API, and credentials of a
ServiceAccount token."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import kube
from vgpu_testbed.cluster import default_bin_dir

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "vgpu-dra"
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
    "DaemonSet": ("apps/v1", "daemonsets", True),
    "Deployment": ("apps/v1", "deployments", True),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets", True),
}


def helm_binary() -> Path:
    helm = default_bin_dir() / "helm"
    if not helm.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{helm} not built (make controlplane)", pytrace=False)
        pytest.skip(f"{helm} not built (make controlplane)")
    return helm


def helm(
    home: Path, *args: str, kubeconfig: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    run = subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    if check:
        assert run.returncode == 0, f"helm {' '.join(args)}:\n{run.stdout}{run.stderr}"
    return run


def values_file(home: Path, name: str, values: Mapping[str, Any]) -> Path:
    path = home / f"values-{name}.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def render(
    home: Path, values: Mapping[str, Any], *, namespace: str = "vgpu-dra", release: str = "t"
) -> list[JSON]:
    run = helm(
        home,
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        "-f",
        str(values_file(home, release, values)),
    )
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc]


def object_path(obj: Mapping[str, Any], namespace: str | None = None) -> str:
    """REST path of the object (collection path when `namespace` is given for a create)."""
    api, plural, namespaced = KINDS[str(obj["kind"])]
    ns = (obj["metadata"].get("namespace") or namespace) if namespaced else None
    return kube.path(api, plural, obj["metadata"]["name"], namespace=ns)


def collection_path(obj: Mapping[str, Any], namespace: str) -> str:
    api, plural, namespaced = KINDS[str(obj["kind"])]
    return kube.path(api, plural, namespace=namespace if namespaced else None)


def by_kind(docs: Sequence[JSON], kind: str) -> list[JSON]:
    return [d for d in docs if d["kind"] == kind]


def token_kubeconfig(path: Path, server: str, ca_cert: Path, token: str) -> Path:
    """A kubeconfig that authenticates with `token` (a ServiceAccount token), 0600."""
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
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def request_token(
    client: kube.KubeClient, namespace: str, service_account: str, pod: JSON | None
) -> str:
    """A TokenRequest for the ServiceAccount, bound to `pod` when given (the API server then puts
    the pod's node into the token: userInfo.extra authentication.kubernetes.io/node-name)."""
    spec: JSON = {"expirationSeconds": 3600}
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
