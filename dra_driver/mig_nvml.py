"""NVML's MIG calls, behind the same kind of seam as `dra_driver.nvml`.

A separate protocol (`MigNvml`, a superset of `Nvml`) rather than new methods on `Nvml`: the MIG
calls are used by discovery of MIG-capable GPUs and by the kubelet plugin's MIG paths only, and
every NVML double in the tests keeps implementing the plain protocol. `read_layout()` composes the
read calls into the pure `dra_driver.mig.MigLayout`.

Instance handles (`GpuInstance`, `ComputeInstance`) are opaque like device handles. Errors are the
seam's typed `NvmlError`s; the two codes MIG callers branch on are IN_USE (a GPU with processes,
an instance something runs on) and INSUFFICIENT_RESOURCES (a placement already taken).
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from dra_driver.mig import CI_PROFILE_BY_SLICES, MigInstance, MigLayout, MigProfile
from dra_driver.nvml import DeviceHandle, Nvml, NvmlError, NvmlNotSupported, PyNvml

log = logging.getLogger(__name__)

IN_USE = 19
INSUFFICIENT_RESOURCES = 23
INVALID_ARGUMENT = 2
# NVML_GPU_INSTANCE_PROFILE_* indices asked for: 0..0x11 covers every profile nvml.h of CUDA 12
# and 13 defines; a board answers NOT_SUPPORTED (or INVALID_ARGUMENT past its count) for the rest.
PROFILE_INDICES = range(0x12)
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class GpuInstance:
    """A GPU instance: its id, profile id and placement; `raw` is the binding's handle."""

    gi_id: int
    profile_id: int
    start: int
    size: int
    raw: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ComputeInstance:
    ci_id: int
    raw: object = field(default=None, compare=False, repr=False)


@runtime_checkable
class MigNvml(Nvml, Protocol):
    """`Nvml` plus the MIG calls. Every method raises NvmlError on failure."""

    def set_mig_mode(self, device: DeviceHandle, enabled: bool) -> int: ...
    def gi_profile(self, device: DeviceHandle, index: int) -> MigProfile | None: ...
    def gi_placements(self, device: DeviceHandle, profile_id: int) -> list[int]: ...
    def gpu_instances(self, device: DeviceHandle, profile_id: int) -> list[GpuInstance]: ...
    def create_gpu_instance(
        self, device: DeviceHandle, profile_id: int, start: int, size: int
    ) -> GpuInstance: ...
    def destroy_gpu_instance(self, instance: GpuInstance) -> None: ...
    def compute_instances(self, instance: GpuInstance) -> list[ComputeInstance]: ...
    def create_compute_instance(self, instance: GpuInstance, slices: int) -> ComputeInstance: ...
    def destroy_compute_instance(self, instance: ComputeInstance) -> None: ...
    def mig_device_uuids(self, device: DeviceHandle) -> dict[tuple[int, int], str]: ...


