"""GPU discovery: ask NVML what GPUs this node has and describe them as a `NodeInventory`.

Called once at start-up (and on every resync) by the kubelet plugin (`kubelet_plugin.main`), whose
slice publisher turns the inventory into ResourceSlices and whose prepare path uses UUIDs, minor
numbers and capacities from it. NVML is reached through the project's one NVML seam
(`dra_driver.nvml`), whose pynvml implementation loads `libnvidia-ml.so.1` through the normal
loader search, so the simulated GPUs of the test bed are picked up with `LD_LIBRARY_PATH` exactly
as a real driver would be.

The module is split in two: pure helpers (enum names, SM count from CUDA cores, bus-ID
normalisation, PCIe root from a sysfs path, NVLink graph -> domains) that are unit-tested without
NVML, and `discover()`, which asks an `Nvml` (any implementation of the protocol) and sysfs.

Choices worth knowing (see docs/resource-slices.md):
- SM count: `nvmlDeviceGetAttributes_v2().multiprocessorCount` when the driver answers it (older
  drivers only answer for MIG handles). Otherwise `nvmlDeviceGetNumGpuCores()` (CUDA cores, not
  SMs) divided by the CUDA cores per SM of the GPU's compute capability (a fixed table from the
  CUDA programming guide). If neither works the GPU reports 0 SMs rather than a guess.
- PCIe root: the `pciDDDD:BB` component of the resolved `/sys/bus/pci/devices/<busID>` symlink when
  sysfs has the device (as Kubernetes' own pcieRoot helper does). Without sysfs (containers without
  /sys, the simulator) GPUs that NVML's topology puts under one host bridge share a root, named
  after the lowest bus of the group (`pci<domain>:<bus>`): synthetic, but equal exactly where the
  hardware shares a root complex, which is what `matchAttribute` needs.
- NVLink peers: each active link's remote PCI bus ID mapped back to a GPU index. A link that ends
  at something that is not one of our GPUs (an NVSwitch) makes us ask NVML's P2P status (NVLink
  capability) against every other GPU instead, since behind a switch every GPU can be a peer.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import names
from dra_driver.gpu import GpuInfo, NodeInventory
from dra_driver.mig import MigLayout
from dra_driver.mig_nvml import MigNvml, PyMigNvml, read_layout
from dra_driver.nvml import (
    DeviceHandle,
    Nvml,
    NvmlError,
    NvmlNotSupported,
    NvmlUnavailable,
    session,
)

log = logging.getLogger(__name__)

# NVML enum values (nvml.h): nvmlBrandType_t.
BRAND_NAMES: Mapping[int, str] = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "GRID",
    5: "GeForce",
    6: "Titan",
    7: "NVIDIA Virtual Applications",
    8: "NVIDIA Virtual PC",
    9: "NVIDIA Virtual Compute Server",
    10: "NVIDIA RTX Virtual Workstation",
    11: "NVIDIA Cloud Gaming",
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "Titan RTX",
    17: "NVIDIA DLA",
    18: "NVIDIA RTX Virtual Game Dev",
    19: "NVIDIA NPU",
}

# nvmlDeviceArchitecture_t.
ARCHITECTURE_NAMES: Mapping[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

# CUDA cores per SM by compute capability (CUDA C programming guide, "arithmetic instructions"
# throughput table: FP32 lanes per SM). A major version alone covers the minors not listed.
_CORES_PER_SM_EXACT: Mapping[tuple[int, int], int] = {
    (6, 0): 64,  # GP100
    (8, 0): 64,  # GA100
}
_CORES_PER_SM_BY_MAJOR: Mapping[int, int] = {
    3: 192,
    5: 128,
    6: 128,
    7: 64,
    8: 128,
    9: 128,
    10: 128,
    11: 128,
    12: 128,
}

# NVML topology level at or below which two GPUs sit under one PCIe host bridge (root complex):
# NVML_TOPOLOGY_INTERNAL=0, SINGLE=10, MULTIPLE=20, HOSTBRIDGE=30, NODE=40, SYSTEM=50.
TOPOLOGY_HOSTBRIDGE = 30

# nvmlNvLinkDeviceType_t NVML_NVLINK_DEVICE_TYPE_SWITCH, nvmlGpuP2PCapsIndex_t NVLINK, status OK.
_NVLINK_REMOTE_SWITCH = 2
_P2P_CAPS_INDEX_NVLINK = 3
_P2P_STATUS_OK = 0
_NVLINK_MAX_LINKS = 18

_BUS_ID = re.compile(r"^([0-9a-fA-F]+):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_SYSFS_ROOT_COMPONENT = re.compile(r"^pci([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2})$")


class InventoryError(Exception):
    """NVML is missing or failed as a whole; the message says what to check."""


# ---------------------------------------------------------------- pure helpers


def brand_name(code: int) -> str:
    """Readable name of an NVML brand code; unknown future codes stay recognisable."""
    return BRAND_NAMES.get(code, f"Unknown({code})")


def architecture_name(code: int) -> str:
    """Readable name of an NVML architecture code, e.g. 9 -> "Hopper"."""
    return ARCHITECTURE_NAMES.get(code, f"Unknown({code})")


def cores_per_sm(cc_major: int, cc_minor: int) -> int | None:
    """CUDA cores per SM for a compute capability, or None when we do not know it."""
    exact = _CORES_PER_SM_EXACT.get((cc_major, cc_minor))
    return exact if exact is not None else _CORES_PER_SM_BY_MAJOR.get(cc_major)


def sm_count_from_cores(cuda_cores: int, cc_major: int, cc_minor: int) -> int | None:
    """SMs from NVML's CUDA-core count; None for an unknown architecture or an uneven count."""
    per_sm = cores_per_sm(cc_major, cc_minor)
    if per_sm is None or cuda_cores <= 0 or cuda_cores % per_sm:
        return None
    return cuda_cores // per_sm


