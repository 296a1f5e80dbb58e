"""MIG (Multi-Instance GPU) as partitionable devices: the pure model (no NVML, no I/O).

A GPU in MIG mode is published as counters and devices that consume them (Kubernetes'
partitionable devices, `DRAPartitionableDevices`, beta and on since 1.36), so kube-scheduler
itself never hands out two overlapping placements, nor a whole GPU next to one of its instances:

- one counter set per GPU: `memory-slice-<i>` = 1 for each memory slice (a placement consumes
  exactly the slices it covers, so overlap is impossible by construction), `compute-slices` = the
  GPU's compute slices (7), and `instances-<profile>` = the profile's instance count only where
  that count is lower than what the memory slices alone allow (the A100/H100 `+me` profile: 1);
- one device per (profile, placement start), consuming its slices from that set;
- the whole GPU, consuming every memory slice and every compute slice.

Counter names, counter-set names and device names are DNS labels (API validation). Everything
here is derived from `MigLayout`, which discovery (`dra_driver.inventory`) reads from NVML.
docs/mig.md has the reasoning and the figures.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# How the kubelet plugin runs a GPU (`--mig-mode`, node label; docs/mig.md):
# off: MIG disabled, the GPU is a shareable device as without MIG;
# static: MIG enabled, the instances an operator created are published, nothing is created;
# dynamic: MIG enabled, every placement is published, instances are created at prepare and
#          destroyed at unprepare; the plugin owns every instance on the GPU.
MigStrategy = Literal["off", "static", "dynamic"]
STRATEGIES: tuple[MigStrategy, ...] = ("off", "static", "dynamic")

COUNTER_COMPUTE = "compute-slices"
MEMORY_SLICE_PREFIX = "memory-slice-"
INSTANCES_PREFIX = "instances-"
# The compute-instance profile that fills a GPU instance (NVML_COMPUTE_INSTANCE_PROFILE_*_SLICE
# index by slice count): we create one CI spanning its GI, as `nvidia-smi mig -cgi ... -C` does.
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}

_NOT_LABEL = re.compile(r"[^a-z0-9]+")


class MigProfile(BaseModel):
    """One GPU instance profile of a board (`nvmlDeviceGetGpuInstanceProfileInfoV`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description='without NVML\'s "MIG " prefix, e.g. "1g.10gb+me"')
    nvml_index: int = Field(ge=0, description="NVML_GPU_INSTANCE_PROFILE_* index")
    profile_id: int = Field(ge=0, description="the profile id instances report")
    slices: int = Field(gt=0, description="compute slices")
    memory_bytes: int = Field(gt=0)
    sm_count: int = Field(ge=0)
    instance_count: int = Field(gt=0)
    placement_size: int = Field(gt=0, description="memory slices one placement covers")
    starts: tuple[int, ...] = Field(description="valid placement starts")

    @property
    def label(self) -> str:
        """The profile as a DNS-label fragment: "1g.10gb+me" -> "1g10gbme"."""
        return _NOT_LABEL.sub("", self.name.lower())


class MigInstance(BaseModel):
    """A GPU instance that exists, with its (first) compute instance when it has one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gi_id: int = Field(ge=0)
    profile_id: int = Field(ge=0)
    start: int = Field(ge=0)
    size: int = Field(gt=0)
    ci_id: int | None = None
    uuid: str | None = Field(default=None, description='"MIG-..." of its compute instance')


class MigLayout(BaseModel):
    """What NVML says about a MIG-capable GPU's MIG side."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(description="current MIG mode")
    pending: bool = Field(description="pending MIG mode (applied when the GPU is idle)")
    memory_slices: int = Field(default=8, gt=0)
    compute_slices: int = Field(default=7, gt=0)
    profiles: tuple[MigProfile, ...] = ()
    instances: tuple[MigInstance, ...] = ()

    def profile_by_id(self, profile_id: int) -> MigProfile | None:
        return next((p for p in self.profiles if p.profile_id == profile_id), None)

    def full_profile(self) -> MigProfile | None:
        """The profile that spans the GPU (7g): what a whole-GPU allocation is prepared as."""
        full = [p for p in self.profiles if p.placement_size >= self.memory_slices]
        return max(full, key=lambda p: (p.slices, p.memory_bytes), default=None)


