"""The NVML health monitor (kubelet_plugin.gpu_watch) against a scripted NVML double.

What this proves:
1. XID events are traced to GPUs by handle identity (a lost GPU cannot be asked its UUID).
2. The probe reports GPU_IS_LOST as lost, other errors as unreadable, answers as fine, and
   memory-repair status where NVML offers it (NOT_SUPPORTED is skipped silently).
3. GPUs that join `uuids()` later are watched from then on; ones that leave are forgotten.
4. A missing NVML disables the watch with a warning instead of killing the thread.
"""

from __future__ import annotations

import threading
from collections import deque

import pytest

from dra_driver import nvml
from dra_driver.nvml import (
    DeviceHandle,
    EventSet,
    MemoryRepair,
    NvmlError,
    NvmlNotSupported,
    NvmlUnavailable,
    XidEvent,
)
from kubelet_plugin.gpu_watch import watch_gpus


class ScriptedNvml:
    """The calls the monitor makes; anything else is absent on purpose."""

    def __init__(self, uuids: list[str], stop: threading.Event) -> None:
        self.handles = {u: DeviceHandle(i + 1) for i, u in enumerate(uuids)}
        self.events: deque[XidEvent] = deque()
        self.lost: set[str] = set()
        self.broken: set[str] = set()
        self.repair: dict[str, MemoryRepair] = {}
        self.registered: list[str] = []
        self.stop = stop
        self.waits = 0

    def init(self) -> None: ...
    def shutdown(self) -> None: ...

    def device_by_uuid(self, uuid: str) -> DeviceHandle:
        if uuid not in self.handles:
            raise NvmlError("nvmlDeviceGetHandleByUUID", 13, "Not Found")
        return self.handles[uuid]

    def _uuid(self, device: DeviceHandle) -> str:
        return next(u for u, h in self.handles.items() if h == device)

    def memory_total(self, device: DeviceHandle) -> int:
        uuid = self._uuid(device)
        if uuid in self.lost:
            raise NvmlError("nvmlDeviceGetMemoryInfo", nvml.GPU_IS_LOST, "GPU is lost")
        if uuid in self.broken:
            raise NvmlError("nvmlDeviceGetMemoryInfo", 999, "Unknown Error")
        return 1 << 30

    def memory_repair(self, device: DeviceHandle) -> MemoryRepair:
        uuid = self._uuid(device)
        if uuid not in self.repair:
            raise NvmlNotSupported("nvmlDeviceGetRemappedRows", nvml.NOT_SUPPORTED, "n/a")
        return self.repair[uuid]

    def create_event_set(self) -> EventSet:
        return EventSet("set")

    def register_xid_events(self, device: DeviceHandle, events: EventSet) -> None:
        self.registered.append(self._uuid(device))

    def wait_xid(self, events: EventSet, timeout_ms: int) -> XidEvent | None:
        self.waits += 1
        if self.events:
            return self.events.popleft()
        self.stop.set()  # script exhausted: end the run
        return None

    def free_event_set(self, events: EventSet) -> None: ...


class Sink:
    def __init__(self) -> None:
        self.seen: list[tuple[object, ...]] = []

    def xid(self, uuid: str, xid: int) -> None:
        self.seen.append(("xid", uuid, xid))

    def probe(self, uuid: str, *, lost: bool, error: str) -> None:
        self.seen.append(("probe", uuid, lost, bool(error)))

    def memory(self, uuid: str, *, pending: bool, failed: bool) -> None:
        self.seen.append(("memory", uuid, pending, failed))

    def expire(self) -> None:
        self.seen.append(("expire",))


def test_events_probes_and_memory_repair_reach_the_sink() -> None:
    stop = threading.Event()
    fake = ScriptedNvml(["GPU-a", "GPU-b", "GPU-c"], stop)
    fake.lost = {"GPU-b"}
    fake.broken = {"GPU-c"}
    fake.repair = {"GPU-a": MemoryRepair(pending=True, failed=False)}
    fake.events.extend([XidEvent(fake.handles["GPU-b"], 79), XidEvent(DeviceHandle(99), 48)])
    sink = Sink()
    watch_gpus(sink, lambda: ["GPU-a", "GPU-b", "GPU-c"], stop, nvml=fake, probe_s=3600)
    assert fake.registered == ["GPU-a", "GPU-b", "GPU-c"]
    assert sink.seen == [
        ("probe", "GPU-a", False, False),
        ("memory", "GPU-a", True, False),
        ("probe", "GPU-b", True, True),
        ("probe", "GPU-c", False, True),
        ("expire",),
        ("xid", "GPU-b", 79),  # by handle; the unknown handle's XID 48 is ignored
    ]


def test_gpus_joining_later_are_watched_and_leaving_ones_forgotten() -> None:
    stop = threading.Event()
    fake = ScriptedNvml(["GPU-a", "GPU-b"], stop)
    fake.events.extend([XidEvent(fake.handles["GPU-a"], 94)] * 3)
    wanted = [["GPU-a", "GPU-new"], ["GPU-a", "GPU-b"], ["GPU-b"]]
    sink = Sink()
    calls = iter(wanted + [["GPU-b"]] * 10)
    watch_gpus(sink, lambda: next(calls), stop, nvml=fake, probe_s=0)
    assert fake.registered == ["GPU-a", "GPU-b"]  # GPU-new cannot be opened: logged, skipped
    probes = [s[1] for s in sink.seen if s[0] == "probe"]
    assert probes[:4] == ["GPU-a", "GPU-a", "GPU-b", "GPU-b"]


def test_missing_nvml_disables_the_watch(caplog: pytest.LogCaptureFixture) -> None:
    class NoNvml(ScriptedNvml):
        def init(self) -> None:
            raise NvmlUnavailable("nvmlInit", 12, "Library Not Found")

    stop = threading.Event()
    watch_gpus(Sink(), list, stop, nvml=NoNvml([], stop))
    assert "GPU health watch disabled" in caplog.text
