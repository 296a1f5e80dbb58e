"""The one seam between vgpu-dra and NVML: a typed `Nvml` protocol and its pynvml implementation.

Why: discovery (`dra_driver.inventory`), device health (`kubelet_plugin.health`) and the compute
governor (`kubelet_plugin.governor`) all talk to NVML. Each used to call pynvml directly, with its
own `nvmlInit`, its own untyped handles and its own reading of `NVMLError.value`. Here the
protocol lists exactly the NVML calls the project makes, with plain Python types in and out;
`PyNvml` implements it over pynvml (nvidia-ml-py), which loads `libnvidia-ml.so.1` through the
normal loader search, so the simulated GPUs of the test bed and a real driver meet the same code.
Unit tests implement the protocol with hand-made doubles.

Rules of the seam:
- Device and event-set handles are opaque (`DeviceHandle`, `EventSet`); only the implementation
  that made one looks inside. Two handles of one GPU compare equal (by NVML's handle address),
  which is how an XID event is traced back to a GPU that may no longer answer queries.
- Every failure is an `NvmlError` carrying NVML's return code; `NvmlNotSupported` is the one
  callers branch on (a query this GPU or driver does not offer), `NvmlUnavailable` means NVML
  itself cannot start (no driver, no library on the loader path).
- `session()` pairs `init()` with `shutdown()` (NVML counts them), so a caller cannot leak an
  initialisation or let a failing shutdown hide the real result.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

# nvmlReturn_t values the seam gives a meaning to.
NOT_SUPPORTED = 3
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
NOT_FOUND = 6
GPU_IS_LOST = 15


class NvmlError(Exception):
    """An NVML call failed; `code` is NVML's return code (None when NVML gave none)."""

    def __init__(self, call: str, code: int | None, detail: str) -> None:
        super().__init__(f"{call}: {detail}")
        self.call = call
        self.code = code


class NvmlNotSupported(NvmlError):
    """The GPU or driver does not offer this query (NOT_SUPPORTED, FUNCTION_NOT_FOUND)."""


class NvmlNotFound(NvmlError):
    """NVML has nothing to report for the query (NOT_FOUND): e.g. no utilisation sample period
    completed since the given timestamp, which real drivers report between sample periods."""


class NvmlUnavailable(NvmlError):
    """NVML cannot be initialised: no NVIDIA driver, or no libnvidia-ml.so.1 to load."""


@dataclass(frozen=True, slots=True)
class DeviceHandle:
    """One GPU as NVML names it. `address` identifies it; `raw` is the binding's own handle."""

    address: int
    raw: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class EventSet:
    """An NVML event set (opaque outside the implementation that created it)."""

    raw: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical XID error the driver reported for `device`."""

    device: DeviceHandle
    xid: int


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """Device memory one process holds on a GPU (host pid; bytes, 0 when NVML cannot say)."""

    pid: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class MemoryRepair:
    """Retired pages / row remapping: a GPU reset is `pending`, or remapping has `failed`."""

    pending: bool
    failed: bool


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """One process's share of a GPU over the sampled window (host pid)."""

    pid: int
    sm_util: int  # SM utilisation points over the sample window


