"""The files a prepared claim consists of on the host, and their start-up reconciliation.

Per claim: `<state-dir>/claims/<uid>/` with `vgpu.conf` (read by vgpu_hook), `region` (the
shared accounting file, created here at its fixed layout size) and the CDI spec
`<cdi-root>/<vendor>-<class>_<uid>.json` (read by the container runtime); per node:
`<state-dir>/hook/ld.so.preload`. The container sees the claim dir read-only and only `region`
writable (dra_driver/cdi.py; the whole contract is in docs/security.md).
Everything here is derived from a `ClaimPlan`, so the checkpoint
alone can rebuild it (`reconcile`). Used by `kubelet_plugin.prepare`, which decides when.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver import cdi, names
from dra_driver.atomicfile import fsync_dir, remove, write_atomic
from kubelet_plugin.claims import ClaimError
from kubelet_plugin.plan import ClaimPlan, log_level, render_hook_config
from kubelet_plugin.region import REGION_SIZE

log = logging.getLogger(__name__)

HOOK_CONFIG_FILE = "vgpu.conf"
REGION_FILE = cdi.REGION_FILE
# Group members (the containers, via additionalGids) may list and read; nobody but the plugin
# writes: the container gets the dir read-only and the region through its own mount.
CLAIM_DIR_MODE = 0o750
HOOK_CONFIG_MODE = 0o640
REGION_MODE = 0o660
SPEC_MODE = 0o644


@dataclass(slots=True)
class ReconcileReport:
    removed_specs: list[str] = field(default_factory=list)
    removed_claim_dirs: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)


class ClaimFiles:
    """Writes, checks and removes the files of claims under one CDI root and state dir."""

    def __init__(self, *, cdi_root: str, spec: cdi.SpecSettings) -> None:
        self.cdi_root = cdi_root
        self.spec_settings = spec
        self.claims_root = os.path.join(spec.state_dir, "claims")
        self._preload = PreloadFile(spec.state_dir)

    def spec_path(self, uid: str) -> str:
        return os.path.join(self.cdi_root, cdi.spec_file_name(self.spec_settings.kind, uid))

    def conf_path(self, uid: str) -> str:
        return os.path.join(self.claims_root, uid, HOOK_CONFIG_FILE)

    def region_path(self, uid: str) -> str:
        return cdi.region_path(self.spec_settings.state_dir, uid)

    def write(self, plan: ClaimPlan) -> None:
        """Claim dir, region, vgpu.conf, then the CDI spec (the runtime may use it from then on).

        Neither file is fsynced: the checkpoint record written after them is, and start-up
        reconciliation compares every spec and config with it and rewrites what a power loss
        took back or left empty. So the claim's files are recoverable whenever its entry exists,
        and prepare pays one sync instead of three (the latency the kubelet sees).
        """
        gid = self.spec_settings.claim_gid
        self._preload.ensure()  # a mount source of every container
        directory = os.path.join(self.claims_root, plan.uid)
        conf = render_hook_config(plan).encode()
        if _make_claim_dir(directory, self.claims_root, gid):
            # A claim dir this call created is read by nobody before its CDI spec exists (the
            # runtime, the governor and enforcement all come after): its files go in directly,
            # no temp file and rename.
            ensure_region(os.path.join(directory, REGION_FILE), gid, created_dir=True)
            _write_new(os.path.join(directory, HOOK_CONFIG_FILE), conf, HOOK_CONFIG_MODE, gid)
        else:  # a retry, or rewriting what went missing: the old files may be in use
            ensure_region(os.path.join(directory, REGION_FILE), gid)
            write_atomic(
                os.path.join(directory, HOOK_CONFIG_FILE),
                conf,
                mode=HOOK_CONFIG_MODE,
                gid=gid,
                sync=False,
            )
        # Runtimes read the CDI dir at any moment: always atomic.
        write_atomic(
            self.spec_path(plan.uid),
            cdi.encode_spec(self.spec(plan)),
            mode=SPEC_MODE,
            sync=False,
        )

    def spec(self, plan: ClaimPlan) -> dict[str, Any]:
        level = log_level(plan)
        return cdi.build_claim_spec(
            settings=self.spec_settings,
            claim_uid=plan.uid,
            devices=[
                cdi.ClaimDevice(plan.cdi_device_name(device), device.minor)
                for device in plan.devices
            ],
            extra_env={"VGPU_LOG_LEVEL": level} if level else None,
            mig_devices=plan.mig_uuids(),
        )

    def remove(self, uid: str) -> None:
        """The spec, then the claim dir: its two files by name and the dir itself (anything
        else found in it, by walking it); errors are ignored, as a missing file is."""
        remove(self.spec_path(uid))
        directory = os.path.join(self.claims_root, uid)
        for name in (REGION_FILE, HOOK_CONFIG_FILE):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError:  # not empty (or not a directory): what a walk can remove
            shutil.rmtree(directory, ignore_errors=True)

    def present(self, plan: ClaimPlan) -> bool:
        return os.path.exists(self.conf_path(plan.uid)) and os.path.exists(self.spec_path(plan.uid))

    def stale(self, plan: ClaimPlan) -> bool:
        """True when the conf or spec on disk differs from what the plan says (or is missing),
        or the region is missing or not at its layout size."""
        return (
            _read(self.conf_path(plan.uid)) != render_hook_config(plan).encode()
            or _read(self.spec_path(plan.uid)) != cdi.encode_spec(self.spec(plan))
            or _size(self.region_path(plan.uid)) != REGION_SIZE
        )

    def reconcile(self, prepared: Mapping[str, ClaimPlan]) -> ReconcileReport:
        """Remove our specs and claim dirs that `prepared` does not know; rewrite stale ones.

        Files of other vendors in the CDI root are never touched.
        """
        report = ReconcileReport()
        os.makedirs(self.cdi_root, mode=0o755, exist_ok=True)
        os.makedirs(self.claims_root, mode=0o755, exist_ok=True)
        self._preload.ensure()
        for entry in sorted(os.listdir(self.cdi_root)):
            uid = cdi.claim_uid_of_spec_file(self.spec_settings.kind, entry)
            if uid is not None and uid not in prepared:
                remove(os.path.join(self.cdi_root, entry))
                report.removed_specs.append(uid)
        for entry in sorted(os.listdir(self.claims_root)):
            if entry not in prepared:
                shutil.rmtree(os.path.join(self.claims_root, entry), ignore_errors=True)
                report.removed_claim_dirs.append(entry)
        for uid, plan in prepared.items():
            if self.stale(plan):
                self.write(plan)
                report.rewritten.append(uid)
        fsync_dir(self.cdi_root)
        fsync_dir(self.claims_root)
        return report


class PreloadFile:
    """`<state-dir>/hook/ld.so.preload` (mounted over the container's /etc/ld.so.preload),
    checked before every prepare with one `stat`: read (and rewritten if wrong) only when it
    changed since it was last found right."""

    def __init__(self, state_dir: str) -> None:
        self.path = cdi.preload_path(state_dir)
        self.content = f"{names.CONTAINER_HOOK_PATH}\n".encode()
        self._verified: tuple[int, int, int, int] | None = None

    def ensure(self) -> None:
        try:
            status = os.stat(self.path)
            stamp = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        if stamp is not None and stamp == self._verified:
            return
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        if _read(self.path) != self.content:
            write_atomic(self.path, self.content, mode=0o644)
        status = os.stat(self.path)
        self._verified = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def ensure_region(path: str, gid: int, *, created_dir: bool = False) -> bool:
    """Create a claim's region at its fixed layout size, or cut one back to it; True if changed.

    The file is sparse and zero-filled: the first hooked process writes its header. It is the
    only thing a container may write, so its size is the plugin's to keep: a region a tenant
    grew (to fill the node's disk) or shrank is set back to REGION_SIZE here, at prepare, at
    start-up reconciliation and by the governor's pass (`kubelet_plugin.region.Region.intact`).
    Counters in a live region are never reset here. `created_dir`: the claim dir was just made
    by the caller, so the region cannot exist yet.
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if created_dir:
            raise
        fd = os.open(path, flags)
    else:  # new: empty, regular, ours
        try:
            os.ftruncate(fd, REGION_SIZE)
            _set_group(fd, path, gid)
            os.fchmod(fd, REGION_MODE)  # after fchown: it may clear mode bits
        finally:
            os.close(fd)
        return True
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise ClaimError(f"{path} is not a regular file; remove it and prepare again")
        changed = False
        if status.st_size != REGION_SIZE:
            os.ftruncate(fd, REGION_SIZE)
            changed = True
        if status.st_gid != gid:
            _set_group(fd, path, gid)
        if stat.S_IMODE(status.st_mode) != REGION_MODE:
            os.fchmod(fd, REGION_MODE)  # after fchown: it may clear mode bits
    finally:
        os.close(fd)
    return changed


def _write_new(path: str, data: bytes, mode: int, gid: int) -> None:
    """Create `path` (which must not exist) with `data`, `mode` and group `gid`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _set_group(fd, path, gid)
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        if exc.filename is None:  # write errors (ENOSPC, EIO) carry no path: name it
            raise OSError(exc.errno, exc.strerror, path) from exc
        raise
    finally:
        os.close(fd)


def _make_claim_dir(directory: str, claims_root: str, gid: int) -> bool:
    """The claim dir with its group and mode; True when this call created it."""
    try:
        os.mkdir(directory, CLAIM_DIR_MODE)
        created = True
    except FileExistsError:
        created = False
    except FileNotFoundError:  # the claims root itself was removed behind our back
        os.makedirs(claims_root, mode=0o755, exist_ok=True)
        os.mkdir(directory, CLAIM_DIR_MODE)
        created = True
    status = os.stat(directory)
    if status.st_gid != gid:
        _set_group(directory, directory, gid)
    if status.st_mode & 0o7777 != CLAIM_DIR_MODE:
        os.chmod(directory, CLAIM_DIR_MODE)
    return created


def _set_group(target: int | str, path: str, gid: int) -> None:
    """chgrp a claim file (by descriptor or path); a plugin that may not gets a clear error."""
    try:
        os.chown(target, -1, gid)
    except PermissionError:
        raise ClaimError(
            f"cannot give {path} group {gid} (--claim-gid): the plugin must run as root or be "
            f"a member of that group"
        ) from None


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None
