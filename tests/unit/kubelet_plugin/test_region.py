"""The Python mirror of the hook's shared region must match the C layout byte for byte.

Proves: (1) every field offset and struct size in kubelet_plugin/region.py equals what the C
compiler computes for vgpu_hook/include/region.h (printed by vgpu_hook/build/region_layout);
(2) a region file is read back with per-device usage summed over process slots; (3) files of
another size or version are refused with an error naming the path.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path

import pytest

from kubelet_plugin import region as rg

REPO = Path(__file__).resolve().parents[3]
LAYOUT_TOOL = REPO / "vgpu_hook" / "build" / "region_layout"


@pytest.fixture(scope="module")
def c_layout() -> dict[str, object]:
    subprocess.run(["make", "-s", "-C", str(REPO / "vgpu_hook"), "build/region_layout"], check=True)
    out = subprocess.run([str(LAYOUT_TOOL)], check=True, capture_output=True, text=True).stdout
    layout: dict[str, object] = json.loads(out)
    return layout


def _offsets(struct: type[ctypes.Structure]) -> dict[str, int]:
    return {name: getattr(struct, name).offset for name, *_ in struct._fields_}


def test_sizes_and_constants_match(c_layout: dict[str, object]) -> None:
    assert c_layout["magic"] == rg.REGION_MAGIC
    assert c_layout["version"] == rg.REGION_VERSION
    assert c_layout["max_devices"] == rg.MAX_DEVICES
    assert c_layout["max_slots"] == rg.MAX_SLOTS
    assert c_layout["lock_base"] == rg.LOCK_BASE
    assert c_layout["region_size"] == rg.REGION_SIZE
    assert c_layout["device_size"] == ctypes.sizeof(rg.RegionDevice)
    assert c_layout["slot_size"] == ctypes.sizeof(rg.RegionSlot)


@pytest.mark.parametrize(
    ("key", "struct"),
    [("region", rg.RegionLayout), ("device", rg.RegionDevice), ("slot", rg.RegionSlot)],
)
def test_field_offsets_match(
    c_layout: dict[str, object], key: str, struct: type[ctypes.Structure]
) -> None:
    c_fields = c_layout[key]
    assert isinstance(c_fields, dict)
    py = _offsets(struct)
    for name, offset in c_fields.items():
        assert py[name] == offset, f"{struct.__name__}.{name}"


def _write_region(path: Path) -> None:
    layout = rg.RegionLayout()
    layout.magic, layout.version, layout.size = rg.REGION_MAGIC, rg.REGION_VERSION, rg.REGION_SIZE
    layout.device_count, layout.ready, layout.slot_hwm = 2, 1, 901
    layout.devices[1].uuid = b"GPU-abc"
    layout.devices[1].memory_limit = 1000
    layout.devices[1].cores = 30
    layout.slots[3].pid, layout.slots[3].used[1] = 11, 200
    layout.slots[900].pid, layout.slots[900].used[1] = 12, 300
    path.write_bytes(bytes(layout))


def test_read_usage_and_write_rate(tmp_path: Path) -> None:
    path = tmp_path / "region"
    _write_region(path)
    with rg.Region(str(path)) as region:
        assert region.device_index("gpu-ABC") == 1
        assert region.device_index("GPU-other") is None
        usage = region.device(1)
        assert (usage.used, usage.memory_limit, usage.cores) == (500, 1000, 30)
        region.write_rate(1, 12345, now_ns=77)
    raw = rg.RegionLayout.from_buffer_copy(path.read_bytes())
    assert raw.devices[1].rate == 12345
    assert raw.devices[1].governor_stamp_ns == 77
    assert raw.devices[1].rate_source == rg.RATE_GOVERNOR


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.write_bytes(b"\0" * 100)
    with pytest.raises(rg.RegionError, match="small"):
        rg.Region(str(small))
    wrong = tmp_path / "wrong"
    layout = rg.RegionLayout()
    layout.magic, layout.version = rg.REGION_MAGIC, 9
    wrong.write_bytes(bytes(layout))
    with pytest.raises(rg.RegionError, match="wrong"):
        rg.Region(str(wrong))