class Placement(BaseModel):
    """One publishable MIG device: a profile at a placement start on one GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str = Field(description="ResourceSlice device name")
    gpu_device: str = Field(description="the whole GPU's device name")
    gpu_uuid: str
    profile: MigProfile
    start: int
    instance: MigInstance | None = Field(default=None, description="static: the instance")

    @property
    def size(self) -> int:
        return self.profile.placement_size


def counter_set_name(gpu_device: str) -> str:
    """The counter set of a GPU: its device name (already a DNS label, unique in the pool)."""
    return gpu_device


def device_name(gpu_device: str, profile: MigProfile, start: int) -> str:
    """`gpu-3-mig-1g10gb-4`: stable for a placement, a DNS label (<= 63 characters)."""
    return f"{gpu_device}-mig-{profile.label}-{start}"


def _disjoint_placements(profile: MigProfile) -> int:
    """How many placements of `profile` fit side by side (greedy from the lowest start, exact
    on NVIDIA's aligned grid)."""
    count, free_from = 0, 0
    for start in sorted(profile.starts):
        if start >= free_from:
            count += 1
            free_from = start + profile.placement_size
    return count


def counters(layout: MigLayout) -> dict[str, int]:
    """The GPU's counter set (name -> value)."""
    result = {f"{MEMORY_SLICE_PREFIX}{i}": 1 for i in range(layout.memory_slices)}
    result[COUNTER_COMPUTE] = layout.compute_slices
    for profile in layout.profiles:
        if profile.instance_count < _disjoint_placements(profile):
            result[f"{INSTANCES_PREFIX}{profile.label}"] = profile.instance_count
    return result


def consumption(layout: MigLayout, profile: MigProfile, start: int) -> dict[str, int]:
    """What one placement consumes from its GPU's counter set."""
    used = {
        f"{MEMORY_SLICE_PREFIX}{i}": 1
        for i in range(start, min(start + profile.placement_size, layout.memory_slices))
    }
    used[COUNTER_COMPUTE] = profile.slices
    limited = f"{INSTANCES_PREFIX}{profile.label}"
    if limited in counters(layout):
        used[limited] = 1
    return used


def whole_gpu_consumption(layout: MigLayout) -> dict[str, int]:
    """The whole GPU takes every memory and compute slice: no MIG device fits beside it, and it
    fits only when no MIG device of the GPU is allocated."""
    used = {f"{MEMORY_SLICE_PREFIX}{i}": 1 for i in range(layout.memory_slices)}
    used[COUNTER_COMPUTE] = layout.compute_slices
    return used


def placements(
    gpu_device: str, gpu_uuid: str, layout: MigLayout, strategy: MigStrategy
) -> list[Placement]:
    """The MIG devices to publish for one GPU: dynamic, every (profile, start); static, the
    instances that exist (with a compute instance, so they can run work); off, none."""
    if strategy == "off" or not layout.enabled:
        return []
    if strategy == "dynamic":
        return [
            Placement(
                device=device_name(gpu_device, profile, start),
                gpu_device=gpu_device,
                gpu_uuid=gpu_uuid,
                profile=profile,
                start=start,
            )
            for profile in layout.profiles
            for start in profile.starts
        ]
    found = []
    for instance in layout.instances:
        profile = layout.profile_by_id(instance.profile_id)
        if profile is None or instance.uuid is None:
            continue
        found.append(
            Placement(
                device=device_name(gpu_device, profile, instance.start),
                gpu_device=gpu_device,
                gpu_uuid=gpu_uuid,
                profile=profile,
                start=instance.start,
                instance=instance,
            )
        )
    return found
