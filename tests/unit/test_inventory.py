# ruff: noqa: N802  (the NVML double must use pynvml's function names)
"""Pure parts of GPU discovery: enum names, SM derivation, bus IDs, PCIe roots, NVLink domains.

Also drives `discover()` through a tiny in-memory NVML double to prove the error policy (a GPU
whose queries fail is skipped; NVML that cannot start raises InventoryError). The real NVML path
is covered against the simulated GPUs in tests/integration/test_inventory.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dra_driver import inventory
from dra_driver.inventory import InventoryError


def test_brand_and_architecture_names_follow_nvml_enums() -> None:
    assert inventory.brand_name(2) == "Tesla"
    assert inventory.brand_name(14) == "NVIDIA"
    assert inventory.brand_name(99) == "Unknown(99)"
    assert inventory.architecture_name(9) == "Hopper"
    assert inventory.architecture_name(7) == "Ampere"
    assert inventory.architecture_name(8) == "Ada"
    assert inventory.architecture_name(0xFFFFFFFF) == f"Unknown({0xFFFFFFFF})"


@pytest.mark.parametrize(
    ("cores", "cc", "sms"),
    [
        (16896, (9, 0), 132),  # H100 SXM
        (6912, (8, 0), 108),  # A100: GA100 has 64 FP32 lanes per SM
        (9216, (8, 6), 72),  # A10: GA102 has 128
        (7424, (8, 9), 58),  # L4
        (5120, (7, 0), 80),  # V100
        (3584, (6, 0), 56),  # P100
    ],
)
def test_sm_count_from_cuda_cores_uses_the_compute_capability(
    cores: int, cc: tuple[int, int], sms: int
) -> None:
    assert inventory.sm_count_from_cores(cores, *cc) == sms


def test_sm_count_from_cores_refuses_to_guess() -> None:
    assert inventory.sm_count_from_cores(1000, 99, 0) is None  # unknown architecture
    assert inventory.sm_count_from_cores(100, 9, 0) is None  # not a multiple of 128
    assert inventory.sm_count_from_cores(0, 9, 0) is None


def test_bus_ids_are_normalised_to_the_sysfs_form() -> None:
    assert inventory.normalize_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert inventory.normalize_bus_id("0000:AB:1F.7") == "0000:ab:1f.7"
    assert inventory.normalize_bus_id("00010000:01:00.0") == "10000:01:00.0"
    with pytest.raises(ValueError, match="not of the form"):
        inventory.normalize_bus_id("18:00.0")


def test_pcie_root_comes_from_the_root_component_of_the_sysfs_path() -> None:
    resolved = "/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:00.0"
    assert inventory.pcie_root_from_sysfs_path(resolved) == "pci0000:17"
    assert inventory.pcie_root_from_sysfs_path("/sys/devices/platform/foo") is None


def test_pcie_root_is_resolved_through_a_sysfs_symlink(tmp_path: Path) -> None:
    device = tmp_path / "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    device.mkdir(parents=True)
    links = tmp_path / "bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:3b:00.0").symlink_to(device)
    assert inventory._sysfs_pcie_root("0000:3b:00.0", str(tmp_path)) == "pci0000:3a"
    assert inventory._sysfs_pcie_root("0000:99:00.0", str(tmp_path)) is None


def test_synthetic_roots_group_gpus_under_one_host_bridge() -> None:
    buses = {0: "0000:18:00.0", 1: "0000:2a:00.0", 2: "0000:3a:00.0", 3: "0000:5d:00.0"}
    roots = inventory.pcie_roots_from_groups(buses, {frozenset((0, 1)), frozenset((2, 3))})
    assert roots == {0: "pci0000:18", 1: "pci0000:18", 2: "pci0000:3a", 3: "pci0000:3a"}
    alone = inventory.pcie_roots_from_groups(buses, set())
    assert len(set(alone.values())) == 4


def test_nvlink_domains_are_connected_components_numbered_by_lowest_index() -> None:
    # two islands of four (A100 2x4), reported one-sidedly and with a self loop
    peers = {0: [1, 2, 3], 1: [0], 2: [3, 2], 3: [], 4: [5], 5: [6], 6: [7], 7: [4]}
    domains = inventory.nvlink_domains(peers)
    assert domains == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_gpus_without_links_have_no_domain() -> None:
    assert inventory.nvlink_domains({0: [], 1: [], 2: [3], 3: [2], 4: [9]}) == {
        0: None,
        1: None,
        2: 0,
        3: 0,
        4: None,  # a link to a GPU we do not know (skipped or foreign) does not make a domain
    }


def test_cuda_version_string() -> None:
    assert inventory.cuda_version_string(13000) == "13.0"
    assert inventory.cuda_version_string(12040) == "12.4"


# ---------------------------------------------------------------- discover() error policy


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class TinyNvml:
    """Just enough of the pynvml surface for two PCIe GPUs; `broken` GPUs fail their UUID query."""

    def __init__(self, *, broken: frozenset[int] = frozenset(), init_fails: bool = False) -> None:
        self.broken = broken
        self.init_fails = init_fails
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise FakeNvmlError(12)  # LIBRARY_NOT_FOUND

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.95.05"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + handle:02X}:00.0".encode())

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return (8, 6)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        if handle in self.broken:
            raise FakeNvmlError(15)  # GPU_IS_LOST
        return f"GPU-0000000{handle}-0000-0000-0000-000000000000"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA A10"

    def nvmlDeviceGetBrand(self, handle: int) -> int:
        return 14

    def nvmlDeviceGetArchitecture(self, handle: int) -> int:
        return 7

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=24 << 30)

    def nvmlDeviceGetAttributes_v2(self, handle: int) -> Any:
        raise FakeNvmlError(3)  # NOT_SUPPORTED on full GPUs with older drivers

    def nvmlDeviceGetNumGpuCores(self, handle: int) -> int:
        return 9216

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        raise FakeNvmlError(3)

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        raise FakeNvmlError(3)

    def nvmlDeviceGetTopologyCommonAncestor(self, first: int, second: int) -> int:
        return 50  # SYSTEM: different root complexes


def test_discover_reads_every_field_through_nvml(tmp_path: Path) -> None:
    nvml = TinyNvml()
    inv = inventory.discover(nvml=nvml, sysfs_root=str(tmp_path))
    assert inv.driver_version == "580.95.05"
    assert inv.cuda_driver_version == "13.0"
    assert [gpu.index for gpu in inv.gpus] == [0, 1]
    gpu = inv.gpus[1]
    assert gpu.pci_bus_id == "0000:19:00.0"
    assert gpu.sm_count == 72  # 9216 cores / 128 per SM at cc 8.6
    assert gpu.architecture == "Ampere"
    assert gpu.brand == "NVIDIA"
    assert gpu.numa_node == 1
    assert gpu.mig_capable is False
    assert gpu.nvlink_domain is None and gpu.nvlink_peers == ()
    assert gpu.pcie_root == "pci0000:19"  # no sysfs: synthetic, one root per GPU here
    assert nvml.shutdown_calls == 1


def test_a_gpu_that_errors_is_skipped_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inv = inventory.discover(nvml=TinyNvml(broken=frozenset({0})), sysfs_root=str(tmp_path))
    assert [gpu.index for gpu in inv.gpus] == [1]
    assert "GPU 0 left out" in caplog.text


def test_nvml_that_cannot_start_raises_an_actionable_error() -> None:
    with pytest.raises(InventoryError, match="LD_LIBRARY_PATH"):
        inventory.discover(nvml=TinyNvml(init_fails=True))


class SwitchedNvml(TinyNvml):
    """Four GPUs whose NVLinks all end at NVSwitches; GPUs 0-2 are P2P-reachable over NVLink,
    GPU 3's links are up but lead nowhere it can reach (e.g. another fabric partition)."""

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link >= 4:
            raise FakeNvmlError(2)  # INVALID_ARGUMENT: past the last link
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        return 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH

    def nvmlDeviceGetP2PStatus(self, first: int, second: int, caps: int) -> int:
        assert caps == 3  # NVML_P2P_CAPS_INDEX_NVLINK
        return 0 if first < 3 and second < 3 else 4  # OK / NOT_SUPPORTED


def test_gpus_behind_nvswitches_are_peers_when_p2p_over_nvlink_works(tmp_path: Path) -> None:
    inv = inventory.discover(nvml=SwitchedNvml(), sysfs_root=str(tmp_path))
    assert [gpu.nvlink_domain for gpu in inv.gpus] == [0, 0, 0, None]
    assert inv.gpus[0].nvlink_peers == (1, 2)
    assert inv.gpus[3].nvlink_peers == ()
