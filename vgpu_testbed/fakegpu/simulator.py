"""Simulated GPU nodes for tests, the dev cluster and the demo: the Python side of `hack/fakegpu`.

The fake `libnvidia-ml.so.1` and `libcuda.so.1` (C, `hack/fakegpu`) read a simulated node from
two files named by environment variables: `VGPU_SIM_PROFILE`, a key=value text rendering of a
machine profile, and `VGPU_SIM_STATE`, the shared state file the first process creates from it.
This module writes the profile file and returns the environment that makes a process see the
node (`prepare_node`), and drives the simulator's fault-injection/status API, which the fake
NVML library exports, in a child process (the C side attaches to one node per process).

Callers: the test bed's node agents and fixtures, integration/e2e tests, `vgpu-dra fakegpu`.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver.atomicfile import write_atomic
from vgpu_testbed.fakegpu.profiles import (
    PROFILES_DIR,
    GpuSpec,
    Profile,
    ProfileError,
    load_profile,
    parse_profile,
    profile_names,
)

__all__ = [
    "PROFILES_DIR",
    "FakeGpuError",
    "GpuSpec",
    "Profile",
    "ProfileError",
    "gpu_status",
    "inject_xid",
    "library_dir",
    "load_profile",
    "parse_profile",
    "prepare_node",
    "profile_names",
    "render_sim_profile",
    "set_gpu_lost",
    "set_gpu_removed",
]

FAKEGPU_DIR = Path(__file__).resolve().parents[2] / "hack" / "fakegpu"
NVML_SONAME = "libnvidia-ml.so.1"
CUDA_SONAME = "libcuda.so.1"

ENV_STATE = "VGPU_SIM_STATE"
ENV_PROFILE = "VGPU_SIM_PROFILE"


class FakeGpuError(RuntimeError):
    """The simulated GPUs cannot be used (libraries not built, no such node, bad GPU...)."""


def library_dir() -> Path:
    """Directory holding the fake `libnvidia-ml.so.1` and `libcuda.so.1`."""
    lib = FAKEGPU_DIR / "build" / "lib"
    if not (lib / NVML_SONAME).is_file():
        raise FakeGpuError(
            f"the simulated GPU libraries are not built ({lib / NVML_SONAME} is missing): "
            "run `make native` in the repository root"
        )
    return lib


def render_sim_profile(profile: Profile) -> str:
    """The key=value text the C side parses (format: hack/fakegpu/src/simstate_profile.c)."""
    lines = [
        f"# vgpu-dra simulated node, generated from profile {profile.name}",
        f"node.name={profile.name}",
        f"node.driver_version={profile.driver_version}",
        f"node.cuda_driver_version={profile.cuda_driver_version}",
        f"gpu.count={len(profile.gpus)}",
    ]
    for i, g in enumerate(profile.gpus):
        fields: dict[str, str] = {
            "name": g.product,
            "uuid": g.uuid,
            "serial": g.serial,
            "pci_bus_id": g.pci_bus_id.upper(),
            "pcie_root": g.pcie_root,
            "brand": g.brand,
            "architecture": g.architecture,
            "compute_capability": g.compute_capability,
            "memory_bytes": str(g.memory_bytes),
            "sm_count": str(g.sm_count),
            "cores_per_sm": str(g.cores_per_sm),
            "pci_device_id": f"0x{g.pci_device_id:08x}",
            "pci_subsystem_id": f"0x{g.pci_subsystem_id:08x}",
            "minor": str(g.minor),
            "numa_node": str(g.numa_node),
            "mig_capable": "1" if g.mig_capable else "0",
            "power_limit_mw": str(g.power_limit_w * 1000),
            "max_sm_clock_mhz": str(g.max_sm_clock_mhz),
            "max_mem_clock_mhz": str(g.max_mem_clock_mhz),
            "memory_bus_width": str(g.memory_bus_width),
            "nvlink": ",".join(f"{link.peer}:{link.links}" for link in g.nvlink),
        }
        lines += [f"gpu.{i}.{key}={value}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


def profile_file_for(state_path: Path) -> Path:
    """Where prepare_node keeps the profile text of a state file."""
    return state_path.with_name(state_path.name + ".profile")


def _write_private(path: Path, text: str) -> None:
    """Atomically replace `path` with `text`, readable by the owner only."""
    write_atomic(str(path), text.encode(), mode=0o600)


def prepare_node(profile: Profile, state_path: str | os.PathLike[str]) -> dict[str, str]:
    """Make `state_path` a simulated node of `profile`; returns the env for its processes.

    Idempotent: preparing the same profile again keeps the node's state (memory held by live
    processes, injected faults). A different profile starts a fresh node (the old state file is
    removed), because the C side refuses a state built from another profile.
    The env holds VGPU_SIM_STATE, VGPU_SIM_PROFILE and LD_LIBRARY_PATH (the fake libraries
    first, then the caller's own LD_LIBRARY_PATH); merge it into the process environment.
    """
    state = Path(state_path).absolute()
    state.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = render_sim_profile(profile)
    profile_path = profile_file_for(state)
    previous = profile_path.read_text() if profile_path.is_file() else None
    if previous != text:
        state.unlink(missing_ok=True)
        _write_private(profile_path, text)
    lib = str(library_dir())
    inherited = os.environ.get("LD_LIBRARY_PATH", "")
    ld_path = lib if not inherited else f"{lib}:{inherited}"
    return {ENV_STATE: str(state), ENV_PROFILE: str(profile_path), "LD_LIBRARY_PATH": ld_path}


# ---- the simulator's control API (exported by the fake libnvidia-ml) ---------------------------


def _state_of(node: str | os.PathLike[str] | Mapping[str, str]) -> Path:
    """A node given as its state path or as the env prepare_node returned."""
    if isinstance(node, Mapping):
        if ENV_STATE not in node:
            raise FakeGpuError(f"the environment has no {ENV_STATE}: not a simulated node")
        return Path(node[ENV_STATE])
    return Path(node)


def control_library(state: Path) -> ctypes.CDLL:
    """Load the fake NVML with this process attached to `state` (one node per process).

    Only for short-lived processes (the CLI): the C side attaches once and reads the env then.
    """
    profile_path = profile_file_for(state)
    if not state.is_file() and not profile_path.is_file():
        raise FakeGpuError(
            f"no simulated node at {state} (create it with prepare_node or `vgpu-dra fakegpu env`)"
        )
    os.environ[ENV_STATE] = str(state)
    if profile_path.is_file():
        os.environ[ENV_PROFILE] = str(profile_path)
    else:
        os.environ.pop(ENV_PROFILE, None)
    lib = ctypes.CDLL(str(library_dir() / NVML_SONAME))
    lib.vgpusim_inject_xid.argtypes = [ctypes.c_int, ctypes.c_ulonglong]
    lib.vgpusim_set_lost.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.vgpusim_set_removed.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.vgpusim_status_json.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.vgpusim_attach_error.restype = ctypes.c_char_p
    return lib


def status_in_process(lib: ctypes.CDLL) -> dict[str, Any]:
    """The node's state from an attached control library (see control_library)."""
    size = 65536
    while True:
        buf = ctypes.create_string_buffer(size)
        n = int(lib.vgpusim_status_json(buf, size))
        if n < 0:
            reason = lib.vgpusim_attach_error().decode(errors="replace")
            raise FakeGpuError(f"cannot attach to the simulated node: {reason}")
        if n < size:
            result: dict[str, Any] = json.loads(buf.value.decode())
            return result
        size = n + 1


def resolve_gpu(status: Mapping[str, Any], gpu: str | int) -> int:
    """Physical index of a GPU given as index or UUID, checked against the node."""
    gpus: list[dict[str, Any]] = status["gpus"]
    text = str(gpu)
    if text.isdigit() and int(text) < len(gpus):
        return int(text)
    for g in gpus:
        if str(g["uuid"]).lower() == text.lower():
            return int(g["index"])
    raise FakeGpuError(
        f"GPU {text!r}: not an index (0..{len(gpus) - 1}) or UUID of node {status['node']!r}"
    )


def _run_cli(node: str | os.PathLike[str] | Mapping[str, str], *args: str) -> str:
    state = _state_of(node)
    done = subprocess.run(
        [sys.executable, "-m", "vgpu_testbed.fakegpu.cli", *args, "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k not in (ENV_STATE, ENV_PROFILE)},
    )
    if done.returncode != 0:
        raise FakeGpuError(done.stderr.strip() or f"vgpu-dra fakegpu {' '.join(args)} failed")
    return done.stdout


def inject_xid(node: str | os.PathLike[str] | Mapping[str, str], gpu: int | str, xid: int) -> None:
    """Raise XID `xid` on physical GPU `gpu` (index or UUID) of the node."""
    _run_cli(node, "inject", "xid", str(gpu), str(xid))


def set_gpu_lost(
    node: str | os.PathLike[str] | Mapping[str, str], gpu: int | str, lost: bool
) -> None:
    """Mark the GPU lost (NVML/CUDA calls on it fail; raises XID 79) or recover it."""
    _run_cli(node, "inject", "lost", str(gpu), *([] if lost else ["--clear"]))


def set_gpu_removed(
    node: str | os.PathLike[str] | Mapping[str, str], gpu: int | str, removed: bool
) -> None:
    """Hot-remove the GPU (processes starting later do not see it) or add it back."""
    _run_cli(node, "inject", "removed" if removed else "added", str(gpu))


def gpu_status(node: str | os.PathLike[str] | Mapping[str, str]) -> dict[str, Any]:
    """The node's state: per GPU flags, memory (total, used, per process), utilisation."""
    result: dict[str, Any] = json.loads(_run_cli(node, "status", "--json"))
    return result
