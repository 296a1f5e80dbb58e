"""What the kubelet plugin's e2e modules share: the repo's example manifests and DeviceClass,
applying manifests, a pod asking for one GPU share, and awaiting a pod the plugin prepared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from vgpu_testbed.polling import wait_for

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "deploy" / "examples"
DRIVER = "vgpu.dra.dev"

KIND_PATHS = {
    "Pod": ("v1", "pods"),
    "ResourceClaimTemplate": (RESOURCE_API, "resourceclaimtemplates"),
    "ResourceClaim": (RESOURCE_API, "resourceclaims"),
}


def deviceclass_exists(client: KubeClient, name: str) -> bool:
    try:
        client.get(kube.path(RESOURCE_API, "deviceclasses", name))
    except kube.NotFound:
        return False
    return True


def apply(client: KubeClient, manifest: Path, namespace: str) -> list[dict[str, Any]]:
    created = []
    for doc in yaml.safe_load_all(manifest.read_text()):
        api, plural = KIND_PATHS[doc["kind"]]
        created.append(client.create(kube.path(api, plural, namespace=namespace), doc))
    return created


def running_pod(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = client.get(kube.path("v1", "pods", name, namespace=namespace))
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    return wait_for(f"pod {namespace}/{name} Running (prepared)", check)


def pod_claim(client: KubeClient, pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    return client.get(
        kube.path(
            RESOURCE_API,
            "resourceclaims",
            status["resourceClaimName"],
            namespace=pod["metadata"]["namespace"],
        )
    )


def gpu_pod(
    client: KubeClient,
    namespace: str,
    name: str,
    *,
    uuid: str | None = None,
    tolerate: str | None = None,
    memory: str | None = None,
) -> None:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if uuid is not None:
        expression = f'device.attributes["{DRIVER}"].uuid == "{uuid}"'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    if tolerate is not None:
        exactly["tolerations"] = [{"key": tolerate, "operator": "Exists"}]
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    template = {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        },
    }
    client.create(kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace), template)
    client.create(kube.path("v1", "pods", namespace=namespace), pod)
