"""Hand-made claim regions (the shared accounting file vgpu_hook creates in a claim dir).

One builder for the tests that need a region without running a hooked CUDA process: the
governor's unit tests and the plugin-process test of the governor's wiring.
"""

from __future__ import annotations

from pathlib import Path

from kubelet_plugin import region as rg


def write_region(path: Path, uuid: str, cores: int, *, pid: int = 0, rate: int = 0) -> Path:
    """A one-device region as the hook would have created it: `pid` in the first slot, the
    device's current refill `rate` (0 = the hook has not paced it yet)."""
    layout = rg.RegionLayout()
    layout.magic, layout.version, layout.size = rg.REGION_MAGIC, rg.REGION_VERSION, rg.REGION_SIZE
    layout.device_count, layout.ready, layout.slot_hwm = 1, 1, 1
    layout.devices[0].uuid = uuid.encode()
    layout.devices[0].cores = cores
    layout.devices[0].rate = rate
    layout.slots[0].pid = pid
    path.write_bytes(bytes(layout))
    return path
