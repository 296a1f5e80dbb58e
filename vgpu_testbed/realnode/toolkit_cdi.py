"""The simulated driver's CDI spec, shaped like the one the NVIDIA Container Toolkit generates.

On a real GPU node `nvidia-ctk cdi generate` writes a `nvidia.com/gpu` spec: one device per GPU
(named by index and by UUID, each with its `/dev/nvidiaN` node) and common edits that inject the
driver (the user-space libraries, `/dev/nvidiactl`). Our kubelet plugin returns those device IDs
alongside its own claim IDs (`dra_driver.cdi.nvidia_toolkit_ids`), so the runtime brings in the
driver. On a bed node the "driver" is the simulator: the edits mount the simulated
`libnvidia-ml.so.1` and `libcuda.so.1` where the toolkit mounts the real ones, plus the node's
simulator files (state and profile) with the environment that names them. Pure: returns the spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver.cdi import NVIDIA_MAJOR, NVIDIA_TOOLKIT_KIND, NVIDIACTL_MINOR
from vgpu_testbed.fakegpu.simulator import CUDA_SONAME, ENV_PROFILE, ENV_STATE, NVML_SONAME, GpuSpec

CONTAINER_LIB_DIR = "/usr/lib/x86_64-linux-gnu"
CONTAINER_SIM_DIR = "/run/vgpu-sim"
SPEC_FILE = "nvidia.com-gpu.json"  # `nvidia-ctk cdi generate` names its file after the kind too


def _node(minor: int) -> dict[str, Any]:
    return {"path": f"/dev/nvidia{minor}", "type": "c", "major": NVIDIA_MAJOR, "minor": minor}


def _mount(host: Path, container: str, access: str) -> dict[str, Any]:
    return {
        "hostPath": str(host),
        "containerPath": container,
        "type": "bind",
        "options": ["bind", access, "nosuid", "nodev"],
    }


def toolkit_spec(
    gpus: Sequence[GpuSpec], *, library_dir: Path, state_file: Path, profile_file: Path
) -> dict[str, Any]:
    """The `nvidia.com/gpu` spec of one simulated node."""
    devices: list[dict[str, Any]] = []
    for index, gpu in enumerate(gpus):
        edits = {"deviceNodes": [_node(gpu.minor)]}
        devices.append({"name": str(index), "containerEdits": edits})
        devices.append({"name": gpu.uuid, "containerEdits": edits})
    devices.append(
        {"name": "all", "containerEdits": {"deviceNodes": [_node(g.minor) for g in gpus]}}
    )
    state_in = f"{CONTAINER_SIM_DIR}/gpus.state"
    profile_in = f"{CONTAINER_SIM_DIR}/profile"
    return {
        "cdiVersion": "0.5.0",
        "kind": NVIDIA_TOOLKIT_KIND,
        "devices": devices,
        "containerEdits": {
            "env": [f"{ENV_STATE}={state_in}", f"{ENV_PROFILE}={profile_in}"],
            "deviceNodes": [
                {
                    "path": "/dev/nvidiactl",
                    "type": "c",
                    "major": NVIDIA_MAJOR,
                    "minor": NVIDIACTL_MINOR,
                }
            ],
            "mounts": [
                _mount(library_dir / NVML_SONAME, f"{CONTAINER_LIB_DIR}/{NVML_SONAME}", "ro"),
                _mount(library_dir / CUDA_SONAME, f"{CONTAINER_LIB_DIR}/{CUDA_SONAME}", "ro"),
                # The simulator's shared state: every process on the node (the plugin's NVML
                # too) maps this file, as every process shares one real driver.
                _mount(state_file, state_in, "rw"),
                _mount(profile_file, profile_in, "ro"),
            ],
        },
    }
