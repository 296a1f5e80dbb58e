"""Reading a claim's region for metrics: correct sums, live slots only, and hostile contents
(the file is written by tenants) never give negative usage, utilisation above 100 % or a crash."""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubelet_plugin import region as rg
from kubelet_plugin.claim_usage import INT64_MAX, read_usage

UUID = "GPU-aaaa0000-1111-2222-3333-444444444444"
MIB = 1 << 20
SLOT_LOCK_BASE = rg.LOCK_BASE + 4096


def layout(devices: int = 1, slots: int = 1) -> rg.RegionLayout:
    out = rg.RegionLayout()
    out.magic, out.version, out.size = rg.REGION_MAGIC, rg.REGION_VERSION, rg.REGION_SIZE
    out.device_count, out.ready, out.slot_hwm = devices, 1, slots
    for d in range(min(devices, rg.MAX_DEVICES)):
        out.devices[d].uuid = f"GPU-aaaa000{d}-1111-2222-3333-444444444444".encode()
    return out


@contextmanager
def alive(path: Path, *slots: int) -> Iterator[None]:
    """Hold the OFD lock of these slots, as a live hooked process does."""
    fd = os.open(path, os.O_RDWR)
    try:
        for slot in slots:
            lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, SLOT_LOCK_BASE + slot, 1, 0)
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
        yield
    finally:
        os.close(fd)


def test_sums_the_live_slots_and_skips_dead_ones(tmp_path: Path) -> None:
    region = layout(slots=3)
    for slot, (pid, used) in enumerate([(100, 300 * MIB), (101, 200 * MIB), (102, 50 * MIB)]):
        region.slots[slot].pid = pid
        region.slots[slot].used[0] = used
    region.devices[0].util_milli = 42_500  # 42.5 %
    region.devices[0].throttled_ns = 1_500_000_000
    path = tmp_path / "region"
    path.write_bytes(bytes(region))
    with alive(path, 0, 2):  # slot 1's process died without anyone reclaiming its slot
        stats = read_usage(str(path))
    assert stats is not None
    first = stats[UUID.lower()]
    assert first.memory_used == 350 * MIB
    assert first.live_processes == 2
    assert first.utilisation == 0.425
    assert first.throttled_seconds == 1.5
    # Nobody holds a lock any more: every process is gone.
    after = read_usage(str(path))
    assert after is not None and after[UUID.lower()].memory_used == 0


def test_hostile_values_are_clamped(tmp_path: Path) -> None:
    region = layout(devices=200, slots=5000)  # counts beyond the layout
    region.devices[0].util_milli = (1 << 64) - 1
    region.devices[0].throttled_ns = (1 << 64) - 1
    for slot in range(rg.MAX_SLOTS):
        region.slots[slot].pid = -5 if slot == 1 else 7
        region.slots[slot].used[0] = (1 << 64) - 1
    path = tmp_path / "region"
    path.write_bytes(bytes(region))
    with alive(path, *range(rg.MAX_SLOTS)):
        stats = read_usage(str(path))
    assert stats is not None
    assert len(stats) == rg.MAX_DEVICES
    first = stats[UUID.lower()]
    assert first.utilisation == 1.0
    assert 0 <= first.memory_used <= INT64_MAX
    assert first.memory_used == INT64_MAX
    assert first.throttled_seconds <= INT64_MAX / 1e9
    assert first.live_processes == rg.MAX_SLOTS - 1  # the negative pid is not a process


def test_not_a_region_gives_nothing(tmp_path: Path) -> None:
    wrong_size = tmp_path / "small"
    wrong_size.write_bytes(b"\0" * 100)
    assert read_usage(str(wrong_size)) is None
    bad_magic = tmp_path / "magic"
    region = layout()
    region.magic = 0x1234
    bad_magic.write_bytes(bytes(region))
    assert read_usage(str(bad_magic)) is None
    not_ready = tmp_path / "not-ready"
    region = layout()
    region.ready = 0
    not_ready.write_bytes(bytes(region))
    assert read_usage(str(not_ready)) is None
    assert read_usage(str(tmp_path / "missing")) is None


def test_symlinks_and_fifos_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_bytes(bytes(layout()))
    link = tmp_path / "link"
    link.symlink_to(real)
    assert read_usage(str(real)) is not None
    assert read_usage(str(link)) is None  # a tenant could point it at any host file
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_usage(str(fifo)) is None  # and must not block the scrape
