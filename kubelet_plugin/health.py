"""Device health for the kubelet (DRAResourceHealth, KEP-4680): which GPUs are usable.

`HealthBoard` holds the latest status per device and wakes streams on change; `observe()` turns a
fresh NVML inventory into statuses (a GPU NVML no longer reports is UNHEALTHY; a failed discovery
makes every device UNKNOWN), and `set_tainted()` marks the devices that carry a device taint
UNHEALTHY with the taint's reason (decided in `kubelet_plugin.taints`, fed by
`kubelet_plugin.devices`, so a taint and the kubelet's view always agree and lift together).
`HealthServicer` streams the board to the kubelet over the v1 and v1alpha1 APIs (same messages,
different packages).
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

log = logging.getLogger(__name__)

UNKNOWN, HEALTHY, UNHEALTHY = 0, 1, 2
STATUS_NAMES = {UNKNOWN: "UNKNOWN", HEALTHY: "HEALTHY", UNHEALTHY: "UNHEALTHY"}
# How long the kubelet may trust a status without hearing from us (we re-check more often).
HEALTH_TIMEOUT_S = 60
_STREAM_POLL_S = 1.0


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
            name: DeviceStatus(name, HEALTHY, now, "reported by NVML") for name in self._known
        }
        self._version = 0
        self._changed = threading.Condition()
        self._tainted: dict[str, str] = {}  # device -> why (its device taints)
        self._last_inventory: NodeInventory | None = inventory
        self._last_error = ""

    def observe(self, inventory: NodeInventory | None, error: str = "") -> list[DeviceStatus]:
        """Fold one discovery result in; returns the statuses that changed."""
        now = int(time.time())
        seen = set() if inventory is None else {gpu.device_name for gpu in inventory.gpus}
        with self._changed:
            self._last_inventory, self._last_error = inventory, error
            self._known += sorted(seen - set(self._known))  # hot-plugged GPUs join the stream
            tainted = dict(self._tainted)
        fresh: dict[str, DeviceStatus] = {}
        for name in self._known:
            if name in tainted:
                fresh[name] = DeviceStatus(name, UNHEALTHY, now, tainted[name])
            elif inventory is None:
                fresh[name] = DeviceStatus(name, UNKNOWN, now, f"NVML discovery failed: {error}")
            elif name in seen:
                fresh[name] = DeviceStatus(name, HEALTHY, now, "reported by NVML")
            else:
                fresh[name] = DeviceStatus(name, UNHEALTHY, now, "no longer reported by NVML")
        with self._changed:
            changed = [
                s
                for n, s in fresh.items()
                if n not in self._statuses
                or (s.status, s.message) != (self._statuses[n].status, self._statuses[n].message)
            ]
            self._statuses = fresh
            if changed:
                self._version += 1
                self._changed.notify_all()
        return changed

    def set_tainted(self, tainted: dict[str, str]) -> list[DeviceStatus]:
        """Devices with device taints (device -> why) are UNHEALTHY; the others follow discovery."""
        with self._changed:
            self._tainted = dict(tainted)
            inventory, error = self._last_inventory, self._last_error
        return self.observe(inventory, error)

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
