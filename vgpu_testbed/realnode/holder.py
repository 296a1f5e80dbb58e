"""PID 1 of a real bed node: holds its namespaces, hides the host's fixed paths, cleans up.

Started by `vgpu_testbed.realnode.node` through `Cluster.spawn`; the started process unshares
the mount and network namespaces, forks PID 1 of a new PID namespace and then only waits for it,
forwarding SIGTERM (so the recorded process lives exactly as long as the node's cleanup runs).
The node's containerd, shims, containers and kubelet (entered with nsenter) all live in these
namespaces. Why each:
- PID: when this process dies the kernel kills every process of the node, containers and the
  daemonised shims included, so no process outlives the node even after a SIGKILL.
- mount: the kubelet and containerd write to fixed host paths (`/var/lib/kubelet/device-plugins`,
  `/var/log/containers`, `/run/containerd/s`, CNI's `/var/lib/cni`); here `/run`, `/var/lib` and
  `/var/log` are bind mounts of directories under the node's own directory, and every mount the
  node makes (rootfs overlays, volumes, netns files) dies with the namespace.
- network: the node gets its own address (`--node-ip`), CNI bridge and ports.
On SIGTERM (also its parent-death signal: a SIGKILLed starter takes the waiting parent with
it, whose death signals PID 1) it stops every process of the node
(SIGTERM, then SIGKILL after a grace period), reaps them and removes the node's cgroups.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from vgpu_testbed.realnode.cgroups import remove_cgroup_parent, remove_cgroup_tree

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
HIDDEN = ("run", "var/lib", "var/log")  # host dirs the node sees as its own (under its dir)
GRACE_SECONDS = 3.0


def _libc_call(name: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _mount_private(node_dir: Path) -> None:
    # Nothing mounted here may reach the host, and a fresh /proc shows only the node's processes.
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "-t", "proc", "proc", "/proc"], check=True)
    for hidden in HIDDEN:
        source = node_dir / "host" / hidden
        source.mkdir(parents=True, exist_ok=True, mode=0o755)
        subprocess.run(["mount", "--bind", str(source), "/" + hidden], check=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def _stop_all() -> None:
    """Terminate every other process of the PID namespace and reap it."""
    try:
        os.kill(-1, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _pid1(args: argparse.Namespace) -> int:
    stopping = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    _libc_call("prctl", PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    _mount_private(args.node_dir)
    args.ready_file.write_text("ready\n")
    while not stopping:
        # Reap whatever gets re-parented to us (shims' intermediate processes, exited daemons).
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        if pid == 0:
            time.sleep(0.2)
    _stop_all()
    remove_cgroup_tree(args.cgroup_root)
    # The cluster's parent cgroup goes with its last node (fails harmlessly while others live).
    remove_cgroup_parent(args.cgroup_root)
    return 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="vgpu_testbed.realnode.holder")
    parser.add_argument("--node-dir", type=Path, required=True)
    parser.add_argument("--cgroup-root", required=True, help="e.g. /vgpu-dra-bed-ab12/node-1")
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--pid-file", type=Path, required=True, help="PID 1's host PID goes here")
    args = parser.parse_args(list(argv))
    _libc_call("unshare", CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID)
    child = os.fork()
    if child == 0:
        try:
            code = _pid1(args)
        except BaseException as exc:
            print(f"node holder failed: {exc!r}", file=sys.stderr, flush=True)
            code = 1
        os._exit(code)
    args.pid_file.write_text(f"{child}\n")

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            _, status = os.waitpid(child, 0)
        except InterruptedError:
            continue
        return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
