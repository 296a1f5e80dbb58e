"""The in-process hot-plug check (kubelet_plugin.gpu_changes.ChangeCheck) and the rescan loop that
runs a rediscovery child only when it says so (issue 32: no child process every period).

What this proves:
1. A rediscovery is due at the first check (not when a baseline was taken before start-up's
   discovery), then only when something changed: a GPU of the session stops answering (removed,
   lost), answers again, or the kernel driver's GPU list (`/proc/driver/nvidia/gpus`) gains or
   loses an entry; a steady node is never rescanned.
2. A failed rediscovery is due again at every check until one succeeds.
3. Without the kernel's list (the simulated GPUs), a GPU the session never enumerated can only
   be found by a child: a rediscovery is due every `full_rescan_s`; with the list, never.
4. NVML that cannot be opened and no kernel list: due at every check (no cheap signal).
5. The loop `gpu-rescan` calls the rediscovery only when the check says so.
6. A rediscovery seeded with start-up's inventory runs only the small enumeration child while
   the GPUs are the same, and the full discovery once they differ.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dra_driver import nvml
from dra_driver.gpu import NodeInventory
from dra_driver.nvml import DeviceHandle, NvmlError, NvmlUnavailable
from dra_driver.supervision import Supervisor
from kubelet_plugin import monitoring, rediscover
from kubelet_plugin.gpu_changes import ChangeCheck
from tests.fixtures.claimdata import inventory
from vgpu_testbed.polling import wait_for


class SessionNvml:
    """NVML as one long-lived session sees it: the GPUs enumerated at init, some not answering."""

    def __init__(self, uuids: list[str]) -> None:
        self.uuids = uuids
        self.gone: set[int] = set()
        self.inits = 0
        self.shutdowns = 0
        self.usable = True

    def init(self) -> None:
        if not self.usable:
            raise NvmlUnavailable("nvmlInit", 9, "Driver Not Loaded")
        self.inits += 1

    def shutdown(self) -> None:
        self.shutdowns += 1

    def device_count(self) -> int:
        return len(self.uuids)

    def device_by_index(self, index: int) -> DeviceHandle:
        if index in self.gone:
            raise NvmlError("nvmlDeviceGetHandleByIndex", nvml.GPU_IS_LOST, "GPU is lost")
        return DeviceHandle(index + 1)

    def uuid(self, device: DeviceHandle) -> str:
        return self.uuids[device.address - 1]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def checked(check: ChangeCheck) -> str | None:
    """One check, with a successful rediscovery whenever it was due."""
    reason = check.due()
    if reason is not None:
        check.done(ok=True)
    return reason


def test_due_only_when_what_the_process_sees_changes(tmp_path: Path) -> None:
    kernel = tmp_path / "gpus"
    kernel.mkdir()
    (kernel / "0000:18:00.0").mkdir()
    session = SessionNvml(["GPU-a", "GPU-b"])
    check = ChangeCheck(session, kernel_dir=str(kernel))  # type: ignore[arg-type]
    assert checked(check) == "first check"
    assert [checked(check) for _ in range(5)] == [None] * 5  # a steady node: no child at all
    session.gone.add(1)  # hot-removed (or fell off the bus): the session's handle is lost
    assert checked(check) == "NVML answers changed"
    assert checked(check) is None
    session.gone.clear()  # back (a re-seat, the simulator's re-add)
    assert checked(check) == "NVML answers changed"
    (kernel / "0000:2a:00.0").mkdir()  # hot-added: the session never shows it, the kernel does
    assert checked(check) == "the kernel driver's GPU list changed"
    assert checked(check) is None
    assert session.inits == 1  # one session for the loop's life
    check.close()
    assert session.shutdowns == 1


def test_a_baseline_before_start_up_discovery_means_no_first_rediscovery(tmp_path: Path) -> None:
    session = SessionNvml(["GPU-a", "GPU-b"])
    check = ChangeCheck(session, kernel_dir=str(tmp_path))  # type: ignore[arg-type]
    check.baseline()  # main: before its own discovery
    assert checked(check) is None
    session.gone.add(0)  # removed after the baseline: the first check sees it
    assert checked(check) == "NVML answers changed"


def test_a_failed_rediscovery_is_due_again_until_one_succeeds(tmp_path: Path) -> None:
    check = ChangeCheck(SessionNvml(["GPU-a"]), kernel_dir=str(tmp_path))  # type: ignore[arg-type]
    assert check.due() == "first check"
    check.done(ok=False)
    assert check.due() == "the last rediscovery failed"
    check.done(ok=False)
    assert check.due() == "the last rediscovery failed"
    check.done(ok=True)
    assert check.due() is None


def test_without_the_kernel_list_a_child_runs_every_full_rescan_period(tmp_path: Path) -> None:
    clock = Clock()
    missing = str(tmp_path / "no-driver")
    check = ChangeCheck(
        SessionNvml(["GPU-a"]),  # type: ignore[arg-type]
        kernel_dir=missing,
        full_rescan_s=30,
        clock=clock,
    )
    assert checked(check) == "first check"
    clock.now += 29
    assert checked(check) is None
    clock.now += 1
    assert (checked(check) or "").startswith("periodic (30 s")
    clock.now += 10
    assert checked(check) is None  # counted from the last rediscovery
    with_list = ChangeCheck(
        SessionNvml(["GPU-a"]),  # type: ignore[arg-type]
        kernel_dir=str(tmp_path),
        full_rescan_s=30,
        clock=clock,
    )
    assert checked(with_list) == "first check"
    clock.now += 3600
    assert checked(with_list) is None  # the kernel list shows additions: never periodic


def test_no_cheap_signal_means_every_check(tmp_path: Path) -> None:
    session = SessionNvml(["GPU-a"])
    session.usable = False
    check = ChangeCheck(session, kernel_dir=str(tmp_path / "none"))  # type: ignore[arg-type]
    assert checked(check) == "first check"
    assert (checked(check) or "").startswith("no cheap signal")
    assert (checked(check) or "").startswith("no cheap signal")
    session.usable = True  # NVML opens later (the driver was loaded): a signal again
    assert checked(check) == "NVML answers changed"
    assert checked(check) is None


class Devices:
    def __init__(self) -> None:
        self.folded: list[NodeInventory] = []

    def rediscovered(self, fresh: NodeInventory) -> bool:
        self.folded.append(fresh)
        return False


def test_the_rescan_loop_forks_only_when_the_check_says_so(tmp_path: Path) -> None:
    session = SessionNvml(["GPU-a", "GPU-b"])
    check = ChangeCheck(session, kernel_dir=str(tmp_path))  # type: ignore[arg-type]
    checks = 0
    real_due = check.due

    def counted_due() -> str | None:
        nonlocal checks
        checks += 1
        return real_due()

    check.due = counted_due  # type: ignore[method-assign]
    children: list[int] = []

    def rediscover() -> NodeInventory:
        children.append(checks)
        return inventory(count=2 - len(session.gone))

    devices = Devices()
    stop = threading.Event()
    thread = monitoring._rescan(
        devices,  # type: ignore[arg-type]
        None,
        rediscover,
        stop,
        period=0.01,
        supervisor=Supervisor(),
        changes=check,
    )
    try:
        wait_for("ten checks", lambda: checks >= 10, interval=0.01)
        assert children == [1]  # the first check only
        session.gone.add(1)
        wait_for("the removal rediscovered", lambda: len(children) == 2, interval=0.01)
        wait_for("ten more checks", lambda: checks >= children[-1] + 10, interval=0.01)
        assert len(children) == 2
        assert len(devices.folded[-1].gpus) == 1
    finally:
        stop.set()
        thread.join(timeout=30)
        check.close()
    assert session.shutdowns == 1


def test_a_seeded_rediscovery_runs_the_full_discovery_only_for_a_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = inventory(count=2)
    fingerprints = iter([rediscover.fingerprint_of(started), {"count": 1, "uuids": ["GPU-x"]}] * 2)
    children: list[str] = []

    def fingerprint_in_child() -> object:
        children.append("enumerate")
        return next(fingerprints)

    def discover_in_child() -> NodeInventory:
        children.append("discover")
        return inventory(count=1)

    monkeypatch.setattr(rediscover, "fingerprint_in_child", fingerprint_in_child)
    monkeypatch.setattr(rediscover, "discover_in_child", discover_in_child)
    rescan = rediscover.Rediscovery(seed=started)
    assert rescan() is started  # the periodic rescan of a steady node: the small child only
    assert children == ["enumerate"]
    assert len(rescan().gpus) == 1
    assert children == ["enumerate", "enumerate", "discover", "enumerate"]
