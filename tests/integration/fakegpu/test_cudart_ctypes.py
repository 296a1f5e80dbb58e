"""The simulated CUDA runtime (libcudart.so.12 and .13) loaded by an unmodified client.

Every check runs a Python child process that loads `libcudart.so.<major>` through ctypes from
the simulated node's LD_LIBRARY_PATH, as PyTorch's libraries load it, and calls the runtime the
way compiled code does (cudaGetDeviceProperties_v2 for CUDA 12 callers; a kernel registered with
__cudaRegisterFatBinary/__cudaRegisterFunction and launched with cudaLaunchKernel).

Proves, for both major versions:
1. On a simulated `l4-2` node the runtime reports the profile's GPUs: count, name, memory, SMs,
   compute capability, PCI bus, through cudaGetDeviceProperties and cudaDeviceGetAttribute;
   runtime and driver versions are CUDA's.
2. cudaMemGetInfo reports the GPU's memory, a cudaMalloc lowers the free memory by exactly its
   size and one past the GPU fails with cudaErrorMemoryAllocation.
3. 10 launches x 4 waves of a kernel whose device name says 500 us per wave take the simulated
   driver's predicted time: 10 x (launch overhead + 4 x 500 us) on the simulated timeline
   (events), and at least that of wall-clock time (synchronisation waits for it).
(Under vgpu_hook inside a claim: tests/integration/vgpu_hook/test_cudart_caps.py.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fixtures.cudart_probe import run_probe
from vgpu_testbed.fakegpu.simulator import load_profile, prepare_node

REPO = Path(__file__).resolve().parents[3]
LIB_DIR = REPO / "hack" / "fakegpu" / "build" / "lib"
MIB = 1 << 20
MAJORS = [12, 13]
CUDA_ERROR_MEMORY_ALLOCATION = 2


@pytest.fixture(scope="module")
def l4_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    subprocess.run(["make", "-s", "-C", str(REPO / "hack" / "fakegpu"), "all"], check=True)
    profile = load_profile("l4-2")
    env = prepare_node(profile, tmp_path_factory.mktemp("l4") / "node.state")
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **env}


@pytest.mark.parametrize("major", MAJORS)
def test_device_properties_are_the_profiles(l4_env: dict[str, str], major: int) -> None:
    gpu = load_profile("l4-2").gpus[0]
    out = run_probe(l4_env, major, "device")
    assert out["count_rc"] == 0 and out["count"] == 2
    assert out["runtime_version"] == (12090 if major == 12 else 13050)
    assert out["driver_version"] == 13000
    assert out["props_rc"] == 0
    assert out["name"] == gpu.product
    assert out["prop_total"] == gpu.memory_bytes
    assert out["sms"] == gpu.sm_count
    assert out["cc"] == gpu.compute_capability
    assert out["pci_bus"] == int(gpu.pci_bus_id.split(":")[1], 16)


@pytest.mark.parametrize("major", MAJORS)
def test_memory_info_and_allocations(l4_env: dict[str, str], major: int) -> None:
    out = run_probe(l4_env, major, "memory")
    assert out["total"] == load_profile("l4-2").gpus[0].memory_bytes
    assert out["alloc_rc"] == 0
    assert out["free0"] - out["free1"] == 256 * MIB  # type: ignore[operator]
    assert out["past_claim_rc"] == 0  # no claim here: 300 MiB fits the 23 GiB GPU
    assert out["tib_rc"] == CUDA_ERROR_MEMORY_ALLOCATION
    assert out["last_error"] == CUDA_ERROR_MEMORY_ALLOCATION
    assert out["free_rc"] == 0


@pytest.mark.parametrize("major", MAJORS)
def test_launch_takes_the_simulated_time(l4_env: dict[str, str], major: int) -> None:
    out = run_probe(l4_env, major, "launch")
    # The driver's kernel model: launch_ns (VGPU_SIM_LAUNCH_NS, 2 us) + 4 waves x 500 us.
    predicted_ms = 10 * (0.002 + 4 * 0.5)
    assert abs(float(out["elapsed_ms"]) - predicted_ms) < 0.001  # type: ignore[arg-type]
    assert predicted_ms <= float(out["wall_ms"])  # type: ignore[arg-type]  # it waited
