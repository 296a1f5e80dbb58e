"""Device health for the kubelet (DRAResourceHealth, KEP-4680): which GPUs are usable.

`HealthBoard` holds the latest status per device and wakes streams on change; `observe()` turns a
fresh NVML inventory into statuses (a GPU NVML no longer reports is UNHEALTHY; a failed discovery
makes every device UNKNOWN). `watch_xids()` listens for NVML critical-error events: a GPU with an
XID that signals a GPU fault (not an application fault) stays UNHEALTHY until the plugin restarts.
`HealthServicer` streams the board to the kubelet over the v1 and v1alpha1 APIs (same messages,
different packages). Fed by `kubelet_plugin.main`'s discovery loop and XID thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from dra_driver.gpu import NodeInventory
from dra_driver.nvml import DeviceHandle, Nvml, NvmlError, NvmlUnavailable, PyNvml, session

log = logging.getLogger(__name__)

UNKNOWN, HEALTHY, UNHEALTHY = 0, 1, 2
STATUS_NAMES = {UNKNOWN: "UNKNOWN", HEALTHY: "HEALTHY", UNHEALTHY: "UNHEALTHY"}
# How long the kubelet may trust a status without hearing from us (we re-check more often).
HEALTH_TIMEOUT_S = 60
_STREAM_POLL_S = 1.0
# XIDs raised by faulty applications rather than a faulty GPU (illegal address, MMU fault in a
# kernel, ...): the same default skip list as NVIDIA's device plugin. Any other XID taints the GPU.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def xid_is_critical(xid: int) -> bool:
    return xid not in APPLICATION_XIDS


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    device: str
    status: int
    updated: int  # unix seconds
    message: str = ""


class HealthBoard:
    """Latest status per device of one pool; thread-safe, versioned for change notification."""

    def __init__(self, pool: str, inventory: NodeInventory) -> None:
        self.pool = pool
        now = int(time.time())
        self._known = [gpu.device_name for gpu in inventory.gpus]
        self._statuses = {
            name: DeviceStatus(name, HEALTHY, now, "discovered by NVML") for name in self._known
        }
        self._version = 0
        self._changed = threading.Condition()
        self._tainted: dict[str, str] = {}  # device -> why (sticky until restart)

    def observe(self, inventory: NodeInventory | None, error: str = "") -> list[DeviceStatus]:
        """Fold one discovery result in; returns the statuses that changed."""
        now = int(time.time())
        seen = set() if inventory is None else {gpu.device_name for gpu in inventory.gpus}
        fresh: dict[str, DeviceStatus] = {}
        for name in self._known:
            if name in self._tainted:
                fresh[name] = DeviceStatus(name, UNHEALTHY, now, self._tainted[name])
            elif inventory is None:
                fresh[name] = DeviceStatus(name, UNKNOWN, now, f"NVML discovery failed: {error}")
            elif name in seen:
                fresh[name] = DeviceStatus(name, HEALTHY, now, "reported by NVML")
            else:
                fresh[name] = DeviceStatus(name, UNHEALTHY, now, "no longer reported by NVML")
        with self._changed:
            changed = [s for n, s in fresh.items() if s.status != self._statuses[n].status]
            self._statuses = fresh
            if changed:
                self._version += 1
                self._changed.notify_all()
        return changed

    def taint(self, device: str, message: str) -> bool:
        """Mark a device UNHEALTHY for good (a GPU fault); True if that changed its status."""
        with self._changed:
            if device not in self._statuses or device in self._tainted:
                return False
            self._tainted[device] = message
            self._statuses[device] = DeviceStatus(device, UNHEALTHY, int(time.time()), message)
            self._version += 1
            self._changed.notify_all()
            return True

    def snapshot(self) -> tuple[int, list[DeviceStatus]]:
        with self._changed:
            return self._version, list(self._statuses.values())

    def wait(self, version: int, timeout: float) -> int:
        """Block until the version moves past `version` (or timeout); return the current one."""
        with self._changed:
            self._changed.wait_for(lambda: self._version != version, timeout=timeout)
            return self._version


class HealthServicer:
    """NodeWatchResources: the full picture first, then every change, until the kubelet leaves."""

    def __init__(self, board: HealthBoard, messages: ModuleType) -> None:
        self._board = board
        self._pb = messages

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        version, statuses = self._board.snapshot()
        yield self._response(statuses)
        while context.is_active():
            new_version = self._board.wait(version, _STREAM_POLL_S)
            if new_version != version:
                version, statuses = self._board.snapshot()
                yield self._response(statuses)

    def _response(self, statuses: list[DeviceStatus]) -> Any:
        response = self._pb.NodeWatchResourcesResponse()
        for status in statuses:
            response.devices.add(
                device=self._pb.DeviceIdentifier(
                    pool_name=self._board.pool, device_name=status.device
                ),
                health=status.status,
                last_updated_time=status.updated,
                health_check_timeout_seconds=HEALTH_TIMEOUT_S,
                message=status.message,
            )
        return response


def watch_xids(
    board: HealthBoard,
    inventory: NodeInventory,
    stop: threading.Event,
    *,
    nvml: Nvml | None = None,
    poll_ms: int = 500,
) -> None:
    """Taint GPUs on critical XID events until `stop` is set (a thread body; never raises).

    Events are traced back to GPUs by handle identity rather than by asking NVML for the UUID,
    because a GPU that fell off the bus (XID 79) no longer answers queries.
    """
    try:
        with session(nvml or PyNvml()) as opened:
            _watch(board, inventory, stop, opened, poll_ms)
    except NvmlUnavailable as exc:
        log.warning("XID watch disabled: %s", exc)
    except Exception:
        log.exception("XID watch stopped")


def _watch(
    board: HealthBoard,
    inventory: NodeInventory,
    stop: threading.Event,
    nvml: Nvml,
    poll_ms: int,
) -> None:
    events = nvml.create_event_set()
    try:
        names: dict[DeviceHandle, str] = {}
        for gpu in inventory.gpus:
            try:
                handle = nvml.device_by_uuid(gpu.uuid)
                nvml.register_xid_events(handle, events)
            except NvmlError as exc:
                log.warning("XID events of %s not watched: %s", gpu.device_name, exc)
                continue
            names[handle] = gpu.device_name
        log.info("watching XID events of %s", ", ".join(names.values()) or "no GPU")
        while names and not stop.is_set():
            try:
                event = nvml.wait_xid(events, poll_ms)
            except NvmlError as exc:
                log.warning("waiting for XID events failed: %s", exc)
                stop.wait(1.0)
                continue
            if event is not None:
                _handle_xid(board, names.get(event.device), event.xid)
    finally:
        try:
            nvml.free_event_set(events)
        except NvmlError as exc:
            log.debug("freeing the NVML event set: %s", exc)


def _handle_xid(board: HealthBoard, device: str | None, xid: int) -> None:
    if device is None:
        log.warning("XID %d on a GPU this plugin does not publish; ignored", xid)
    elif not xid_is_critical(xid):
        log.info("XID %d on %s is an application error; the GPU stays healthy", xid, device)
    elif board.taint(device, f"XID {xid} (GPU error) reported by the driver"):
        log.error("XID %d on %s: device marked UNHEALTHY until the plugin restarts", xid, device)
