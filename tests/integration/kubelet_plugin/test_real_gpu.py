"""What only a real NVIDIA node can confirm about the specs the plugin writes.

The CDI device nodes carry explicit majors and minors (`/dev/nvidia<minor>` 195:minor,
`/dev/nvidiactl` 195:255, uvm majors from /proc/devices). On a real node the host's device files
must agree, or containers would get the wrong GPU. The simulated path covers the same logic in
tests/unit/dra_driver/test_cdi.py (control nodes from a /proc/devices text) and the conformance
tests (the injected nodes); these tests compare it with the real kernel's view.
"""

from __future__ import annotations

import os
import stat

import pytest

from dra_driver import cdi

pytestmark = pytest.mark.gpu


def _char_device(path: str) -> tuple[int, int]:
    status = os.stat(path)
    assert stat.S_ISCHR(status.st_mode), f"{path} is not a character device"
    return os.major(status.st_rdev), os.minor(status.st_rdev)


def test_gpu_device_nodes_match_nvml_minor_numbers() -> None:
    from dra_driver.inventory import discover

    inventory = discover()
    assert inventory.gpus, "a GPU node must have GPUs"
    for gpu in inventory.gpus:
        assert _char_device(f"/dev/nvidia{gpu.minor_number}") == (
            cdi.NVIDIA_MAJOR,
            gpu.minor_number,
        )


def test_control_device_nodes_match_the_host() -> None:
    with open("/proc/devices", encoding="utf-8") as handle:
        nodes = cdi.control_device_nodes(handle.read())
    for node in nodes:
        assert _char_device(node.path) == (node.major, node.minor)