class Nvml(Protocol):
    """The NVML calls vgpu-dra makes. Every method raises NvmlError (or a subclass) on failure."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...

    # node
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...
    def device_count(self) -> int: ...
    def device_by_index(self, index: int) -> DeviceHandle: ...
    def device_by_uuid(self, uuid: str) -> DeviceHandle: ...

    # one GPU (discovery)
    def uuid(self, device: DeviceHandle) -> str: ...
    def name(self, device: DeviceHandle) -> str: ...
    def brand(self, device: DeviceHandle) -> int: ...
    def architecture(self, device: DeviceHandle) -> int: ...
    def pci_bus_id(self, device: DeviceHandle) -> str: ...
    def cuda_compute_capability(self, device: DeviceHandle) -> tuple[int, int]: ...
    def memory_total(self, device: DeviceHandle) -> int: ...
    def memory_used(self, device: DeviceHandle) -> int: ...
    def multiprocessor_count(self, device: DeviceHandle) -> int: ...
    def cuda_cores(self, device: DeviceHandle) -> int: ...
    def numa_node(self, device: DeviceHandle) -> int: ...
    def minor_number(self, device: DeviceHandle) -> int: ...
    def mig_mode(self, device: DeviceHandle) -> tuple[int, int]: ...

    # topology
    def nvlink_active(self, device: DeviceHandle, link: int) -> bool: ...
    def nvlink_remote_type(self, device: DeviceHandle, link: int) -> int: ...
    def nvlink_remote_bus_id(self, device: DeviceHandle, link: int) -> str: ...
    def p2p_status(self, first: DeviceHandle, second: DeviceHandle, caps_index: int) -> int: ...
    def common_ancestor(self, first: DeviceHandle, second: DeviceHandle) -> int: ...

    # utilisation (governor)
    def gpu_utilization(self, device: DeviceHandle) -> int: ...
    def process_utilization(
        self, device: DeviceHandle, since_us: int
    ) -> list[ProcessUtilization]: ...

    # enforcement (governor)
    def running_processes(self, device: DeviceHandle) -> list[ProcessMemory]: ...

    # health
    def memory_repair(self, device: DeviceHandle) -> MemoryRepair: ...

    # XID events (health)
    def create_event_set(self) -> EventSet: ...
    def register_xid_events(self, device: DeviceHandle, events: EventSet) -> None: ...
    def wait_xid(self, events: EventSet, timeout_ms: int) -> XidEvent | None: ...
    def free_event_set(self, events: EventSet) -> None: ...


@contextmanager
def session(nvml: Nvml) -> Iterator[Nvml]:
    """`init()` on entry, `shutdown()` on exit; a failing shutdown is logged, never raised."""
    nvml.init()
    try:
        yield nvml
    finally:
        try:
            nvml.shutdown()
        except NvmlError as exc:
            log.warning("nvmlShutdown failed: %s", exc)


# ---- the pynvml implementation --------------------------------------------------------------


# Typed errors by NVML return code; any other code is a plain NvmlError.
_ERROR_KINDS: dict[int, type[NvmlError]] = {
    NOT_SUPPORTED: NvmlNotSupported,
    FUNCTION_NOT_FOUND: NvmlNotSupported,
    NOT_FOUND: NvmlNotFound,
}


class PyNvml:
    """`Nvml` over pynvml (nvidia-ml-py): translates its errors and hides its handles."""

    def __init__(self) -> None:
        import pynvml  # a core dependency; imported here so the protocol costs nothing to import

        self._lib: Any = pynvml

    def _call(self, name: str, *args: Any) -> Any:
        """pynvml.<name>(*args) with NVMLError turned into our typed errors."""
        try:
            return getattr(self._lib, name)(*args)
        except self._lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            code = code if isinstance(code, int) else None
            kind = _ERROR_KINDS.get(code, NvmlError) if code is not None else NvmlError
            raise kind(name, code, str(exc)) from exc

    def init(self) -> None:
        try:
            self._call("nvmlInit")
        except NvmlError as exc:
            raise NvmlUnavailable(
                "nvmlInit",
                exc.code,
                f"{exc}; is the NVIDIA driver installed and libnvidia-ml.so.1 on the loader "
                "path (LD_LIBRARY_PATH)?",
            ) from exc

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int:
        return int(self._call("nvmlSystemGetCudaDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def device_by_index(self, index: int) -> DeviceHandle:
        return _device(self._call("nvmlDeviceGetHandleByIndex", index))

    def device_by_uuid(self, uuid: str) -> DeviceHandle:
        return _device(self._call("nvmlDeviceGetHandleByUUID", uuid.encode()))

    def uuid(self, device: DeviceHandle) -> str:
        return _text(self._call("nvmlDeviceGetUUID", device.raw))

    def name(self, device: DeviceHandle) -> str:
        return _text(self._call("nvmlDeviceGetName", device.raw))

    def brand(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetBrand", device.raw))

    def architecture(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetArchitecture", device.raw))

    def pci_bus_id(self, device: DeviceHandle) -> str:
        return _text(self._call("nvmlDeviceGetPciInfo", device.raw).busId)

    def cuda_compute_capability(self, device: DeviceHandle) -> tuple[int, int]:
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", device.raw)
        return int(major), int(minor)

    def memory_total(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetMemoryInfo", device.raw).total)

    def memory_used(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetMemoryInfo", device.raw).used)

    def multiprocessor_count(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetAttributes_v2", device.raw).multiprocessorCount)

    def cuda_cores(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetNumGpuCores", device.raw))

    def numa_node(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetNumaNodeId", device.raw))

    def minor_number(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetMinorNumber", device.raw))

    def mig_mode(self, device: DeviceHandle) -> tuple[int, int]:
        current, pending = self._call("nvmlDeviceGetMigMode", device.raw)
        return int(current), int(pending)

    def nvlink_active(self, device: DeviceHandle, link: int) -> bool:
        return bool(self._call("nvmlDeviceGetNvLinkState", device.raw, link))

    def nvlink_remote_type(self, device: DeviceHandle, link: int) -> int:
        return int(self._call("nvmlDeviceGetNvLinkRemoteDeviceType", device.raw, link))

    def nvlink_remote_bus_id(self, device: DeviceHandle, link: int) -> str:
        return _text(self._call("nvmlDeviceGetNvLinkRemotePciInfo", device.raw, link).busId)

    def p2p_status(self, first: DeviceHandle, second: DeviceHandle, caps_index: int) -> int:
        return int(self._call("nvmlDeviceGetP2PStatus", first.raw, second.raw, caps_index))

    def common_ancestor(self, first: DeviceHandle, second: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetTopologyCommonAncestor", first.raw, second.raw))

    def gpu_utilization(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetUtilizationRates", device.raw).gpu)

    def process_utilization(self, device: DeviceHandle, since_us: int) -> list[ProcessUtilization]:
        samples = self._call("nvmlDeviceGetProcessUtilization", device.raw, since_us)
        return [ProcessUtilization(int(s.pid), int(s.smUtil)) for s in samples]

    def running_processes(self, device: DeviceHandle) -> list[ProcessMemory]:
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", device.raw)
        return [ProcessMemory(int(p.pid), int(p.usedGpuMemory or 0)) for p in procs]

    def memory_repair(self, device: DeviceHandle) -> MemoryRepair:
        """Row remapping where the GPU has it (Ampere and later), else page retirement."""
        try:
            _corr, _unc, pending, failed = self._call("nvmlDeviceGetRemappedRows", device.raw)
            return MemoryRepair(bool(pending), bool(failed))
        except NvmlNotSupported:
            pass
        pending_pages = self._call("nvmlDeviceGetRetiredPagesPendingStatus", device.raw)
        return MemoryRepair(bool(pending_pages), False)

    def create_event_set(self) -> EventSet:
        return EventSet(self._call("nvmlEventSetCreate"))

    def register_xid_events(self, device: DeviceHandle, events: EventSet) -> None:
        kind = self._lib.nvmlEventTypeXidCriticalError
        self._call("nvmlDeviceRegisterEvents", device.raw, kind, events.raw)

    def wait_xid(self, events: EventSet, timeout_ms: int) -> XidEvent | None:
        try:
            event = self._call("nvmlEventSetWait_v2", events.raw, timeout_ms)
        except NvmlError as exc:
            if exc.code == TIMEOUT:
                return None
            raise
        return XidEvent(_device(event.device), int(event.eventData))

    def free_event_set(self, events: EventSet) -> None:
        self._call("nvmlEventSetFree", events.raw)


def _device(raw: Any) -> DeviceHandle:
    address = ctypes.cast(raw, ctypes.c_void_p).value
    return DeviceHandle(int(address or 0), raw)


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
