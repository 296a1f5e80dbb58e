"""One plugin per state dir: the flock on `<state-dir>/plugin.lock` across real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kubelet_plugin.statelock import StateDirLock, StateLockError

HOLDER = """
import sys
from kubelet_plugin.statelock import StateDirLock
StateDirLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()  # hold until the test closes stdin (or kills us)
"""


def hold(state_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_second_instance_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = hold(tmp_path)
    try:
        with pytest.raises(StateLockError) as err:
            StateDirLock(str(tmp_path)).acquire(wait_s=0)
        assert f"pid {holder.pid}" in str(err.value)
        assert str(tmp_path) in str(err.value) and "--state-dir" in str(err.value)
        assert (tmp_path / "plugin.lock").read_text().strip() == str(holder.pid)
        assert (tmp_path / "plugin.lock").stat().st_mode & 0o777 == 0o600
    finally:
        holder.kill()
        holder.wait()


def test_waiting_instance_gets_the_lock_when_the_holder_exits(tmp_path: Path) -> None:
    holder = hold(tmp_path)
    lock = StateDirLock(str(tmp_path))
    got = threading.Event()

    def acquire() -> None:
        lock.acquire(wait_s=30)
        got.set()

    waiter = threading.Thread(target=acquire)
    waiter.start()
    assert not got.wait(0.3)  # still held
    holder.send_signal(signal.SIGKILL)  # however the holder ends, the kernel lets go
    holder.wait()
    waiter.join(timeout=30)
    assert got.is_set()
    assert (tmp_path / "plugin.lock").read_text().strip() == str(os.getpid())
    lock.release()
    again = StateDirLock(str(tmp_path))
    again.acquire(wait_s=0)  # released: the next one gets it at once
    again.release()
