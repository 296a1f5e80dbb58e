"""The ResourceSlice content of GPUs in MIG mode: counter sets and the devices that consume them.

Pure, called by `dra_driver.slices.build_slices` for every GPU whose `mig_strategy` is not off
and whose MIG mode is on (docs/mig.md, "Published devices"):

- `counter_set(gpu)`: the GPU's `sharedCounters` entry (`dra_driver.mig.counters`);
- `whole_gpu_device(...)`: the GPU itself, exclusive (no `allowMultipleAllocations`: a GPU in MIG
  mode runs no shares, since CUDA outside an instance cannot use it) and consuming every slice, so
  kube-scheduler refuses it while any of its MIG devices is allocated, and the reverse. Only with
  the dynamic strategy, where prepare can turn it into the full-GPU instance; a static GPU's
  instances are the operator's, and nothing could serve a whole-GPU claim there;
- `mig_devices(...)`: one device per placement (dynamic) or per existing instance (static).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver import mig, names
from dra_driver.gpu import GpuInfo

JSON = dict[str, Any]


def mig_active(gpu: GpuInfo) -> bool:
    """True when the GPU is published as partitionable devices."""
    return gpu.mig_strategy != "off" and gpu.mig is not None and gpu.mig.enabled


def counter_set(gpu: GpuInfo) -> JSON:
    assert gpu.mig is not None
    return {
        "name": mig.counter_set_name(gpu.device_name),
        "counters": {name: {"value": str(value)} for name, value in mig.counters(gpu.mig).items()},
    }


def _consumes(gpu: GpuInfo, used: Mapping[str, int]) -> list[JSON]:
    return [
        {
            "counterSet": mig.counter_set_name(gpu.device_name),
            "counters": {name: {"value": str(value)} for name, value in used.items()},
        }
    ]


def whole_gpu_device(gpu: GpuInfo, attributes: JSON, taints: Sequence[JSON]) -> JSON:
    """The GPU as one exclusive device consuming all its counters (plain capacity values)."""
    assert gpu.mig is not None
    device: JSON = {
        "name": gpu.device_name,
        "attributes": attributes,
        "capacity": {
            names.CAPACITY_MEMORY: {"value": str(gpu.memory_bytes)},
            names.CAPACITY_CORES: {"value": "100"},
        },
        "consumesCounters": _consumes(gpu, mig.whole_gpu_consumption(gpu.mig)),
    }
    if taints:
        device["taints"] = [dict(t) for t in taints]
    return device


# Attributes of the whole GPU a MIG device carries too (same meaning: its parent's).
_INHERITED = (
    "index",
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "numaNode",
    "nvlinkDomain",
    names.ATTR_PCI_BUS_ID,
    names.ATTR_PCIE_ROOT,
)


def mig_devices(gpu: GpuInfo, gpu_attributes: JSON, taints: Sequence[JSON]) -> list[JSON]:
    """One device per placement; a GPU's taints apply to its MIG devices as well."""
    assert gpu.mig is not None
    layout = gpu.mig
    devices = []
    for placement in mig.placements(gpu.device_name, gpu.uuid, layout, gpu.mig_strategy):
        profile = placement.profile
        attributes: JSON = {k: gpu_attributes[k] for k in _INHERITED if k in gpu_attributes}
        attributes.update(
            {
                "type": {"string": "mig"},
                "profile": {"string": profile.name},
                "placementStart": {"int": placement.start},
                "placementSize": {"int": profile.placement_size},
                "parentUUID": {"string": gpu.uuid},
                "memoryBytes": {"int": profile.memory_bytes},
                "smCount": {"int": profile.sm_count},
            }
        )
        if placement.instance is not None and placement.instance.uuid:
            attributes["migUUID"] = {"string": placement.instance.uuid}
        device: JSON = {
            "name": placement.device,
            "attributes": attributes,
            "capacity": {names.CAPACITY_MEMORY: {"value": str(profile.memory_bytes)}},
            "consumesCounters": _consumes(gpu, mig.consumption(layout, profile, placement.start)),
        }
        if taints:
            device["taints"] = [dict(t) for t in taints]
        devices.append(device)
    return devices
