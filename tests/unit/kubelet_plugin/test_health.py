"""Device health board: discovery results -> statuses, change detection and wake-ups."""

from __future__ import annotations

import threading

from kubelet_plugin.health import HEALTHY, UNHEALTHY, UNKNOWN, HealthBoard
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


def test_tainted_devices_are_unhealthy_until_their_taints_go() -> None:
    board = HealthBoard("node-1", inventory(2))
    [change] = board.set_tainted({"gpu-1": "XID 48: double-bit ECC error"})
    assert (change.device, change.status) == ("gpu-1", UNHEALTHY)
    assert board.set_tainted({"gpu-1": "XID 48: double-bit ECC error"}) == []  # no second change
    board.observe(inventory(2))
    assert statuses(board) == {"gpu-0": HEALTHY, "gpu-1": UNHEALTHY}
    board.observe(None, "NVML gone")
    assert statuses(board) == {"gpu-0": UNKNOWN, "gpu-1": UNHEALTHY}
    board.observe(inventory(2))
    [lifted] = board.set_tainted({})
    assert (lifted.device, lifted.status) == ("gpu-1", HEALTHY)


def test_hot_plugged_devices_join_the_board() -> None:
    board = HealthBoard("node-1", inventory(2))
    changes = board.observe(inventory(3))
    assert [(c.device, c.status) for c in changes] == [("gpu-2", HEALTHY)]
    assert statuses(board) == {"gpu-0": HEALTHY, "gpu-1": HEALTHY, "gpu-2": HEALTHY}
