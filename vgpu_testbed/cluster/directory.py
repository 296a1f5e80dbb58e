"""The cluster directory as a resource: claim it (refusing a live cluster or someone else's
files), and give it back (removing only what the test bed created).

Why careful: `--dir` is user input; `down` must never delete a directory's unrelated contents,
and `up` must never start a second control plane over a running one. Called by
`vgpu_testbed.cluster.control_plane`.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from vgpu_testbed import procs
from vgpu_testbed.cluster import state as cluster_state
from vgpu_testbed.cluster.flags import Layout

# What we create inside a cluster directory, and so the only things teardown removes.
# `nodes/<node>/` is where per-node agents (simulated GPUs, kubelet plugin, kubelet stand-in)
# keep their files; it belongs to the cluster and goes with it.
OWNED_ENTRIES = (
    "pki",
    "etcd",
    "logs",
    "kubeconfig",
    "kubeconfigs",
    "serving",
    "images",  # the image archives real nodes import (vgpu_testbed.realnode.images)
    "nodes",
    "controller",  # the allocation controller's applied RBAC, example and log
    "state.json",
)
# Kept with `keep_logs` (after a failure): logs only, no credentials.
LOG_ENTRIES = ("logs", "controller")


class ClusterBusyError(RuntimeError):
    """The directory already has a running cluster, or holds files that are not ours."""


def prepare_dir(layout: Layout) -> None:
    """Make the directory ours: refuse a live cluster or foreign files; clear a dead one."""
    root = layout.root
    if layout.state_file.exists():
        try:
            old = cluster_state.load(layout.state_file)
        except cluster_state.StateError:
            old = None
        alive = [p for p in (old.processes if old else []) if procs.is_alive(p)]
        if alive:
            names = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
            raise ClusterBusyError(
                f"a cluster is already running in {root}: {names}. "
                f"Stop it with `vgpu-dra dev-cluster down --dir {root}` or use another --dir."
            )
        remove_owned(layout, keep_logs=False)
    elif root.exists():
        foreign = sorted(p.name for p in root.iterdir() if p.name not in OWNED_ENTRIES)
        if foreign:
            raise ClusterBusyError(
                f"{root} is not empty ({', '.join(foreign[:5])}...); the test bed only uses an "
                "empty or its own directory, so pick another --dir"
            )
        remove_owned(layout, keep_logs=False)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)  # keys and tokens inside: private even if the directory pre-existed


def remove_owned(layout: Layout, *, keep_logs: bool) -> None:
    root = layout.root
    if not root.is_dir():
        return
    for entry in OWNED_ENTRIES:
        if keep_logs and entry in LOG_ENTRIES:
            continue
        path = root / entry
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)
    (root / ".state.json.tmp").unlink(missing_ok=True)
    if not keep_logs:
        with contextlib.suppress(OSError):
            root.rmdir()  # only if nothing else is left
