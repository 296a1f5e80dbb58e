"""`discover()` against the simulated GPUs, through the real pynvml and the fake libnvidia-ml.so.1.

Each case runs discovery in a fresh subprocess started with the simulated node's environment
(`vgpu_testbed.fakegpu.simulator.prepare_node`), exactly as the kubelet plugin process is started by
the test bed, and compares the inventory with the machine profile.

What this proves:
1. dgx-h100: 8 GPUs with the profile's UUIDs, names, memory, 132 SMs (derived from NVML), Hopper,
   compute capability 9.0, NUMA 0 for GPUs 0-3 and 1 for 4-7, all in ONE NVLink domain.
2. a100-2x4: two NVLink domains of four GPUs (0-3 and 4-7), no link between them.
3. a10-pcie: no NVLink, so no domain and no peers; 72 SMs; Ampere.
4. Bus IDs are in sysfs form and every GPU gets a PCIe root; GPUs the profile puts under one
   root complex share a root, others do not.
5. A lost GPU is left out with a warning; the rest of the node is still discovered.
6. Without any libnvidia-ml.so.1, discovery fails with InventoryError and a hint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import run_python
from vgpu_testbed.fakegpu import simulator as fakegpu

DISCOVER = "from dra_driver.inventory import discover; print(discover().model_dump_json())"


def node_env(profile_name: str, tmp_path: Path) -> dict[str, str]:
    profile = fakegpu.load_profile(profile_name)
    return dict(fakegpu.prepare_node(profile, tmp_path / f"{profile_name}.state"))


def run_discover(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_python(env, DISCOVER)


def discovered(profile_name: str, tmp_path: Path) -> dict[str, Any]:
    done = run_discover(node_env(profile_name, tmp_path))
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_dgx_h100_is_one_nvlink_domain_split_over_two_numa_nodes(tmp_path: Path) -> None:
    inventory = discovered("dgx-h100", tmp_path)
    profile = fakegpu.load_profile("dgx-h100")
    gpus = inventory["gpus"]
    assert len(gpus) == 8
    assert inventory["driver_version"] == "580.95.05"
    assert inventory["cuda_driver_version"] == "13.0"
    for index, gpu in enumerate(gpus):
        assert gpu["index"] == index
        assert gpu["uuid"] == profile.gpus[index].uuid
        assert gpu["product_name"] == "NVIDIA H100 80GB HBM3"
        assert gpu["architecture"] == "Hopper"
        assert gpu["cuda_compute_capability"] == "9.0"
        assert gpu["sm_count"] == 132
        assert gpu["memory_bytes"] == profile.gpus[index].memory_bytes
        assert gpu["numa_node"] == (0 if index < 4 else 1)
        assert gpu["nvlink_domain"] == 0
        assert sorted(gpu["nvlink_peers"]) == [i for i in range(8) if i != index]
        assert gpu["mig_capable"] is True


def test_a100_2x4_has_two_nvlink_islands(tmp_path: Path) -> None:
    gpus = discovered("a100-2x4", tmp_path)["gpus"]
    assert [g["nvlink_domain"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    for gpu in gpus:
        island = range(0, 4) if gpu["index"] < 4 else range(4, 8)
        assert set(gpu["nvlink_peers"]) <= set(island)
        assert gpu["nvlink_peers"]
        assert gpu["sm_count"] == 108
        assert gpu["architecture"] == "Ampere"


def test_a10_pcie_has_no_nvlink_domain(tmp_path: Path) -> None:
    gpus = discovered("a10-pcie", tmp_path)["gpus"]
    assert len(gpus) == 4
    for gpu in gpus:
        assert gpu["nvlink_domain"] is None
        assert gpu["nvlink_peers"] == []
        assert gpu["sm_count"] == 72
        assert gpu["product_name"] == "NVIDIA A10"


def test_bus_ids_and_pcie_roots(tmp_path: Path) -> None:
    for gpu in discovered("dgx-h100", tmp_path)["gpus"]:
        domain, bus, rest = gpu["pci_bus_id"].split(":")
        assert len(domain) == 4 and len(bus) == 2 and rest.endswith(".0")
        assert gpu["pcie_root"].startswith("pci") and gpu["pcie_root"]


def test_gpus_sharing_a_root_complex_share_a_pcie_root(tmp_path: Path) -> None:
    profile = fakegpu.load_profile("dgx-h100")
    roots = [gpu["pcie_root"] for gpu in discovered("dgx-h100", tmp_path)["gpus"]]
    for a, gpu_a in enumerate(profile.gpus):
        for b, gpu_b in enumerate(profile.gpus):
            assert (roots[a] == roots[b]) == (gpu_a.pcie_root == gpu_b.pcie_root)


def test_a_lost_gpu_is_left_out_not_fatal(tmp_path: Path) -> None:
    env = node_env("dgx-h100", tmp_path)
    assert len(json.loads(run_discover(env).stdout)["gpus"]) == 8  # also creates the state
    fakegpu.set_gpu_lost(env, 3, True)
    done = run_discover(env)
    assert done.returncode == 0, done.stderr
    gpus = json.loads(done.stdout)["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert "GPU 3 left out" in done.stderr
    assert {g["nvlink_domain"] for g in gpus} == {0}


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="a real NVIDIA driver is present")
def test_without_nvml_discovery_raises_an_actionable_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_SIM")}
    env["LD_LIBRARY_PATH"] = ""
    done = subprocess.run(
        [sys.executable, "-c", DISCOVER], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode != 0
    assert "InventoryError" in done.stderr and "LD_LIBRARY_PATH" in done.stderr


@pytest.mark.gpu
def test_real_gpus_inventory_agrees_with_sysfs() -> None:
    """On a real node: SMs are derived (never 0 on a known architecture), and the PCIe root and
    NUMA node agree with sysfs, which the simulated path above cannot check."""
    from dra_driver.inventory import discover, pcie_root_from_sysfs_path

    inventory = discover()
    assert inventory.gpus
    for gpu in inventory.gpus:
        assert gpu.sm_count > 0, gpu
        device = Path("/sys/bus/pci/devices", gpu.pci_bus_id)
        assert device.exists(), f"{gpu.pci_bus_id} not in sysfs"
        assert gpu.pcie_root == pcie_root_from_sysfs_path(os.path.realpath(device))
        numa = int((device / "numa_node").read_text())
        assert gpu.numa_node == (numa if numa >= 0 else None)
