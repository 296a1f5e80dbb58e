"""Pure parts of GPU discovery: enum names, SM derivation, bus IDs, PCIe roots, NVLink domains.

Also drives `discover()` through a tiny in-memory NVML double to prove the error policy (a GPU
whose queries fail is skipped; NVML that cannot start raises InventoryError). The real NVML path
is covered against the simulated GPUs in tests/integration/dra_driver/test_inventory.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver import inventory, nvml
from dra_driver.inventory import InventoryError
from dra_driver.nvml import (
    DeviceHandle,
    EventSet,
    MemoryRepair,
    Nvml,
    NvmlError,
    NvmlNotSupported,
    NvmlUnavailable,
    ProcessMemory,
    ProcessUtilization,
    XidEvent,
)


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


def _not_supported(call: str) -> NvmlNotSupported:
    return NvmlNotSupported(call, nvml.NOT_SUPPORTED, "Not Supported")


class TinyNvml:
    """Just enough of the `Nvml` protocol for two PCIe GPUs; `broken` GPUs fail their UUID query.

    Unused protocol calls are absent: mypy checks the double against `Nvml` where it is passed,
    so a call discovery starts to make shows up here first.
    """

    def __init__(self, *, broken: frozenset[int] = frozenset(), init_fails: bool = False) -> None:
        self.broken = broken
        self.init_fails = init_fails
        self.shutdown_calls = 0

    def init(self) -> None:
        if self.init_fails:
            raise NvmlUnavailable("nvmlInit", 12, "Library Not Found")

    def shutdown(self) -> None:
        self.shutdown_calls += 1

    def driver_version(self) -> str:
        return "580.95.05"

    def cuda_driver_version(self) -> int:
        return 13000

    def device_count(self) -> int:
        return 2

    def device_by_index(self, index: int) -> DeviceHandle:
        return DeviceHandle(index)

    def device_by_uuid(self, uuid: str) -> DeviceHandle:
        raise AssertionError("discovery enumerates by index")

    def pci_bus_id(self, device: DeviceHandle) -> str:
        return f"00000000:{0x18 + device.address:02X}:00.0"

    def cuda_compute_capability(self, device: DeviceHandle) -> tuple[int, int]:
        return (8, 6)

    def uuid(self, device: DeviceHandle) -> str:
        if device.address in self.broken:
            raise NvmlError("nvmlDeviceGetUUID", nvml.GPU_IS_LOST, "GPU is lost")
        return f"GPU-0000000{device.address}-0000-0000-0000-000000000000"

    def name(self, device: DeviceHandle) -> str:
        return "NVIDIA A10"

    def brand(self, device: DeviceHandle) -> int:
        return 14

    def architecture(self, device: DeviceHandle) -> int:
        return 7

    def memory_total(self, device: DeviceHandle) -> int:
        return 24 << 30

    def multiprocessor_count(self, device: DeviceHandle) -> int:
        raise _not_supported("nvmlDeviceGetAttributes_v2")  # full GPUs, older drivers

    def cuda_cores(self, device: DeviceHandle) -> int:
        return 9216

    def numa_node(self, device: DeviceHandle) -> int:
        return device.address

    def minor_number(self, device: DeviceHandle) -> int:
        return device.address

    def mig_mode(self, device: DeviceHandle) -> tuple[int, int]:
        raise _not_supported("nvmlDeviceGetMigMode")

    def nvlink_active(self, device: DeviceHandle, link: int) -> bool:
        raise _not_supported("nvmlDeviceGetNvLinkState")

    def nvlink_remote_type(self, device: DeviceHandle, link: int) -> int:
        raise AssertionError("no NVLink")

    def nvlink_remote_bus_id(self, device: DeviceHandle, link: int) -> str:
        raise AssertionError("no NVLink")

    def p2p_status(self, first: DeviceHandle, second: DeviceHandle, caps_index: int) -> int:
        raise AssertionError("no NVLink")

    def common_ancestor(self, first: DeviceHandle, second: DeviceHandle) -> int:
        return 50  # SYSTEM: different root complexes

    def gpu_utilization(self, device: DeviceHandle) -> int:
        raise AssertionError("not a discovery call")

    def process_utilization(self, device: DeviceHandle, since_us: int) -> list[ProcessUtilization]:
        raise AssertionError("not a discovery call")

    def running_processes(self, device: DeviceHandle) -> list[ProcessMemory]:
        raise AssertionError("not a discovery call")

    def memory_repair(self, device: DeviceHandle) -> MemoryRepair:
        raise AssertionError("not a discovery call")

    def create_event_set(self) -> EventSet:
        raise AssertionError("not a discovery call")

    def register_xid_events(self, device: DeviceHandle, events: EventSet) -> None:
        raise AssertionError("not a discovery call")

    def wait_xid(self, events: EventSet, timeout_ms: int) -> XidEvent | None:
        raise AssertionError("not a discovery call")

    def free_event_set(self, events: EventSet) -> None:
        raise AssertionError("not a discovery call")


def test_discover_reads_every_field_through_nvml(tmp_path: Path) -> None:
    double = TinyNvml()
    checked: Nvml = double  # the double implements the whole protocol
    inv = inventory.discover(nvml=checked, sysfs_root=str(tmp_path))
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
    assert double.shutdown_calls == 1


def test_a_gpu_that_errors_is_skipped_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inv = inventory.discover(nvml=TinyNvml(broken=frozenset({0})), sysfs_root=str(tmp_path))
    assert [gpu.index for gpu in inv.gpus] == [1]
    assert "GPU 0 left out" in caplog.text


def test_nvml_that_cannot_start_raises_an_actionable_error() -> None:
    # The loader-path hint itself comes from PyNvml.init
    # (tests/integration/dra_driver/test_inventory.py).
    with pytest.raises(InventoryError, match=r"cannot initialise NVML .*Library Not Found"):
        inventory.discover(nvml=TinyNvml(init_fails=True))


class SwitchedNvml(TinyNvml):
    """Four GPUs whose NVLinks all end at NVSwitches; GPUs 0-2 are P2P-reachable over NVLink,
    GPU 3's links are up but lead nowhere it can reach (e.g. another fabric partition)."""

    def device_count(self) -> int:
        return 4

    def nvlink_active(self, device: DeviceHandle, link: int) -> bool:
        if link >= 4:
            raise NvmlError("nvmlDeviceGetNvLinkState", 2, "Invalid Argument")  # past the last
        return True

    def nvlink_remote_type(self, device: DeviceHandle, link: int) -> int:
        return 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH

    def p2p_status(self, first: DeviceHandle, second: DeviceHandle, caps_index: int) -> int:
        assert caps_index == 3  # NVML_P2P_CAPS_INDEX_NVLINK
        return 0 if first.address < 3 and second.address < 3 else 4  # OK / NOT_SUPPORTED


def test_gpus_behind_nvswitches_are_peers_when_p2p_over_nvlink_works(tmp_path: Path) -> None:
    inv = inventory.discover(nvml=SwitchedNvml(), sysfs_root=str(tmp_path))
    assert [gpu.nvlink_domain for gpu in inv.gpus] == [0, 0, 0, None]
    assert inv.gpus[0].nvlink_peers == (1, 2)
    assert inv.gpus[3].nvlink_peers == ()
