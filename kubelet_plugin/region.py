"""Python mirror of the hook's shared accounting region (`vgpu_hook/include/region.h`).

Why: the node governor (kubelet_plugin/governor.py) reads each claim's usage and launch
counters from the region and writes the compute budget into it, while hooked processes update
it concurrently. The layout is an ABI owned by region.h; tests/unit/kubelet_plugin/test_region.py
compares these ctypes offsets with the ones the C compiler prints (vgpu_hook/build/region_layout).

Writes from Python are whole aligned 8-byte stores through ctypes, which are single
instructions on the platforms we support, so C readers never see torn values.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
import struct
from dataclasses import dataclass

REGION_MAGIC = 0x55504756
REGION_VERSION = 2
MAX_DEVICES = 16
MAX_SLOTS = 1024
UUID_LEN = 96
CLAIM_LEN = 64
LOCK_BASE = 1 << 40

POLICY_NONE, POLICY_FIXED, POLICY_BALANCE = 0, 1, 2
RATE_UNSET, RATE_GOVERNOR, RATE_HOOK, RATE_SEED = 0, 1, 2, 3


class RegionDevice(ctypes.Structure):
    _fields_ = (
        ("uuid", ctypes.c_char * UUID_LEN),
        ("memory_limit", ctypes.c_uint64),
        ("cores", ctypes.c_uint32),
        ("policy", ctypes.c_uint32),
        ("rate", ctypes.c_uint64),
        ("rate_stamp_ns", ctypes.c_uint64),
        ("rate_source", ctypes.c_uint32),
        ("reserved0", ctypes.c_uint32),
        ("governor_stamp_ns", ctypes.c_uint64),
        ("credit", ctypes.c_uint64),
        ("refill_stamp_ns", ctypes.c_uint64),
        ("launches", ctypes.c_uint64),
        ("launch_cost", ctypes.c_uint64),
        ("throttled_ns", ctypes.c_uint64),
        ("oversub_allocs", ctypes.c_uint64),
        ("ctl_stamp_ns", ctypes.c_uint64),
        ("ctl_cost_mark", ctypes.c_uint64),
        ("ctl_gain_bits", ctypes.c_uint64),
        ("ctl_integral_bits", ctypes.c_uint64),
        ("util_milli", ctypes.c_uint64),
        ("throttle_mark", ctypes.c_uint64),
        ("seed_gain_bits", ctypes.c_uint64),
        ("ctl_window_ns", ctypes.c_uint64),
        ("ctl_learning_anchor", ctypes.c_uint64),
        ("ctl_hold", ctypes.c_uint64),
        ("ctl_weight_bits", ctypes.c_uint64),
        ("ctl_poll_cost", ctypes.c_uint64),
        ("ctl_poll_fresh", ctypes.c_uint64),
        ("ctl_steps", ctypes.c_uint64),
        ("ctl_moved", ctypes.c_uint64),
        ("ctl_seen_ns", ctypes.c_uint64),
        ("ctl_spent_bits", ctypes.c_uint64),
        ("reserved1", ctypes.c_uint8 * (512 - 96 - 8 - 4 - 4 - 16 - 4 - 4 - 192)),
    )


class RegionSlot(ctypes.Structure):
    _fields_ = (
        ("pid", ctypes.c_int32),
        ("generation", ctypes.c_uint32),
        ("used", ctypes.c_uint64 * MAX_DEVICES),
        ("managed", ctypes.c_uint64 * MAX_DEVICES),
    )


class RegionLayout(ctypes.Structure):
    _fields_ = (
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("device_count", ctypes.c_uint32),
        ("ready", ctypes.c_uint32),
        ("slot_hwm", ctypes.c_uint32),
        ("created_ns", ctypes.c_uint64),
        ("claim", ctypes.c_char * CLAIM_LEN),
        ("devices", RegionDevice * MAX_DEVICES),
        ("slots", RegionSlot * MAX_SLOTS),
    )


REGION_SIZE = ctypes.sizeof(RegionLayout)


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """What the governor needs of one device record, read at one instant."""

    uuid: str
    memory_limit: int
    cores: int
    policy: int
    used: int
    launch_cost: int
    throttled_ns: int
    rate: int


class RegionError(Exception):
    """The file is not a region this code understands (wrong size, magic or version)."""


class RegionNotReady(RegionError):
    """The plugin created the file at prepare, but no hooked process has initialised it yet."""


def enforce_size(path: str) -> bool:
    """Set a claim's region file back to REGION_SIZE if it is another size; True if it was intact.

    The region is the one file a container may write (docs/security.md). A tenant that grows it
    would fill the node's state filesystem: the extra bytes are cut off here on every governor
    pass. One that shrinks it would make readers of the mapping (this process) fault with
    SIGBUS: restoring the size makes the mapping readable again (the lost pages read as zero).
    A missing file is left alone (the claim is being prepared or removed).
    """
    try:
        if os.stat(path).st_size == REGION_SIZE:
            return True
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        os.ftruncate(fd, REGION_SIZE)
    finally:
        os.close(fd)
    return False


class Region(contextlib.AbstractContextManager["Region"]):
    """A mapped region file. Use as a context manager; `layout` is the live shared view."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size != REGION_SIZE:
                raise RegionError(
                    f"{path}: size {size}, expected {REGION_SIZE} (layout v{REGION_VERSION})"
                )
            self._map = mmap.mmap(fd, REGION_SIZE, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.layout = RegionLayout.from_buffer(self._map)
        if self.layout.magic == 0 and self.layout.ready == 0:
            self.close()
            raise RegionNotReady(f"{path}: not initialised by a hooked process yet")
        if self.layout.magic != REGION_MAGIC or self.layout.version != REGION_VERSION:
            version = self.layout.version
            self.close()
            raise RegionError(
                f"{path}: magic/version {version} is not region layout v{REGION_VERSION}"
            )

    def close(self) -> None:
        self.__dict__.pop("layout", None)
        # If a caller still holds a view into the map, it is unmapped when that view dies.
        with contextlib.suppress(BufferError):
            self._map.close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()  # `with Region(path) as region:` (the base class's __enter__ returns self)

    def _slots(self) -> list[RegionSlot]:
        """The slots that may be in use (hooks take slots lowest-first up to slot_hwm)."""
        hwm = min(self.layout.slot_hwm, MAX_SLOTS)
        return [self.layout.slots[i] for i in range(hwm)]

    def device(self, index: int) -> DeviceUsage:
        d = self.layout.devices[index]
        used = sum(slot.used[index] for slot in self._slots())
        return DeviceUsage(
            uuid=d.uuid.decode(errors="replace"),
            memory_limit=d.memory_limit,
            cores=d.cores,
            policy=d.policy,
            used=used,
            launch_cost=d.launch_cost,
            throttled_ns=d.throttled_ns,
            rate=d.rate,
        )

    def device_index(self, uuid: str) -> int | None:
        for i in range(min(self.layout.device_count, MAX_DEVICES)):
            if self.layout.devices[i].uuid.decode(errors="replace").lower() == uuid.lower():
                return i
        return None

    def write_util(self, index: int, util: float) -> None:
        """Record the claim's measured utilisation (percent points) for metrics to read."""
        self.layout.devices[index].util_milli = int(min(100.0, max(0.0, util)) * 1000)

    def write_seed_gain(self, index: int, gain: float) -> None:
        """Offer the hook a gain to pace this device's first launches with (region.h)."""
        if gain > 0 and math.isfinite(gain):
            self.layout.devices[index].seed_gain_bits = struct.unpack(
                "<Q", struct.pack("<d", gain)
            )[0]

    def write_presence(self, index: int, now_ns: int) -> None:
        """Tell the hook a governor drives this device (no budget yet: its first launch seeds
        one from the cap), so the hook's own controller stays off (launch.c)."""
        self.layout.devices[index].governor_stamp_ns = now_ns

    def write_rate(self, index: int, rate: int, now_ns: int) -> None:
        """Publish a governor budget: the hook prefers it while governor_stamp_ns is fresh."""
        d = self.layout.devices[index]
        d.rate = max(1, int(rate))
        d.rate_stamp_ns = now_ns
        d.rate_source = RATE_GOVERNOR
        d.governor_stamp_ns = now_ns
