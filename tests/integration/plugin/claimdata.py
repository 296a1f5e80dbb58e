"""Builders of test data for the kubelet plugin: inventories and ResourceClaim objects.

Shared by the unit tests (pure planning, Preparer with an in-memory claim source) and the
integration tests (the same claims created in the real API server). Shapes follow
`resource.k8s.io/v1` exactly, so what passes here is what the API server accepts.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from dra_driver import kube
from dra_driver.gpu import GpuInfo, NodeInventory
from kubelet_plugin.claims import ClaimRef

DRIVER = "vgpu.dra.dev"
# The hook library `make native` builds: prepare refuses claims unless --hook-path is a real one.
HOOK_LIB = Path(__file__).resolve().parents[3] / "vgpu_hook" / "build" / "libvgpu.so"
NODE = "node-1"
GiB = 1 << 30


def gpu(index: int, memory: int = 80 * GiB) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:08d}-1111-2222-3333-444444444444",
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        memory_bytes=memory,
        sm_count=132,
        pci_bus_id=f"0000:{0x18 + index:02x}:00.0",
        minor_number=index,
    )


def inventory(count: int = 4, memory: int = 80 * GiB) -> NodeInventory:
    return NodeInventory(
        driver_version="580.95.05",
        cuda_driver_version="13.0",
        gpus=tuple(gpu(i, memory) for i in range(count)),
    )


def vgpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "vgpu.dra.dev/v1alpha1", "kind": "VgpuConfig", **fields}


def result(
    device: str,
    *,
    request: str = "gpu",
    memory: str | None = None,
    cores: str | int | None = None,
    share_id: str | None = None,
    pool: str = NODE,
    driver: str = DRIVER,
) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    consumed: dict[str, str] = {}
    if memory is not None:
        consumed["memory"] = memory
    if cores is not None:
        consumed["cores"] = str(cores)
    if consumed:
        out["consumedCapacity"] = consumed
    if share_id is not None:
        out["shareID"] = share_id
    return out


def config_entry(
    parameters: Any, *, source: str = "FromClaim", requests: list[str] | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {"driver": DRIVER, "parameters": parameters},
    }
    if requests:
        entry["requests"] = requests
    return entry


def claim(
    results: list[dict[str, Any]],
    *,
    name: str = "claim-a",
    namespace: str = "default",
    uid: str | None = None,
    configs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim as the API serves it after allocation."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": [_request(r["request"]) for r in _unique(results)]}},
        "status": {
            "allocation": {
                "devices": {"results": results, "config": configs or []},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            }
        },
    }


def _unique(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for r in results:
        seen.setdefault(r["request"].split("/")[0], {"request": r["request"].split("/")[0]})
    return list(seen.values())


def _request(name: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": DRIVER}}


def create_allocated_claim(
    client: kube.KubeClient,
    claim_namespace: str,
    results: list[dict[str, Any]],
    *,
    configs: list[dict[str, Any]] | None = None,
    name: str | None = None,
) -> ClaimRef:
    """Create a ResourceClaim and write its allocation through the status subresource — the
    real API validates both, exactly as when the scheduler writes them."""
    name = name or f"claim-{uuid.uuid4().hex[:8]}"
    requests = list(dict.fromkeys(r["request"] for r in results))
    created = client.create(
        kube.path(kube.RESOURCE_API, "resourceclaims", namespace=claim_namespace),
        {
            "apiVersion": kube.RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": r, "exactly": {"deviceClassName": DRIVER}} for r in requests
                    ]
                }
            },
        },
    )
    allocation = {
        "devices": {"results": results, "config": configs or []},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
            ]
        },
    }
    client.merge_patch(
        kube.path(
            kube.RESOURCE_API,
            "resourceclaims",
            name,
            namespace=claim_namespace,
            subresource="status",
        ),
        {"status": {"allocation": allocation}},
    )
    return ClaimRef(claim_namespace, name, created["metadata"]["uid"])
