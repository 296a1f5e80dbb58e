"""The cgroups of a real bed node: created before its kubelet starts, removed when it stops.

The kubelet (cgroupfs driver) puts its pods under `--cgroup-root`, which must exist in every
hierarchy beforehand; on this cgroup v1 machine that means one directory per mounted controller.
Each bed node gets `/vgpu-dra-bed-<cluster id>/<node>`, so teardown removes exactly the bed's
directories (deepest first: a cgroup directory can only be removed once it has no children and
no processes). Works on cgroup v2 too (one hierarchy).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")


def hierarchies(base: Path = CGROUP_FS) -> list[Path]:
    """Mount points of the cgroup hierarchies (v1: one per controller; v2: the root)."""
    if (base / "cgroup.controllers").exists():
        return [base]
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            sep = fields.index("-")
            fstype, mount_point = fields[sep + 1], fields[4]
            if fstype in ("cgroup", "cgroup2") and mount_point.startswith(str(base) + "/"):
                found.append(Path(mount_point))
    return sorted(set(found))


def ensure_cgroup(root: str) -> None:
    for hierarchy in hierarchies():
        (hierarchy / root.strip("/")).mkdir(parents=True, exist_ok=True)


def existing(root: str) -> list[Path]:
    """The directories of `root` that still exist, in any hierarchy."""
    return [h / root.strip("/") for h in hierarchies() if (h / root.strip("/")).exists()]


def remove_cgroup_tree(root: str) -> list[str]:
    """rmdir `root` and everything below it in every hierarchy; returns what could not go."""
    left = []
    for top in existing(root):
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            try:
                os.rmdir(dirpath)
            except OSError as exc:
                left.append(f"{dirpath}: {exc.strerror}")
    return left


def remove_cgroup_parent(root: str) -> None:
    """rmdir the parent of `root` where it is empty (the last node of a cluster takes it)."""
    parent = os.path.dirname(root.rstrip("/")).strip("/")
    if not parent:
        return
    for hierarchy in hierarchies():
        with contextlib.suppress(OSError):
            os.rmdir(hierarchy / parent)
