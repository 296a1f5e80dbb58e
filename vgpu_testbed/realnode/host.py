"""Can this host run real bed nodes? And where are the node binaries?

Real nodes need root (namespaces, mounts, cgroups), writable cgroups, runc and the CNI plugins
(distribution packages), and the kubelet and containerd that hack/testbed/build.sh builds.
`check_host()` lists what is missing with the fix for each, so `dev-cluster up` can say why it
falls back to the kubelet stand-in.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from vgpu_testbed.cluster import binaries as cluster_binaries
from vgpu_testbed.realnode.cgroups import hierarchies
from vgpu_testbed.realnode.config import CNI_BIN_DIRS

FALLBACK_CONTAINERD_VERSION = "v2.4.2"
NODE_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")


def containerd_version() -> str:
    return cluster_binaries.pinned_versions().get("CONTAINERD_VERSION", FALLBACK_CONTAINERD_VERSION)


def containerd_bin_dir(env: Mapping[str, str] | None = None) -> Path:
    """`${VGPU_DRA_CACHE:-~/.cache/vgpu-dra}/containerd/<version>/bin`."""
    env = os.environ if env is None else env
    cache = Path(env.get("VGPU_DRA_CACHE") or Path.home() / ".cache" / "vgpu-dra")
    return cache / "containerd" / containerd_version() / "bin"


def check_host() -> list[str]:
    """What prevents real nodes here (empty: nothing)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (real nodes need namespaces, mounts and cgroups)")
    if not hierarchies() or not all(os.access(h, os.W_OK) for h in hierarchies()):
        problems.append("cgroups are not writable")
    for tool, package in (("runc", "runc"), ("ip", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            problems.append(f"{tool} missing (apt-get install {package})")
    if not any(Path(d, "bridge").is_file() for d in CNI_BIN_DIRS):
        problems.append("CNI plugins missing (apt-get install containernetworking-plugins)")
    if not any(Path(p).is_file() for p in ("/bin/busybox", "/usr/bin/busybox")):
        problems.append("busybox missing (apt-get install busybox-static)")
    kubelet = cluster_binaries.default_bin_dir() / "kubelet"
    missing = [n for n in NODE_BINARIES if not (containerd_bin_dir() / n).is_file()]
    if not kubelet.is_file() or missing:
        problems.append("kubelet/containerd not built (run `make controlplane`)")
    return problems