def normalize_bus_id(raw: str) -> str:
    """NVML's "00000000:18:00.0" -> sysfs/Kubernetes form "0000:18:00.0" (lower case).

    The domain keeps at least four hex digits (more only when the value needs them, as on VMD
    domains), bus and device two, function one.
    """
    match = _BUS_ID.match(raw.strip())
    if match is None:
        raise ValueError(f"PCI bus ID {raw!r} is not of the form domain:bus:device.function")
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def pcie_root_from_sysfs_path(resolved: str) -> str | None:
    """The root-complex component (`pci0000:17`) of a resolved sysfs PCI device path."""
    for component in Path(resolved).parts:
        match = _SYSFS_ROOT_COMPONENT.match(component)
        if match:
            return f"pci{int(match.group(1), 16):04x}:{match.group(2).lower()}"
    return None


def pcie_roots_from_groups(
    bus_ids: Mapping[int, str], same_root: set[frozenset[int]]
) -> dict[int, str]:
    """Synthetic roots when sysfs is absent: GPUs connected by `same_root` pairs share one root,
    named after the lowest bus ID of the group (`pci<domain>:<bus>`)."""
    edges: dict[int, set[int]] = {index: set() for index in bus_ids}
    for pair in same_root:
        first, second = tuple(pair)
        if first in edges and second in edges:
            edges[first].add(second)
            edges[second].add(first)
    roots: dict[int, str] = {}
    for group in _components(edges):
        lowest = min(bus_ids[index] for index in group)
        domain, bus = lowest.split(":")[:2]
        for index in group:
            roots[index] = f"pci{domain}:{bus}"
    return roots


