"""Stable device names (dra_driver.inventory.assign_names, kubelet_plugin.device_names).

What this proves:
1. A first start names GPUs `gpu-<index>` (what earlier versions published).
2. Hot-removing a GPU shifts the NVML indices of the GPUs after it, but not their names; a new GPU
   never takes a name another GPU ever had.
3. The names survive a restart (the file), a corrupt file stops the plugin with a message saying
   what to do, and the file is private (0600).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.gpu import NodeInventory
from dra_driver.inventory import assign_names
from kubelet_plugin.device_names import DeviceNaming, DeviceNamingError
from tests.fixtures.inventories import synthetic_inventory


def reindexed(inventory: NodeInventory, keep: list[int]) -> NodeInventory:
    """The inventory a fresh NVML enumeration gives after the other GPUs were removed."""
    gpus = [inventory.gpus[i].model_copy(update={"index": n}) for n, i in enumerate(keep)]
    return inventory.model_copy(update={"gpus": tuple(gpus)})


def test_first_names_follow_the_index_and_removal_renames_nothing() -> None:
    inv = synthetic_inventory(4)
    named, known = assign_names(inv, {})
    assert [g.device_name for g in named.gpus] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    after_removal, known = assign_names(reindexed(inv, [0, 2, 3]), known)
    assert [(g.index, g.device_name) for g in after_removal.gpus] == [
        (0, "gpu-0"),
        (1, "gpu-2"),
        (2, "gpu-3"),
    ]
    stranger = synthetic_inventory(6).gpus[5].model_copy(update={"index": 1})
    newcomer = inv.model_copy(update={"gpus": (inv.gpus[0], stranger)})
    named, known = assign_names(newcomer, known)
    assert [g.device_name for g in named.gpus] == ["gpu-0", "gpu-4"]  # gpu-1 stays reserved


def test_names_survive_a_restart(tmp_path: Path) -> None:
    inv = synthetic_inventory(3)
    DeviceNaming(str(tmp_path)).assign(reindexed(inv, [2, 1]))  # first seen in another order
    assert (tmp_path / "device-names.json").stat().st_mode & 0o777 == 0o600
    named = DeviceNaming(str(tmp_path)).assign(inv)
    assert [g.device_name for g in named.gpus] == ["gpu-2", "gpu-1", "gpu-0"]


def test_a_corrupt_name_file_stops_with_advice(tmp_path: Path) -> None:
    (tmp_path / "device-names.json").write_text("[1, 2")
    with pytest.raises(DeviceNamingError, match="restore it, or delete it"):
        DeviceNaming(str(tmp_path))
    (tmp_path / "device-names.json").write_text('{"version": 9, "names": {}}')
    with pytest.raises(DeviceNamingError, match="not a version 1"):
        DeviceNaming(str(tmp_path))
