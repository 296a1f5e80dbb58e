"""Where the control-plane binaries are, and which Kubernetes version they are.

The version comes from hack/testbed/versions.env (the one place it is pinned; build.sh reads it
too), the binaries from the cache build.sh fills. Called by `vgpu_testbed.cluster.control_plane` and
the e2e fixture (to skip or fail early with the fix).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_ENV = REPO_ROOT / "hack" / "testbed" / "versions.env"
FALLBACK_K8S_VERSION = "v1.37.1"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")


class BinariesMissingError(RuntimeError):
    """The control-plane binaries have not been built."""


def pinned_versions() -> dict[str, str]:
    """KEY=VALUE pairs of hack/testbed/versions.env (empty when not in a source checkout)."""
    try:
        text = VERSIONS_ENV.read_text()
    except FileNotFoundError:
        return {}
    pairs = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip().strip("\"'")
    return pairs


def k8s_version() -> str:
    return pinned_versions().get("K8S_VERSION", FALLBACK_K8S_VERSION)


def default_bin_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$VGPU_DRA_K8S_BIN`, else `${VGPU_DRA_CACHE:-~/.cache/vgpu-dra}/k8s/<version>/bin`."""
    env = os.environ if env is None else env
    if env.get("VGPU_DRA_K8S_BIN"):
        return Path(env["VGPU_DRA_K8S_BIN"])
    cache = Path(env.get("VGPU_DRA_CACHE") or Path.home() / ".cache" / "vgpu-dra")
    return cache / "k8s" / k8s_version() / "bin"


def find_binaries(bin_dir: Path | None = None) -> dict[str, Path]:
    """Paths of the four binaries; BinariesMissingError names what is missing and the fix."""
    bin_dir = bin_dir or default_bin_dir()
    found = {name: bin_dir / name for name in BINARIES}
    missing = [name for name, path in found.items() if not path.is_file()]
    if missing:
        raise BinariesMissingError(
            f"control-plane binaries not built: {', '.join(missing)} missing in {bin_dir}. "
            "Run `make controlplane` (bash hack/testbed/build.sh; ~8 min the first time)."
        )
    return found
