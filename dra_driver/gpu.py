"""Typed description of a node's GPUs, as discovered through NVML.

Produced by `dra_driver.inventory.discover()` and consumed by the ResourceSlice builder
(`dra_driver.slices`), the kubelet plugin's prepare path (UUIDs, minor numbers, capacity for the
overbooking guard) and the governor. Pure data: no NVML here, so every consumer is testable with
hand-made inventories.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dra_driver import names
from dra_driver.mig import MigLayout, MigStrategy


class GpuInfo(BaseModel):
    """One physical GPU. Field names follow the published attribute names where one exists."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, description="NVML index")
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str = Field(description='"major.minor", e.g. "9.0"')
    memory_bytes: int = Field(gt=0)
    sm_count: int = Field(ge=0)
    numa_node: int | None = None
    pci_bus_id: str = Field(description='domain:bus:device.function, e.g. "0000:18:00.0"')
    pcie_root: str | None = Field(default=None, description='PCIe root complex, e.g. "pci0000:17"')
    minor_number: int = Field(ge=0)
    mig_capable: bool = False
    nvlink_peers: tuple[int, ...] = Field(
        default=(), description="indices of NVLink-reachable GPUs"
    )
    nvlink_domain: int | None = Field(
        default=None, description="GPUs mutually reachable over NVLink share a value"
    )
    name: str | None = Field(
        default=None,
        description="device name the node assigned for good (dra_driver.inventory.assign_names)",
    )
    mig: MigLayout | None = Field(
        default=None, description="MIG mode, profiles and instances (MIG-capable GPUs)"
    )
    mig_strategy: MigStrategy = Field(
        default="off",
        description="how the plugin runs MIG on this GPU (kubelet_plugin.mig_mode); set after "
        "discovery, which cannot know it",
    )

    @property
    def device_name(self) -> str:
        """The ResourceSlice device name: the node's stable assignment, else `gpu-<index>`."""
        return self.name or names.device_name(self.index)


class NodeInventory(BaseModel):
    """Everything NVML told us about one node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    driver_version: str
    cuda_driver_version: str = Field(description='"major.minor", e.g. "13.0"')
    gpus: tuple[GpuInfo, ...] = ()
    unreadable_gpus: int = Field(
        default=0, ge=0, description="GPUs NVML enumerates but could not be read (left out)"
    )

    def by_device_name(self) -> dict[str, GpuInfo]:
        return {gpu.device_name: gpu for gpu in self.gpus}
