"""Crash-safe file writes: a reader sees the old content or the new one, never a torn file.

Used by the kubelet plugin for everything a crash must not corrupt: the checkpoint, CDI specs
(container runtimes read them at any moment) and the per-claim hook configuration. The recipe is
the usual one: write a temp file in the same directory, fsync it, rename it over the target, then
fsync the directory so the rename itself survives a power loss.
"""

from __future__ import annotations

import contextlib
import os
import secrets


def write_atomic(
    path: str,
    data: bytes,
    *,
    mode: int = 0o644,
    gid: int | None = None,
    sync: bool = True,
    sync_dir: bool = True,
) -> None:
    """Replace `path` with `data` atomically; the file gets exactly `mode` (umask ignored).

    `gid` changes the file's group (before it becomes visible). `sync=False` skips the fsyncs
    (file and directory): readers still never see a torn file, but a power loss may take the
    write back — only for files that another, synced record can rebuild. The temp file is removed
    when anything fails, so a failed write leaves no debris.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)
            if gid is not None:
                os.fchown(fd, -1, gid)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if exc.filename is None:  # write/fsync errors (ENOSPC, EIO) carry no path: name it
            raise OSError(exc.errno, exc.strerror, path) from exc
        raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync and sync_dir:
        fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    """Persist a directory's entries (renames, unlinks)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: str) -> bool:
    """Unlink `path`; True if it existed. A missing file is fine (unprepare is idempotent)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