def nvlink_domains(peers: Mapping[int, Iterable[int]]) -> dict[int, int | None]:
    """Connected components of the NVLink graph -> domain number per GPU index.

    Links are treated as undirected (one side reporting a link is enough). Domains are numbered
    0, 1, ... in the order of their lowest GPU index, so the numbering is stable across restarts.
    A GPU with no NVLink at all has no domain (None).
    """
    edges: dict[int, set[int]] = {index: set() for index in peers}
    for index, targets in peers.items():
        for peer in targets:
            if peer == index or peer not in edges:
                continue
            edges[index].add(peer)
            edges[peer].add(index)
    domains: dict[int, int | None] = {}
    next_domain = 0
    for group in _components(edges):
        if len(group) == 1:
            domains[group[0]] = None
            continue
        for index in group:
            domains[index] = next_domain
        next_domain += 1
    return domains


def _components(edges: Mapping[int, set[int]]) -> list[list[int]]:
    """Connected components, each sorted, ordered by their lowest member."""
    seen: set[int] = set()
    groups: list[list[int]] = []
    for start in sorted(edges):
        if start in seen:
            continue
        stack, group = [start], []
        seen.add(start)
        while stack:
            node = stack.pop()
            group.append(node)
            for peer in edges[node]:
                if peer not in seen:
                    seen.add(peer)
                    stack.append(peer)
        groups.append(sorted(group))
    return groups


def assign_names(
    inventory: NodeInventory, known: Mapping[str, str]
) -> tuple[NodeInventory, dict[str, str]]:
    """Give every GPU a device name that never changes: (named inventory, uuid -> name map).

    NVML indices shift when a GPU is hot-removed (the GPUs after it move up), so a name derived
    from the index would rename devices that stayed and break claims prepared on them. A GPU keeps
    the name it got when this node first saw it (`known`, persisted by the kubelet plugin); a new
    GPU gets `gpu-<index>` when no GPU ever had that name, else the lowest free `gpu-<n>`. Names
    are never reused, so a claim naming a removed GPU can never land on another one.
    """
    assigned = dict(known)
    taken = set(assigned.values())
    gpus = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        name = assigned.get(gpu.uuid)
        if name is None:
            name = names.device_name(gpu.index)
            number = 0
            while name in taken:
                name = names.device_name(number)
                number += 1
            assigned[gpu.uuid] = name
            taken.add(name)
        gpus.append(gpu.model_copy(update={"name": name}))
    return inventory.model_copy(update={"gpus": tuple(gpus)}), assigned


