"""Synthetic clusters and claims for the allocator's tests and benchmark.

Slices come from the real builder (`dra_driver.slices.build_slices`), so the allocator is tested
on exactly what the kubelet plugin publishes; nodes, pods and claims are API-shaped dicts.
"""

from __future__ import annotations

import random
from typing import Any

from dra_driver.gpu import GpuInfo, NodeInventory
from dra_driver.slices import build_slices

GIB = 1 << 30
DRIVER = "vgpu.dra.dev"
PRODUCTS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA A10")
MEMORY = {
    "NVIDIA H100 80GB HBM3": 80 * GIB,
    "NVIDIA A100-SXM4-40GB": 40 * GIB,
    "NVIDIA A10": 24 * GIB,
}
# NVLink shapes: domain of each GPU index (None = no NVLink).
SHAPES: dict[str, list[int | None]] = {
    "one-island": [0] * 8,
    "two-islands": [0, 0, 0, 0, 1, 1, 1, 1],
    "pairs": [0, 0, 1, 1, 2, 2, 3, 3],
    "mixed": [0, 0, 1, 1, 1, 1, None, None],
    "none": [None] * 8,
}
DEVICE_CLASS = {
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}


def inventory(node: int, gpus: int, product: str, shape: list[int | None]) -> NodeInventory:
    return NodeInventory(
        driver_version="580.95.05",
        cuda_driver_version="13.0",
        gpus=tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{node:08x}-{i:04x}-4000-8000-000000000000",
                product_name=product,
                brand="NVIDIA",
                architecture="Hopper",
                cuda_compute_capability="9.0",
                memory_bytes=MEMORY[product],
                sm_count=132,
                numa_node=i * 2 // gpus,
                pci_bus_id=f"0000:{i + 16:02x}:00.0",
                pcie_root=f"pci0000:{(i // 2) + 16:02x}",
                minor_number=i,
                nvlink_domain=shape[i % len(shape)],
            )
            for i in range(gpus)
        ),
    )


def node_obj(name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels or {}},
        "spec": spec,
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}},
    }


def node_events(
    n: int,
    product: str = PRODUCTS[0],
    shape: str = "one-island",
    gpus: int = 8,
    **node: Any,
) -> list[tuple[str, dict[str, Any]]]:
    """The Node and its ResourceSlice(s) as add events; node name `node-<n:05d>`."""
    name = f"node-{n:05d}"
    events: list[tuple[str, dict[str, Any]]] = [("Node", node_obj(name, **node))]
    inv = inventory(n, gpus, product, SHAPES[shape])
    for obj in build_slices(inv, driver=DRIVER, node_name=name, node_uid=f"uid-{name}"):
        obj["metadata"]["uid"] = f"slice-{name}"
        events.append(("ResourceSlice", obj))
    return events


def cluster_events(
    nodes: int, gpus: int = 8, *, seed: int = 0, shapes: tuple[str, ...] = tuple(SHAPES)
) -> list[tuple[str, dict[str, Any]]]:
    """Node and ResourceSlice add events for a cluster of `nodes` x `gpus` random GPUs."""
    rng = random.Random(seed)
    events: list[tuple[str, dict[str, Any]]] = []
    for n in range(nodes):
        product = rng.choice(PRODUCTS)
        shape = rng.choice(shapes)
        events += node_events(n, product, shape, gpus, labels={"zone": rng.choice("ab")})
    return events


def claim_obj(
    name: str,
    *,
    count: int = 1,
    memory: str | None = None,
    cores: str | None = None,
    selectors: tuple[str, ...] = (),
    match: str | None = None,
    distinct: str | None = None,
    all_devices: bool = False,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if all_devices:
        exactly["allocationMode"] = "All"
    else:
        exactly["count"] = count
    requests = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    if requests:
        exactly["capacity"] = {"requests": requests}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if match or distinct:
        key = "matchAttribute" if match else "distinctAttribute"
        devices["constraints"] = [{"requests": ["gpu"], key: match or distinct}]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": devices},
    }
