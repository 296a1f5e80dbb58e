"""What this node publishes, kept current: its GPUs (hot-plug included) and their device taints.

Why: three producers change what the node should say about its GPUs — the periodic rediscovery
(GPUs added or removed), the health monitor (XIDs, a GPU that stops answering, memory repair;
`kubelet_plugin.gpu_watch`) and time (quiet periods) — and three consumers must agree on it — the
slice publisher (devices and their taints), the Preparer (which GPUs exist) and the kubelet's
health stream. `NodeDevices` is the one place where they meet, under one lock.

Rules:
- A GPU the fresh enumeration no longer lists is *removed* (dropped from the slice) only when
  NVML enumerates no unreadable GPU; while NVML still counts GPUs it cannot read, the missing
  ones stay published (with their last known attributes), so the `unreachable` NoExecute taint
  the monitor puts on a GPU that fell off the bus reaches the scheduler and the eviction
  controller instead of the device silently disappearing.
- Every change of conditions is persisted (`kubelet_plugin.taint_store`) before it is published.
- `on_change` is called (outside the lock) after any change of what is published, so the
  publisher syncs now rather than at its next resync.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from dra_driver.gpu import GpuInfo, NodeInventory
from kubelet_plugin import taint_store
from kubelet_plugin.health import HealthBoard
from kubelet_plugin.taints import Change, TaintState

log = logging.getLogger(__name__)


def published_inventory(
    fresh: NodeInventory, previous: NodeInventory
) -> tuple[NodeInventory, list[GpuInfo]]:
    """(what to publish, GPUs removed from the node) after a rediscovery (see module rules)."""
    present = {gpu.uuid for gpu in fresh.gpus}
    missing = [gpu for gpu in previous.gpus if gpu.uuid not in present]
    if fresh.unreadable_gpus <= 0:
        return fresh, missing
    kept = missing[: fresh.unreadable_gpus]
    gpus = sorted((*fresh.gpus, *kept), key=lambda gpu: (gpu.index, gpu.uuid))
    return fresh.model_copy(update={"gpus": tuple(gpus)}), missing[len(kept) :]


class NodeDevices:
    """The published GPUs, their conditions and the kubelet health board; thread-safe."""

    def __init__(
        self,
        inventory: NodeInventory,
        *,
        driver: str,
        state: TaintState,
        store_path: str | None,
        board: HealthBoard | None = None,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.driver = driver
        self._state = state
        self._store_path = store_path
        self._board = board
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.Lock()
        self._published = inventory
        self._refresh_board()

    # ---- what consumers read -------------------------------------------------------------------

    def inventory(self) -> NodeInventory:
        with self._lock:
            return self._published

    def uuids(self) -> list[str]:
        with self._lock:
            return [gpu.uuid for gpu in self._published.gpus]

    def taints(self) -> dict[str, list[dict[str, Any]]]:
        """Device name -> its DRA taints (devices of this node only)."""
        with self._lock:
            by_uuid = self._state.taints(self.driver)
            return {
                gpu.device_name: by_uuid[gpu.uuid]
                for gpu in self._published.gpus
                if gpu.uuid in by_uuid
            }

    # ---- producers -----------------------------------------------------------------------------

    def rediscovered(self, fresh: NodeInventory) -> bool:
        """Fold a fresh enumeration in; True if what is published changed."""
        with self._lock:
            published, removed = published_inventory(fresh, self._published)
            changes = self._state.on_enumeration(
                present=[gpu.uuid for gpu in fresh.gpus], removed=[gpu.uuid for gpu in removed]
            )
            for gpu in removed:
                log.warning("%s (%s) was removed from the node", gpu.device_name, gpu.uuid)
            moved = _identity(published) != _identity(self._published)
            for gpu in published.gpus:
                if gpu.uuid not in {g.uuid for g in self._published.gpus}:
                    log.info("%s (%s) was added to the node", gpu.device_name, gpu.uuid)
            self._published = published
            self._persist(changes)
        self._refresh_board()  # also after a failed rediscovery made everything UNKNOWN
        if moved or changes:
            self._on_change()
        return moved or bool(changes)

    def xid(self, uuid: str, xid: int) -> None:
        self._apply(lambda now: self._state.on_xid(uuid, xid, now), f"XID {xid} on {uuid}")

    def probe(self, uuid: str, *, lost: bool, error: str) -> None:
        self._apply(lambda now: self._state.on_probe(uuid, lost=lost, error=error, now=now))

    def memory(self, uuid: str, *, pending: bool, failed: bool) -> None:
        self._apply(
            lambda now: self._state.on_memory(uuid, pending=pending, failed=failed, now=now)
        )

    def expire(self) -> None:
        self._apply(self._state.expire)

    # ---- internals -----------------------------------------------------------------------------

    def _apply(self, step: Callable[[float], list[Change]], seen: str = "") -> None:
        with self._lock:
            changes = step(self._clock())
            self._persist(changes)
        if seen and not changes:
            log.info("%s: no new condition (application error, or already tainted)", seen)
        if changes:
            self._refresh_board()
            self._on_change()

    def _persist(self, changes: Sequence[Change]) -> None:
        """Log and save (called under the lock, so saves happen in change order)."""
        for change in changes:
            cond = change.condition
            taint = f"{self.driver}/{cond.key}={cond.value}:{cond.effect}"
            if change.added:
                log.error("GPU %s tainted %s: %s", cond.uuid, taint, cond.message)
            else:
                log.warning("GPU %s: taint %s lifted", cond.uuid, taint)
        if changes and self._store_path is not None:
            try:
                taint_store.save(self._store_path, self._state)
            except OSError as exc:  # keep tainting in memory; the next change retries the save
                log.error("cannot save device health to %s: %s", self._store_path, exc)

    def _refresh_board(self) -> None:
        if self._board is None:
            return
        with self._lock:
            published = self._published
            reasons = {
                gpu.device_name: "; ".join(
                    c.message or f"{c.key}={c.value}" for c in self._state.conditions(gpu.uuid)
                )
                for gpu in published.gpus
                if self._state.conditions(gpu.uuid)
            }
        self._board.observe(published)
        for change in self._board.set_tainted(reasons):
            log.info("device %s health: %s (%s)", change.device, change.status, change.message)


def _identity(inventory: NodeInventory) -> list[tuple[str, str]]:
    return sorted((gpu.uuid, gpu.device_name) for gpu in inventory.gpus)
