"""One plugin per state directory: an exclusive `flock` on `<state-dir>/plugin.lock`.

Two instances on one state dir (a rolling update, a mistaken second DaemonSet) would each keep
their own in-memory view of the checkpoint, overwrite each other's entries, and at start-up
delete the other's live claims as "orphans". The lock is taken before the checkpoint is read and
held (by an open descriptor) for the life of the process, so the kernel releases it however the
process ends, SIGKILL included: no stale-lock cleanup exists or is needed. The holder's pid is
written into the file so a waiting or refused instance can name it, and (once it serves) the path
of its DRA socket, where an instance waiting for the lock during a rolling update forwards the
kubelet's calls (`kubelet_plugin.handover`). File format: line 1 the pid, line 2 the DRA socket
path or nothing. Used by `kubelet_plugin.main`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

log = logging.getLogger(__name__)

LOCK_FILE = "plugin.lock"
POLL_S = 0.1  # flock has no timeout; a waiting instance retries at this period


class StateLockError(RuntimeError):
    """Another process holds the state dir; the message names its pid."""


class StateDirLock:
    """Hold with `acquire()`; `release()` (or process exit) lets the next instance in."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self, wait_s: float = 0.0, cancel: threading.Event | None = None) -> None:
        """Take the lock, waiting up to `wait_s` for a running holder to exit.

        Raises StateLockError naming the holder's pid when it does not let go in time, or when
        `cancel` is set while waiting (the process is asked to stop).
        """
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            deadline = time.monotonic() + max(0.0, wait_s)
            announced = False
            while not _try_lock(fd):
                holder = _holder(fd)
                if time.monotonic() >= deadline:
                    raise StateLockError(
                        f"state dir {os.path.dirname(self.path)} is in use by another kubelet "
                        f"plugin (pid {holder}, per {self.path}); stop it, or give this instance "
                        f"its own --state-dir" + (f" (waited {wait_s:g} s)" if wait_s > 0 else "")
                    )
                if not announced:
                    log.warning(
                        "state dir lock %s is held by pid %s; waiting up to %g s for it to exit",
                        self.path,
                        holder,
                        wait_s,
                    )
                    announced = True
                if cancel is not None and cancel.wait(POLL_S):
                    raise StateLockError(f"stopped while waiting for {self.path} (pid {holder})")
                if cancel is None:
                    time.sleep(POLL_S)
            _write_holder(fd, "")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def advertise(self, dra_endpoint: str) -> None:
        """Name the DRA socket this holder serves, for instances waiting to take over."""
        if self._fd is None:
            raise StateLockError(f"{self.path}: advertise() without holding the lock")
        _write_holder(self._fd, dra_endpoint)

    def holder_endpoint(self) -> str | None:
        """The DRA socket the current holder advertised (None: none, or no holder)."""
        try:
            with open(self.path, "rb") as handle:
                lines = handle.read(4096).decode("utf-8", "replace").splitlines()
        except OSError:
            return None
        endpoint = lines[1].strip() if len(lines) > 1 else ""
        return endpoint if endpoint.startswith("/") else None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _write_holder(fd: int, endpoint: str) -> None:
    # One pwrite of the whole text after the truncate: a reader sees nothing or all of it.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n{endpoint}\n".encode(), 0)


def _holder(fd: int) -> str:
    """The pid the holder wrote (it writes right after locking, so briefly it may be empty)."""
    lines = os.pread(fd, 32, 0).decode("ascii", "replace").splitlines()
    text = lines[0].strip() if lines else ""
    return text if text.isdigit() else "unknown"
