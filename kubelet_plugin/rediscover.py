"""GPU rediscovery in a child process: how the kubelet plugin notices hot-plugged GPUs.

Why a child: NVML enumerates GPUs when it is first initialised in a process and keeps that list
until the last `nvmlShutdown`. The plugin's health monitor and governor keep NVML initialised all
the time, so an in-process `discover()` would never see a GPU added after start-up (the real
library and the simulated one behave alike). `python -m dra_driver.inventory` in a fresh process
enumerates anew and prints the inventory as JSON.

Cost: about 70 ms of CPU for the smaller child, so it runs only when the in-process check
(`kubelet_plugin.gpu_changes`) says the GPUs may have changed. `Rediscovery` then first runs
`python -m kubelet_plugin.enumeration` (GPU count and UUIDs only, about a quarter of the CPU of a
full discovery) and runs the full discovery only when that answer changed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from dra_driver.gpu import NodeInventory
from dra_driver.inventory import InventoryError

TIMEOUT_S = 30.0


def _child(module: str, timeout: float) -> bytes:
    """stdout of `python -m <module>`; InventoryError with its last stderr line on failure."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", module], capture_output=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InventoryError(f"rediscovery child failed: {exc}") from exc
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        raise InventoryError(detail[-1] if detail else f"exit status {done.returncode}")
    return done.stdout


def discover_in_child(*, timeout: float = TIMEOUT_S) -> NodeInventory:
    """The node's inventory as a fresh process sees it; InventoryError says why not."""
    out = _child("dra_driver.inventory", timeout)
    try:
        return NodeInventory.model_validate_json(out)
    except ValueError as exc:
        raise InventoryError(f"rediscovery child printed no inventory: {exc}") from exc


def fingerprint_in_child(*, timeout: float = TIMEOUT_S) -> object:
    """What `python -m kubelet_plugin.enumeration` says (GPU count and readable UUIDs)."""
    try:
        return json.loads(_child("kubelet_plugin.enumeration", timeout))
    except ValueError as exc:
        raise InventoryError(f"enumeration child printed no JSON: {exc}") from exc


def fingerprint_of(inventory: NodeInventory) -> object:
    """What the enumeration child would print for the GPUs of `inventory` (count and readable
    UUIDs; a GPU readable there but left out of the inventory only costs a full discovery)."""
    return {
        "count": len(inventory.gpus) + inventory.unreadable_gpus,
        "uuids": sorted(gpu.uuid for gpu in inventory.gpus),
    }


class Rediscovery:
    """A rescan: the cheap enumeration every time, the full discovery only when it changed.

    `seed`: an inventory discovered just before (start-up), so the first rescan that finds the
    same GPUs needs no full discovery.
    """

    def __init__(self, seed: NodeInventory | None = None) -> None:
        self._lock = threading.Lock()
        self._last: tuple[object, NodeInventory] | None = (
            None if seed is None else (fingerprint_of(seed), seed)
        )

    def __call__(self) -> NodeInventory:
        with self._lock:
            seen = fingerprint_in_child()
            if self._last is not None and self._last[0] == seen:
                return self._last[1]
            inventory = discover_in_child()
            # Cache only what was stable across the discovery: a GPU removed or added between
            # the two children would otherwise pair an old answer with a new inventory, and the
            # change back would never be noticed.
            self._last = (seen, inventory) if fingerprint_in_child() == seen else None
            return inventory
