"""Hand-made GPU inventories for tests and benchmarks that need GPUs without NVML.

One builder, so slice, publisher and benchmark code all see the same shape of node; tests that
need real NVML answers use the simulated GPUs instead (tests/integration/test_inventory.py).
"""

from __future__ import annotations

from dra_driver.gpu import GpuInfo, NodeInventory

GIB = 1 << 30


def synthetic_inventory(count: int, *, memory: int = 80 * GIB) -> NodeInventory:
    """`count` H100-like GPUs, four per NUMA node, all in one NVLink domain; bus IDs stay valid
    past 256 GPUs (the slice limits are tested with more than 128 devices)."""
    return NodeInventory(
        driver_version="580.95.05",
        cuda_driver_version="13.0",
        gpus=tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{i:08x}-1111-4000-8000-000000000000",
                product_name="NVIDIA H100 80GB HBM3",
                brand="NVIDIA",
                architecture="Hopper",
                cuda_compute_capability="9.0",
                memory_bytes=memory,
                sm_count=132,
                numa_node=i // 4 % 2,
                pci_bus_id=f"{i // 256:04x}:{i % 256:02x}:00.0",
                pcie_root=f"pci{i // 256:04x}:{i % 256:02x}",
                minor_number=i,
                mig_capable=True,
                nvlink_peers=(),
                nvlink_domain=0,
            )
            for i in range(count)
        ),
    )
