"""The health monitor's NVML side: XID events, a readability probe and memory-repair status.

A thread body (`watch_gpus`) started by the kubelet plugin when health is on. It holds one NVML
session for its lifetime and, until `stop` is set, as the supervised loop `gpu-health`
(`dra_driver.supervision`: a step that raises is logged with its traceback, counted and backed
off; no step finished within `DEADLINE_S` is a stall and the plugin restarts):
- waits for critical-error (XID) events of every watched GPU, `poll_ms` at a time;
- every `probe_s` asks each watched GPU something cheap (total memory): GPU_IS_LOST means it
  fell off the bus, another error that it cannot be read, an answer that it is fine again;
- on the same beat asks for retired-page / row-remapping status where the GPU reports it;
- lets the quiet period of recoverable XIDs run out (`DeviceHealth.expire`).
Every observation goes to `DeviceHealth` (`kubelet_plugin.devices`), which decides (through
`kubelet_plugin.taints`), persists and republishes.

Events are traced back to GPUs by handle identity, never by asking the GPU its UUID, because a GPU
that fell off the bus (XID 79) no longer answers. Which GPUs to watch comes from `uuids()` every
beat: a GPU that reappears is picked up; one that NVML enumerated only after this session started
cannot be (NVML enumerates at init), which docs/health.md lists as a limit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from dra_driver.nvml import (
    GPU_IS_LOST,
    DeviceHandle,
    EventSet,
    Nvml,
    NvmlError,
    NvmlNotSupported,
    NvmlUnavailable,
    PyNvml,
    session,
)
from dra_driver.supervision import Supervisor

log = logging.getLogger(__name__)

LOOP = "gpu-health"
# A step waits for XID events up to `poll_ms` and, every `probe_s`, asks each GPU two cheap
# questions: well under a second, seconds on a GPU in trouble. 60 s without a finished step is
# an NVML call that does not return: a stall.
DEADLINE_S = 60.0


class HealthSink(Protocol):
    """Where observations go (`kubelet_plugin.devices.DeviceHealth`)."""

    def xid(self, uuid: str, xid: int) -> None: ...
    def probe(self, uuid: str, *, lost: bool, error: str) -> None: ...
    def memory(self, uuid: str, *, pending: bool, failed: bool) -> None: ...
    def expire(self) -> None: ...


def watch_gpus(
    sink: HealthSink,
    uuids: Callable[[], Sequence[str]],
    stop: threading.Event,
    *,
    nvml: Nvml | None = None,
    poll_ms: int = 200,
    probe_s: float = 1.0,
    supervisor: Supervisor | None = None,
) -> None:
    """Observe the GPUs `uuids()` names until `stop` is set (a thread body; never raises).

    The loop is registered with `supervisor` once NVML is open and its event set created: a
    node without NVML runs without the watch (a warning), which is not a stall.
    """
    try:
        with session(nvml or PyNvml()) as opened:
            _Watch(sink, opened).run(uuids, stop, poll_ms, probe_s, supervisor or Supervisor())
    except NvmlUnavailable as exc:
        log.warning("GPU health watch disabled: %s", exc)
    except Exception:  # opening NVML or its event set failed: the loop never started
        log.exception("GPU health watch could not start")


class _Watch:
    def __init__(self, sink: HealthSink, nvml: Nvml) -> None:
        self.sink = sink
        self.nvml = nvml
        self.handles: dict[str, DeviceHandle] = {}
        self.by_handle: dict[DeviceHandle, str] = {}
        self.unwatchable: set[str] = set()

    def run(
        self,
        uuids: Callable[[], Sequence[str]],
        stop: threading.Event,
        poll_ms: int,
        probe_s: float,
        supervisor: Supervisor,
    ) -> None:
        events = self.nvml.create_event_set()
        loop = supervisor.register(LOOP, DEADLINE_S)
        next_probe = 0.0

        def step() -> None:
            nonlocal next_probe
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + probe_s
                self._follow(list(uuids()), events)
                self._probe_all()
                self.sink.expire()
            self._wait(events, poll_ms, stop)  # the step's pace: up to poll_ms

        try:
            supervisor.drive(loop, step, stop, period_s=0.0)
        finally:
            try:
                self.nvml.free_event_set(events)
            except NvmlError as exc:
                log.debug("freeing the NVML event set: %s", exc)

    def _follow(self, uuids: list[str], events: EventSet) -> None:
        """Open (and register XIDs for) GPUs not watched yet; forget those no longer wanted."""
        for uuid in set(self.handles) - set(uuids):
            self.by_handle.pop(self.handles.pop(uuid), None)
        for uuid in uuids:
            if uuid in self.handles:
                continue
            try:
                handle = self.nvml.device_by_uuid(uuid)
                self.nvml.register_xid_events(handle, events)
            except NvmlError as exc:
                if uuid not in self.unwatchable:
                    self.unwatchable.add(uuid)
                    log.warning("health of %s not watched (NVML: %s)", uuid, exc)
                continue
            self.unwatchable.discard(uuid)
            self.handles[uuid] = handle
            self.by_handle[handle] = uuid
            log.info("watching the health of %s", uuid)

    def _probe_all(self) -> None:
        for uuid, handle in list(self.handles.items()):
            try:
                self.nvml.memory_total(handle)
            except NvmlError as exc:
                self.sink.probe(uuid, lost=exc.code == GPU_IS_LOST, error=str(exc))
                continue
            self.sink.probe(uuid, lost=False, error="")
            try:
                repair = self.nvml.memory_repair(handle)
            except NvmlNotSupported:
                continue
            except NvmlError as exc:
                log.debug("memory repair status of %s: %s", uuid, exc)
                continue
            self.sink.memory(uuid, pending=repair.pending, failed=repair.failed)

    def _wait(self, events: EventSet, poll_ms: int, stop: threading.Event) -> None:
        if not self.handles:
            stop.wait(poll_ms / 1000)
            return
        try:
            event = self.nvml.wait_xid(events, poll_ms)
        except NvmlError as exc:
            log.warning("waiting for XID events failed: %s", exc)
            stop.wait(1.0)
            return
        if event is None:
            return
        uuid = self.by_handle.get(event.device)
        if uuid is None:
            log.warning("XID %d on a GPU this plugin does not publish; ignored", event.xid)
            return
        self.sink.xid(uuid, event.xid)
