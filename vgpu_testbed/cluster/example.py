"""The hand-written DRA example the test bed is checked with: a ResourceSlice shaped like the one
our kubelet plugin publishes (shareable GPUs with consumable `memory` and `cores`), the
`vgpu.dra.dev` DeviceClass, claim templates asking for a slice of a GPU, and pods using them.

Why here: the e2e test and `vgpu-dra demo` apply the same objects, so the demo shows exactly
what the test proves. Manifests are built as `kubernetes` client models (validated locally);
`apply_*` helpers are thin I/O seams. Called by tests/e2e/vgpu_testbed/test_cluster.py and
vgpu_testbed.demo.cli.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubernetes import client

from dra_driver.names import CAPACITY_CORES, CAPACITY_MEMORY, DEFAULT_DRIVER_NAME

# Never pulled: with no kubelet, the scheduler's binding is the end of a pod's road.
PLACEHOLDER_IMAGE = "registry.invalid/testbed/none:0"
CLAIM_NAME = "gpu"


def shareable_gpu(name: str, memory: str = "80Gi", cores: int = 100) -> dict[str, Any]:
    """A device many claims can share: a request that names no memory takes all of it (an
    exclusive GPU); unrequested cores are 0 (no reservation)."""
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "capacity": {
            CAPACITY_MEMORY: {
                "value": memory,
                "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "step": "1Mi"}},
            },
            CAPACITY_CORES: {
                "value": str(cores),
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": str(cores), "step": "1"},
                },
            },
        },
    }


def resource_slice(
    name: str,
    node: str,
    devices: Sequence[str] = ("gpu-0", "gpu-1"),
    *,
    driver: str = DEFAULT_DRIVER_NAME,
    memory: str = "80Gi",
) -> client.V1ResourceSlice:
    return client.V1ResourceSlice.model_validate(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [shareable_gpu(d, memory) for d in devices],
            },
        }
    )


def device_class(driver: str = DEFAULT_DRIVER_NAME) -> client.V1DeviceClass:
    return client.V1DeviceClass.model_validate(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
    )


def claim_template(
    name: str, memory: str, cores: int, *, device_class_name: str = DEFAULT_DRIVER_NAME
) -> client.V1ResourceClaimTemplate:
    request = {
        "name": CLAIM_NAME,
        "exactly": {
            "deviceClassName": device_class_name,
            "capacity": {"requests": {CAPACITY_MEMORY: memory, CAPACITY_CORES: str(cores)}},
        },
    }
    return client.V1ResourceClaimTemplate.model_validate(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        }
    )


def pod(name: str, template: str) -> client.V1Pod:
    return client.V1Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "resourceClaims": [{"name": CLAIM_NAME, "resourceClaimTemplateName": template}],
                "containers": [
                    {
                        "name": "main",
                        "image": PLACEHOLDER_IMAGE,
                        "resources": {"claims": [{"name": CLAIM_NAME}]},
                    }
                ],
            },
        }
    )


def pod_claim(
    api_client: Any, namespace: str, pod_name: str
) -> client.ResourceV1ResourceClaim | None:
    """The ResourceClaim generated for a pod's `gpu` claim, or None while it does not exist."""
    found = client.CoreV1Api(api_client).read_namespaced_pod(pod_name, namespace)
    statuses = (found.status.resource_claim_statuses if found.status else None) or []
    for status in statuses:
        if status.name == CLAIM_NAME and status.resource_claim_name:
            return client.ResourceV1Api(api_client).read_namespaced_resource_claim(
                status.resource_claim_name, namespace
            )
    return None


def allocation_of(api_client: Any, namespace: str, pod_name: str) -> Any:
    """The single device result of the pod's claim allocation, or None while unallocated."""
    claim = pod_claim(api_client, namespace, pod_name)
    if claim is None or claim.status is None or claim.status.allocation is None:
        return None
    devices = claim.status.allocation.devices
    results = devices.results if devices else None
    if not results:
        return None
    if len(results) != 1:
        raise AssertionError(f"expected one device for {namespace}/{pod_name}, got {results}")
    return results[0]
