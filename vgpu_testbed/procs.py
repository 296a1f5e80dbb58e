"""Child processes of the test bed: start each in its own process group, find it again by PID,
and stop it for certain.

Why a module of its own: the control plane is started by one process (a pytest session, or the
`vgpu-dra dev-cluster up` command that exits right after) and may be stopped by another (`down`).
So a process is identified by a record that survives in the state file — PID plus the kernel's
start time, which guards against killing an unrelated process that reused the PID — and every
stop works from that record alone. Called by `vgpu_testbed.cluster.control_plane`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

_PR_SET_PDEATHSIG = 1
T = TypeVar("T")


class ProcessRecord(BaseModel):
    """What the state file remembers about one started process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    pid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat: distinguishes a reused PID
    argv: list[str]
    log_path: str
    port: int | None = None


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may contain spaces)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it does not exist."""
    fields = _stat_fields(pid)
    # After the name: state is field 3 (index 0), starttime is field 22 (index 19).
    return int(fields[19]) if fields else None


def is_alive(record: ProcessRecord) -> bool:
    """True while the recorded process runs (a zombie counts as dead: it holds no resources)."""
    fields = _stat_fields(record.pid)
    if fields is None or int(fields[19]) != record.start_ticks:
        return False
    return fields[0] not in ("Z", "X")


# Resolved once here: between fork and exec only async-signal-safe work is allowed, and
# loading a library there could deadlock on the loader lock held by another thread.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    """preexec hook: the kernel SIGKILLs the child when the process that started it dies.

    Used for test sessions, so that even a SIGKILLed pytest leaves no control plane behind.
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _ForkThread:
    """The thread that starts every die-with-parent child.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process. A
    child started from a short-lived thread (a thread pool, a gRPC handler) would be killed as
    soon as that thread ends. So such children are forked by the main thread when we are on it
    (it lives as long as the process), otherwise by one daemon thread that is never joined and
    so also lives until the process dies.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, job: Callable[[], T]) -> T:
        if threading.current_thread() is threading.main_thread():
            return job()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="vgpu-testbed-fork", daemon=True
                )
                self._thread.start()
        done: Future[T] = Future()
        self._jobs.put((job, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            job, done = self._jobs.get()
            try:
                done.set_result(job())
            except BaseException as err:  # handed to the caller, who re-raises it
                done.set_exception(err)


_fork_thread = _ForkThread()


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    port: int | None = None,
    die_with_parent: bool = False,
) -> tuple[ProcessRecord, subprocess.Popen[bytes]]:
    """Start `argv` in a new session (its own process group), output appended to `log_path`.

    `env` is added to the current environment. The returned Popen lets the starter reap the
    child; anyone else can still stop it through the record.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    preexec: Callable[[], None] | None = _die_with_parent if die_with_parent else None
    with open(log_path, "ab") as log:
        os.fchmod(log.fileno(), 0o640)

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=preexec,  # noqa: PLW1509 - only a prctl call, resolved up front
            )

        try:
            proc = _fork_thread.run(start) if die_with_parent else start()
        except OSError as err:
            raise RuntimeError(f"cannot start {name} ({argv[0]}): {err}") from err
    ticks = start_ticks(proc.pid)
    if ticks is None:  # exited (and was reaped) before we looked: keep a record that is dead
        ticks = -1
    record = ProcessRecord(
        name=name,
        pid=proc.pid,
        start_ticks=ticks,
        argv=list(argv),
        log_path=str(log_path),
        port=port,
    )
    return record, proc


def _signal_group(record: ProcessRecord, sig: signal.Signals) -> None:
    if not is_alive(record):
        return
    # The process leads its own group (start_new_session), so the group id is its PID;
    # signalling the group also reaches any helpers it forked.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, sig)


def stop_all(
    records: Sequence[ProcessRecord],
    *,
    popens: Mapping[int, subprocess.Popen[bytes]] | None = None,
    grace_seconds: float = 5.0,
) -> list[ProcessRecord]:
    """SIGTERM every group, wait up to `grace_seconds`, SIGKILL what is left, wait again.

    Returns the records that are still alive afterwards (should be empty; the caller reports
    them). `popens` (by PID) are reaped so no zombie stays behind in the starting process.
    """
    popens = popens or {}
    for record in records:
        _signal_group(record, signal.SIGTERM)
    survivors = _wait_dead(records, popens, grace_seconds)
    for record in survivors:
        _signal_group(record, signal.SIGKILL)
    return _wait_dead(survivors, popens, 5.0)


def _wait_dead(
    records: Sequence[ProcessRecord],
    popens: Mapping[int, subprocess.Popen[bytes]],
    timeout: float,
) -> list[ProcessRecord]:
    deadline = time.monotonic() + timeout
    pending = list(records)
    while True:
        for record in pending:
            proc = popens.get(record.pid)
            if proc is not None:
                proc.poll()  # reaps it if it exited
        alive = [r for r in pending if is_alive(r)]
        # A process can turn zombie between its poll() above and is_alive(): reap it now, or
        # it would stay behind unreaped (is_alive counts a zombie as dead).
        for record in pending:
            proc = popens.get(record.pid)
            if proc is not None and record not in alive:
                proc.wait(timeout=5)
        pending = alive
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.05)


def log_tail(path: str | Path, lines: int = 25) -> str:
    """The last `lines` lines of a log file, for error messages."""
    try:
        data = Path(path).read_bytes()[-16384:]
    except FileNotFoundError:
        return "(no log file)"
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    return "\n".join(text.splitlines()[-lines:])
