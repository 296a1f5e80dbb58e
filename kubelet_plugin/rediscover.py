"""GPU rediscovery in a child process: how the kubelet plugin notices hot-plugged GPUs.

Why a child: NVML enumerates GPUs when it is first initialised in a process and keeps that list
until the last `nvmlShutdown`. The plugin's health monitor and governor keep NVML initialised all
the time, so an in-process `discover()` would never see a GPU added after start-up (the real
library and the simulated one behave alike). `python -m dra_driver.inventory` in a fresh process
enumerates anew and prints the inventory as JSON. Cost: one short-lived interpreter per rescan
(`--rescan-seconds`, measured in docs/health.md).
"""

from __future__ import annotations

import subprocess
import sys

from dra_driver.gpu import NodeInventory
from dra_driver.inventory import InventoryError

TIMEOUT_S = 30.0


def discover_in_child(*, timeout: float = TIMEOUT_S) -> NodeInventory:
    """The node's inventory as a fresh process sees it; InventoryError says why not."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dra_driver.inventory"],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InventoryError(f"rediscovery child failed: {exc}") from exc
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        raise InventoryError(detail[-1] if detail else f"exit status {done.returncode}")
    try:
        return NodeInventory.model_validate_json(done.stdout)
    except ValueError as exc:
        raise InventoryError(f"rediscovery child printed no inventory: {exc}") from exc
