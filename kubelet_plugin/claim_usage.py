"""Read-only snapshots of a claim's usage from its shared region (`<claim dir>/region`).

Why not `kubelet_plugin.region.Region`: that class maps the file read-write for the governor.
The metrics scrape only reads, and every byte of the file is written by the tenant's processes,
so it is hostile input: the file is opened read-only without following symlinks, must be a
regular file of exactly the layout's size, and only the header, the device records and the
slots below `slot_hwm` are read (pread, no mapping kept). Every figure is clamped: memory never
negative nor above the int64 range, utilisation within 0..100 %. The figures are keyed by the
device UUIDs of the claim's *plan* (the caller matches them), never by strings from the file, so
a tenant cannot invent label values.

A slot counts only while its process is alive: the hook holds an OFD lock on the slot's lock
byte for as long as the process lives (vgpu_hook/include/region.h), so a slot left behind by a
SIGKILLed process that no one has reclaimed yet is not reported as usage.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import stat
import struct
from dataclasses import dataclass

from kubelet_plugin import region as rg

INT64_MAX = (1 << 63) - 1
_SLOT_LOCK_BASE = rg.LOCK_BASE + 4096


class _Head(ctypes.Structure):
    """The region up to (not including) the slots."""

    _fields_ = [f for f in rg.RegionLayout._fields_ if f[0] != "slots"]


_SLOTS_OFFSET: int = rg.RegionLayout.slots.offset
_SLOT_SIZE = ctypes.sizeof(rg.RegionSlot)
assert ctypes.sizeof(_Head) <= _SLOTS_OFFSET


@dataclass(frozen=True, slots=True)
class DeviceStats:
    """One device record of a claim's region, as a scrape reports it."""

    memory_used: int  # bytes charged to the cap by live processes
    utilisation: float  # share of the GPU's SMs, 0..1, last measured (0 = idle or never)
    throttled_seconds: float  # time the hook held kernel launches back (counter)
    live_processes: int


def _slot_alive(fd: int, index: int) -> bool:
    """Whether another open file description holds the slot's OFD lock (its process lives)."""
    probe = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, _SLOT_LOCK_BASE + index, 1, 0)
    try:
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe)
    except OSError:
        return True  # cannot tell: count it (over-reporting beats hiding usage)
    lock_type: int = struct.unpack("hhqqi4x", answer)[0]
    return lock_type != fcntl.F_UNLCK


def read_usage(path: str) -> dict[str, DeviceStats] | None:
    """Device UUID (lower case) -> stats; None when there is no usable region (no hooked
    process ran yet, or the file is not a v1 region)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != rg.REGION_SIZE:
            return None
        raw = os.pread(fd, ctypes.sizeof(_Head), 0)
        if len(raw) != ctypes.sizeof(_Head):
            return None
        head = _Head.from_buffer_copy(raw)
        if head.magic != rg.REGION_MAGIC or head.version != rg.REGION_VERSION or not head.ready:
            return None
        devices = min(int(head.device_count), rg.MAX_DEVICES)
        hwm = min(int(head.slot_hwm), rg.MAX_SLOTS)
        used = [0] * devices
        live = 0
        if hwm and devices:
            raw_slots = os.pread(fd, hwm * _SLOT_SIZE, _SLOTS_OFFSET)
            count = len(raw_slots) // _SLOT_SIZE
            slots = (rg.RegionSlot * count).from_buffer_copy(raw_slots[: count * _SLOT_SIZE])
            for index, slot in enumerate(slots):
                if slot.pid <= 0 or not _slot_alive(fd, index):
                    continue
                live += 1
                for d in range(devices):
                    used[d] = min(INT64_MAX, used[d] + int(slot.used[d]))
        stats: dict[str, DeviceStats] = {}
        for d in range(devices):
            record = head.devices[d]
            uuid = bytes(record.uuid).split(b"\0", 1)[0].decode("ascii", "replace").lower()
            stats[uuid] = DeviceStats(
                memory_used=used[d],
                utilisation=_utilisation(int(record.util_milli)),
                throttled_seconds=min(INT64_MAX, int(record.throttled_ns)) / 1e9,
                live_processes=live,
            )
        return stats
    except OSError:
        return None
    finally:
        os.close(fd)


def _utilisation(util_milli: int) -> float:
    """util_milli is the last measured claim utilisation in 1/1000 percent points (written by
    the governor, or by the hook when it paces itself); as a ratio, clamped to 0..1."""
    return min(1.0, max(0.0, util_milli / 100_000.0))
