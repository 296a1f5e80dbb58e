"""Device health board: discovery results -> statuses, change detection and wake-ups."""

from __future__ import annotations

import threading

from kubelet_plugin.health import (
    HEALTHY,
    UNHEALTHY,
    UNKNOWN,
    HealthBoard,
    _handle_xid,
    xid_is_critical,
)
from tests.fixtures.claimdata import inventory


def statuses(board: HealthBoard) -> dict[str, int]:
    return {s.device: s.status for s in board.snapshot()[1]}


def test_all_discovered_devices_start_healthy() -> None:
    board = HealthBoard("node-1", inventory(3))
    assert statuses(board) == {"gpu-0": HEALTHY, "gpu-1": HEALTHY, "gpu-2": HEALTHY}
    assert board.observe(inventory(3)) == []  # no change, no version bump
    assert board.snapshot()[0] == 0


def test_lost_gpu_is_unhealthy_and_comes_back() -> None:
    board = HealthBoard("node-1", inventory(3))
    fewer = inventory(3).model_copy(update={"gpus": inventory(3).gpus[:2]})
    [change] = board.observe(fewer)
    assert (change.device, change.status) == ("gpu-2", UNHEALTHY)
    assert "no longer reported" in change.message
    [change] = board.observe(inventory(3))
    assert (change.device, change.status) == ("gpu-2", HEALTHY)


def test_failed_discovery_makes_everything_unknown() -> None:
    board = HealthBoard("node-1", inventory(2))
    changes = board.observe(None, "NVML_ERROR_DRIVER_NOT_LOADED")
    assert {c.status for c in changes} == {UNKNOWN}
    assert all("NVML_ERROR_DRIVER_NOT_LOADED" in c.message for c in changes)


def test_waiters_wake_on_change_only() -> None:
    board = HealthBoard("node-1", inventory(2))
    version = board.snapshot()[0]
    assert board.wait(version, timeout=0.05) == version  # nothing changed: times out
    timer = threading.Timer(0.05, board.observe, args=(None, "gone"))
    timer.start()
    assert board.wait(version, timeout=5) == version + 1
    timer.join()


def test_taint_is_sticky_across_discoveries() -> None:
    board = HealthBoard("node-1", inventory(2))
    assert board.taint("gpu-1", "XID 48")
    assert not board.taint("gpu-1", "XID 48 again")  # no second change
    assert not board.taint("gpu-9", "unknown device")
    board.observe(inventory(2))
    assert statuses(board) == {"gpu-0": HEALTHY, "gpu-1": UNHEALTHY}
    board.observe(None, "NVML gone")
    assert statuses(board) == {"gpu-0": UNKNOWN, "gpu-1": UNHEALTHY}


def test_application_xids_do_not_taint() -> None:
    assert not xid_is_critical(13) and not xid_is_critical(43)
    assert xid_is_critical(48) and xid_is_critical(79)
    board = HealthBoard("node-1", inventory(2))
    _handle_xid(board, "gpu-0", 13)
    _handle_xid(board, None, 79)  # a GPU we do not publish
    assert statuses(board) == {"gpu-0": HEALTHY, "gpu-1": HEALTHY}
    _handle_xid(board, "gpu-0", 79)
    [gpu0] = [s for s in board.snapshot()[1] if s.device == "gpu-0"]
    assert (gpu0.status, gpu0.message) == (UNHEALTHY, "XID 79 (GPU error) reported by the driver")