def cuda_version_string(encoded: int) -> str:
    """NVML's CUDA driver version integer (13000) -> "13.0"."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


# ---------------------------------------------------------------- NVML queries


@dataclass(frozen=True, slots=True)
class _RawGpu:
    """What one GPU told us before the node-wide passes (NVLink, PCIe roots)."""

    info: dict[str, Any]
    handle: DeviceHandle
    link_bus_ids: tuple[str, ...]
    links_to_switch: bool


def discover(*, nvml: Nvml | None = None, sysfs_root: str = "/sys") -> NodeInventory:
    """Enumerate the node's GPUs through NVML.

    Raises InventoryError when NVML cannot be loaded or initialised or node-wide queries fail.
    A GPU whose own queries fail is left out with a warning (one sick GPU must not hide the rest).
    `nvml` defaults to the pynvml-backed `dra_driver.mig_nvml.PyMigNvml` (MIG-capable GPUs also
    get their `MigLayout`); `sysfs_root` exists for tests.
    """
    try:
        with session(nvml or PyMigNvml()) as opened:
            return _discover_initialised(opened, sysfs_root)
    except NvmlUnavailable as exc:
        raise InventoryError(f"cannot initialise NVML ({exc})") from exc


def _discover_initialised(nvml: Nvml, sysfs_root: str) -> NodeInventory:
    try:
        driver_version = nvml.driver_version()
        cuda_version = cuda_version_string(nvml.cuda_driver_version())
        count = nvml.device_count()
    except NvmlError as exc:
        raise InventoryError(f"NVML node queries failed: {exc}") from exc

    raws: list[_RawGpu] = []
    for index in range(count):
        try:
            raws.append(_query_gpu(nvml, index, sysfs_root))
        except Exception as exc:  # one sick GPU (or odd data) must not hide the rest
            log.warning("GPU %d left out of the inventory: NVML query failed: %s", index, exc)

    index_by_bus = {raw.info["pci_bus_id"]: raw.info["index"] for raw in raws}
    peers = {raw.info["index"]: _nvlink_peers(nvml, raw, raws, index_by_bus) for raw in raws}
    domains = nvlink_domains(peers)
    roots = _pcie_roots(nvml, raws)

    gpus: list[GpuInfo] = []
    for raw in raws:
        index = raw.info["index"]
        fields = dict(raw.info)
        fields["nvlink_peers"] = tuple(sorted(peers[index]))
        fields["nvlink_domain"] = domains.get(index)
        fields["pcie_root"] = fields.get("pcie_root") or roots.get(index)
        try:
            gpus.append(GpuInfo(**fields))
        except ValueError as exc:
            log.warning("GPU %d left out of the inventory: invalid NVML data: %s", index, exc)
    return NodeInventory(
        driver_version=driver_version,
        cuda_driver_version=cuda_version,
        gpus=tuple(gpus),
        unreadable_gpus=max(0, count - len(gpus)),
    )


def _query_gpu(nvml: Nvml, index: int, sysfs_root: str) -> _RawGpu:
    handle = nvml.device_by_index(index)
    bus_id = normalize_bus_id(nvml.pci_bus_id(handle))
    cc_major, cc_minor = nvml.cuda_compute_capability(handle)
    info: dict[str, Any] = {
        "index": index,
        "uuid": nvml.uuid(handle),
        "product_name": nvml.name(handle),
        "brand": brand_name(nvml.brand(handle)),
        "architecture": _architecture(nvml, handle),
        "cuda_compute_capability": f"{cc_major}.{cc_minor}",
        "memory_bytes": nvml.memory_total(handle),
        "sm_count": _sm_count(nvml, handle, cc_major, cc_minor),
        "numa_node": _numa_node(nvml, handle, bus_id, sysfs_root),
        "pci_bus_id": bus_id,
        "pcie_root": _sysfs_pcie_root(bus_id, sysfs_root),
        "minor_number": nvml.minor_number(handle),
        "mig_capable": _mig_capable(nvml, handle),
    }
    if info["mig_capable"]:
        info["mig"] = _mig_layout(nvml, handle, index)
    link_bus_ids, to_switch = _active_links(nvml, handle)
    return _RawGpu(info=info, handle=handle, link_bus_ids=link_bus_ids, links_to_switch=to_switch)


def _architecture(nvml: Nvml, handle: DeviceHandle) -> str:
    try:
        return architecture_name(nvml.architecture(handle))
    except NvmlNotSupported:
        return "Unknown"


def _sm_count(nvml: Nvml, handle: DeviceHandle, cc_major: int, cc_minor: int) -> int:
    try:
        count = nvml.multiprocessor_count(handle)
        if count > 0:
            return count
    except NvmlNotSupported:
        pass
    try:
        cores = nvml.cuda_cores(handle)
    except NvmlNotSupported:
        return 0
    sms = sm_count_from_cores(cores, cc_major, cc_minor)
    if sms is None:
        log.warning(
            "cannot derive SMs from %d CUDA cores at compute capability %d.%d; reporting 0",
            cores,
            cc_major,
            cc_minor,
        )
        return 0
    return sms


def _numa_node(nvml: Nvml, handle: DeviceHandle, bus_id: str, sysfs_root: str) -> int | None:
    try:
        node = nvml.numa_node(handle)
        return node if node >= 0 else None
    except NvmlNotSupported:
        pass
    try:
        text = Path(sysfs_root, "bus/pci/devices", bus_id, "numa_node").read_text().strip()
    except OSError:
        return None
    node = int(text)
    return node if node >= 0 else None


def _sysfs_pcie_root(bus_id: str, sysfs_root: str) -> str | None:
    link = os.path.join(sysfs_root, "bus/pci/devices", bus_id)
    if not os.path.lexists(link):
        return None
    return pcie_root_from_sysfs_path(os.path.realpath(link))


def _mig_capable(nvml: Nvml, handle: DeviceHandle) -> bool:
    try:
        nvml.mig_mode(handle)
    except NvmlNotSupported:
        return False
    return True


def _mig_layout(nvml: Nvml, handle: DeviceHandle, index: int) -> MigLayout | None:
    """MIG mode, profiles and instances (only through an NVML with the MIG calls); a failure
    leaves the GPU without MIG data (published as a plain GPU), never out of the inventory."""
    if not isinstance(nvml, MigNvml):
        return None
    try:
        return read_layout(nvml, handle)
    except NvmlError as exc:
        log.warning("GPU %d: MIG state unreadable, published without MIG: %s", index, exc)
        return None


def _active_links(nvml: Nvml, handle: DeviceHandle) -> tuple[tuple[str, ...], bool]:
    """Remote bus IDs of the GPU's active NVLinks, and whether any link ends at an NVSwitch."""
    remotes: list[str] = []
    to_switch = False
    for link in range(_NVLINK_MAX_LINKS):
        try:
            if not nvml.nvlink_active(handle, link):
                continue
        except NvmlError:
            # NOT_SUPPORTED: no NVLink on this GPU; INVALID_ARGUMENT: past its last link.
            break
        try:
            if nvml.nvlink_remote_type(handle, link) == _NVLINK_REMOTE_SWITCH:
                to_switch = True
                continue
        except NvmlError:  # older drivers: no device type; the remote bus ID decides
            pass
        try:
            remotes.append(normalize_bus_id(nvml.nvlink_remote_bus_id(handle, link)))
        except ValueError:
            to_switch = True
    return tuple(remotes), to_switch