class PyMigNvml(PyNvml):
    """`MigNvml` over pynvml."""

    def set_mig_mode(self, device: DeviceHandle, enabled: bool) -> int:
        """The activation status: 0 when the mode is current now, IN_USE when it stays pending
        (the GPU has processes or instances)."""
        return int(self._call("nvmlDeviceSetMigMode", device.raw, 1 if enabled else 0))

    def gi_profile(self, device: DeviceHandle, index: int) -> MigProfile | None:
        """None for a profile index the board does not offer (NOT_SUPPORTED, or INVALID_ARGUMENT
        past the driver's profile count: the enumeration protocol of nvml.h)."""
        try:
            info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", device.raw, index)
        except NvmlNotSupported:
            return None
        except NvmlError as exc:
            if exc.code == INVALID_ARGUMENT:
                return None
            raise
        name = info.name.decode(errors="replace") if isinstance(info.name, bytes) else info.name
        profile_id = int(info.id)
        starts = self.gi_placements(device, profile_id)
        return MigProfile(
            name=str(name).removeprefix("MIG ").strip(),
            nvml_index=index,
            profile_id=profile_id,
            slices=int(info.sliceCount),
            memory_bytes=int(info.memorySizeMB) * MIB,
            sm_count=int(info.multiprocessorCount),
            instance_count=int(info.instanceCount),
            placement_size=self._placement_size(device, profile_id),
            starts=tuple(starts),
        )

    def _raw_placements(self, device: DeviceHandle, profile_id: int) -> list[tuple[int, int]]:
        lib = self._lib
        count = ctypes.c_uint(0)
        self._call(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            device.raw,
            profile_id,
            None,
            ctypes.byref(count),
        )
        if count.value == 0:
            return []
        buffer = (lib.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            device.raw,
            profile_id,
            buffer,
            ctypes.byref(count),
        )
        return [(int(p.start), int(p.size)) for p in buffer[: count.value]]

    def gi_placements(self, device: DeviceHandle, profile_id: int) -> list[int]:
        return [start for start, _size in self._raw_placements(device, profile_id)]

    def _placement_size(self, device: DeviceHandle, profile_id: int) -> int:
        sizes = {size for _start, size in self._raw_placements(device, profile_id)}
        return max(sizes, default=1)

    def gpu_instances(self, device: DeviceHandle, profile_id: int) -> list[GpuInstance]:
        lib = self._lib
        handles = (lib.c_nvmlGpuInstance_t * 8)()
        count = ctypes.c_uint(0)
        self._call(
            "nvmlDeviceGetGpuInstances", device.raw, profile_id, handles, ctypes.byref(count)
        )
        return [self._gi(handles[i]) for i in range(count.value)]

    def _gi(self, raw: object) -> GpuInstance:
        info = self._call("nvmlGpuInstanceGetInfo", raw)
        return GpuInstance(
            int(info.id),
            int(info.profileId),
            int(info.placement.start),
            int(info.placement.size),
            raw,
        )

    def create_gpu_instance(
        self, device: DeviceHandle, profile_id: int, start: int, size: int
    ) -> GpuInstance:
        placement = self._lib.c_nvmlGpuInstancePlacement_t(start, size)
        raw = self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            device.raw,
            profile_id,
            ctypes.byref(placement),
        )
        return self._gi(raw)

    def destroy_gpu_instance(self, instance: GpuInstance) -> None:
        self._call("nvmlGpuInstanceDestroy", instance.raw)

    def compute_instances(self, instance: GpuInstance) -> list[ComputeInstance]:
        lib = self._lib
        found: list[ComputeInstance] = []
        for index in sorted(set(CI_PROFILE_BY_SLICES.values())):
            try:
                profile = self._call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo", instance.raw, index, 0
                )
            except NvmlError:
                continue  # a profile this GI does not offer (bigger than it, or unknown)
            handles = (lib.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(0)
            self._call(
                "nvmlGpuInstanceGetComputeInstances",
                instance.raw,
                int(profile.id),
                handles,
                ctypes.byref(count),
            )
            for i in range(count.value):
                info = self._call("nvmlComputeInstanceGetInfo", handles[i])
                found.append(ComputeInstance(int(info.id), handles[i]))
        return found

    def create_compute_instance(self, instance: GpuInstance, slices: int) -> ComputeInstance:
        index = CI_PROFILE_BY_SLICES.get(slices)
        if index is None:
            raise NvmlError("create compute instance", INVALID_ARGUMENT, f"no {slices}-slice CI")
        profile = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", instance.raw, index, 0)
        raw = self._call("nvmlGpuInstanceCreateComputeInstance", instance.raw, int(profile.id))
        info = self._call("nvmlComputeInstanceGetInfo", raw)
        return ComputeInstance(int(info.id), raw)

    def destroy_compute_instance(self, instance: ComputeInstance) -> None:
        self._call("nvmlComputeInstanceDestroy", instance.raw)

    def mig_device_uuids(self, device: DeviceHandle) -> dict[tuple[int, int], str]:
        """(GI id, CI id) -> the MIG device's UUID ("MIG-...")."""
        result: dict[tuple[int, int], str] = {}
        count = _value(self._call("nvmlDeviceGetMaxMigDeviceCount", device.raw))
        for index in range(count):
            try:
                handle = self._call("nvmlDeviceGetMigDeviceHandleByIndex", device.raw, index)
            except NvmlError:
                break  # NOT_FOUND past the last MIG device
            gi = _value(self._call("nvmlDeviceGetGpuInstanceId", handle))
            ci = _value(self._call("nvmlDeviceGetComputeInstanceId", handle))
            uuid = self._call("nvmlDeviceGetUUID", handle)
            result[(gi, ci)] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return result


def _value(raw: object) -> int:
    """Some pynvml versions return ctypes integers."""
    value: object = getattr(raw, "value", raw)
    return int(str(value))


def read_profiles(nvml: MigNvml, device: DeviceHandle) -> tuple[MigProfile, ...]:
    """Every GPU instance profile the board offers."""
    found = (nvml.gi_profile(device, index) for index in PROFILE_INDICES)
    return tuple(profile for profile in found if profile is not None)


def read_instances(
    nvml: MigNvml, device: DeviceHandle, profiles: tuple[MigProfile, ...]
) -> tuple[MigInstance, ...]:
    """The GPU instances that exist, each with its first compute instance and MIG UUID."""
    uuids = nvml.mig_device_uuids(device)
    found: list[MigInstance] = []
    for profile in profiles:
        for gi in nvml.gpu_instances(device, profile.profile_id):
            cis = nvml.compute_instances(gi)
            ci_id = min((ci.ci_id for ci in cis), default=None)
            found.append(
                MigInstance(
                    gi_id=gi.gi_id,
                    profile_id=gi.profile_id,
                    start=gi.start,
                    size=gi.size,
                    ci_id=ci_id,
                    uuid=uuids.get((gi.gi_id, ci_id)) if ci_id is not None else None,
                )
            )
    return tuple(sorted(found, key=lambda i: (i.start, i.gi_id)))


def read_layout(nvml: MigNvml, device: DeviceHandle) -> MigLayout | None:
    """The MIG side of a GPU; None when the GPU has no MIG (NOT_SUPPORTED)."""
    try:
        current, pending = nvml.mig_mode(device)
    except NvmlNotSupported:
        return None
    if not current:
        return MigLayout(enabled=False, pending=bool(pending))
    profiles = read_profiles(nvml, device)
    return MigLayout(
        enabled=True,
        pending=bool(pending),
        profiles=profiles,
        instances=read_instances(nvml, device, profiles),
    )