def _nvlink_peers(
    nvml: Nvml, raw: _RawGpu, raws: list[_RawGpu], index_by_bus: Mapping[str, int]
) -> set[int]:
    index = raw.info["index"]
    peers = {index_by_bus[bus] for bus in raw.link_bus_ids if bus in index_by_bus} - {index}
    unknown_remote = any(bus not in index_by_bus for bus in raw.link_bus_ids)
    if raw.links_to_switch or unknown_remote:
        for other in raws:
            if other is raw:
                continue
            try:
                status = nvml.p2p_status(raw.handle, other.handle, _P2P_CAPS_INDEX_NVLINK)
            except NvmlError as exc:
                log.debug("P2P status %d->%d unavailable: %s", index, other.info["index"], exc)
                continue
            if status == _P2P_STATUS_OK:
                peers.add(other.info["index"])
    return peers


def _pcie_roots(nvml: Nvml, raws: list[_RawGpu]) -> dict[int, str]:
    """Synthetic roots for GPUs sysfs did not resolve, from NVML's topology (see module doc)."""
    missing = [raw for raw in raws if not raw.info.get("pcie_root")]
    if not missing:
        return {}
    same_root: set[frozenset[int]] = set()
    for position, first in enumerate(missing):
        for second in missing[position + 1 :]:
            try:
                level = nvml.common_ancestor(first.handle, second.handle)
            except NvmlError as exc:
                log.debug("topology query failed: %s", exc)
                continue
            if level <= TOPOLOGY_HOSTBRIDGE:
                same_root.add(frozenset((first.info["index"], second.info["index"])))
    return pcie_roots_from_groups(
        {raw.info["index"]: raw.info["pci_bus_id"] for raw in missing}, same_root
    )


def main() -> int:
    """`python -m dra_driver.inventory`: print this node's inventory as JSON (exit 1 on error).

    The kubelet plugin re-discovers GPUs through this in a child process: NVML enumerates GPUs
    when it is first initialised, and the plugin's own threads keep NVML initialised, so only a
    fresh process sees GPUs added since (`kubelet_plugin.rediscover`).
    """
    import sys

    try:
        found = discover()
    except InventoryError as exc:
        print(f"GPU discovery failed: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(found.model_dump_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
