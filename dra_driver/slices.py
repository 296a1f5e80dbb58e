"""What this node should publish: `NodeInventory` -> desired `resource.k8s.io/v1` ResourceSlices.

Pure functions over typed data, called by the slice publisher (`kubelet_plugin.slice_publisher`) on
every sync and unit-tested without a server. The publisher owns the pool generation (it depends on
what the API already holds), so the builder returns slices with generation 0 and the publisher
stamps the real value; `comparable_spec()` is how the publisher decides whether anything really
changed, ignoring fields the API server defaults or re-formats.

Shape (docs/resource-slices.md has the full reference):
- one pool per node, named after the node, split into slices of <= 128 devices;
- device `gpu-<n>` (stable per GPU: `dra_driver.inventory.assign_names`), with the taints the health
  monitor decided (`kubelet_plugin.taints`; at most 64 devices per slice when any has taints);
- consumable capacity `memory` (bytes x oversubscription ratio, rounded down to whole MiB so it is
  a valid multiple of the 1Mi step; a request naming no memory gets all of it) and `cores`
  (percent of SMs, 0-100, default 0 = no reservation);
- typed attributes in the driver's domain plus the standard `resource.kubernetes.io/pciBusID` and
  `resource.kubernetes.io/pcieRoot`;
- an owner reference to the Node, so slices vanish with their node.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver import capacity, mig_slices, names
from dra_driver.allocator import parse_quantity
from dra_driver.gpu import GpuInfo, NodeInventory
from dra_driver.kube import RESOURCE_API

log = logging.getLogger(__name__)

JSON = dict[str, Any]

# API limits (resource.k8s.io/v1 validation).
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64  # when any device of the slice has taints
# ... or consumes counters (MIG: dra_driver.mig_slices); counter sets go in slices of their own.
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_TAINTS_PER_DEVICE = 16
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING_ATTRIBUTE = 64
MAX_OBJECT_NAME = 253
MAX_LABEL_VALUE = 63

MIB = capacity.MIB
CORES_TOTAL = capacity.CORES_TOTAL

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "vgpu-dra"

_SEMVER_CORE = re.compile(r"^\d+$")
_BUILD_IDENT = re.compile(r"^[0-9A-Za-z-]+$")


class SliceError(ValueError):
    """The inventory or the parameters cannot be published; the message names the value."""


def node_label(driver: str) -> str:
    """Label key carrying the node name on our slices (e.g. `vgpu.dra.dev/node`)."""
    return f"{driver}/node"


def to_semver(version: str) -> str | None:
    """A dotted numeric version -> semver 2.0 as the DRA `version` attribute requires.

    Leading zeros are dropped (semver forbids them): "580.95.05" -> "580.95.5"; missing parts are
    zero: "9.0" -> "9.0.0", "13" -> "13.0.0"; parts after the third become build metadata:
    "1.2.3.4" -> "1.2.3+4". Anything else (letters in the first three parts) -> None, and the
    attribute is left out rather than published wrong.
    """
    parts = version.strip().split(".")
    if not parts or len(parts[0]) == 0:
        return None
    core = parts[:3]
    if not all(_SEMVER_CORE.match(part) for part in core):
        return None
    numbers = [str(int(part)) for part in core] + ["0"] * (3 - len(core))
    text = ".".join(numbers)
    extra = parts[3:]
    if extra:
        if not all(_BUILD_IDENT.match(part) for part in extra):
            return None
        text += "+" + ".".join(extra)
    return text


def scaled_memory(memory_bytes: int, ratio: float) -> int:
    """Memory capacity to publish (`dra_driver.capacity`); a bad ratio is a SliceError here."""
    try:
        return capacity.scaled_memory(memory_bytes, ratio)
    except capacity.CapacityError as exc:
        raise SliceError(str(exc)) from None


def device_attributes(gpu: GpuInfo, inventory: NodeInventory) -> JSON:
    """Typed DRA attributes of one GPU (unknown values are omitted, never published as junk)."""
    attrs: JSON = {
        "index": {"int": gpu.index},
        "uuid": {"string": gpu.uuid},
        "productName": {"string": gpu.product_name},
        "brand": {"string": gpu.brand},
        "architecture": {"string": gpu.architecture},
        "memoryBytes": {"int": gpu.memory_bytes},
        "smCount": {"int": gpu.sm_count},
        "migCapable": {"bool": gpu.mig_capable},
        names.ATTR_PCI_BUS_ID: {"string": gpu.pci_bus_id},
    }
    versions = {
        "cudaComputeCapability": gpu.cuda_compute_capability,
        "driverVersion": inventory.driver_version,
        "cudaDriverVersion": inventory.cuda_driver_version,
    }
    for name, raw in versions.items():
        semver = to_semver(raw)
        if semver is None:
            log.warning("%s: %s %r is not a dotted version; left out", gpu.device_name, name, raw)
        else:
            attrs[name] = {"version": semver}
    if gpu.numa_node is not None:
        attrs["numaNode"] = {"int": gpu.numa_node}
    if gpu.nvlink_domain is not None:
        attrs["nvlinkDomain"] = {"int": gpu.nvlink_domain}
    if gpu.pcie_root:
        attrs[names.ATTR_PCIE_ROOT] = {"string": gpu.pcie_root}
    for name, value in attrs.items():
        text = value.get("string")
        if isinstance(text, str) and len(text) > MAX_STRING_ATTRIBUTE:
            log.warning("%s: attribute %s truncated to 64 characters", gpu.device_name, name)
            value["string"] = text[:MAX_STRING_ATTRIBUTE]
    return attrs


def device_capacity(gpu: GpuInfo, ratio: float) -> JSON:
    """Consumable capacities `memory` and `cores` with their request policies."""
    scaled_memory(gpu.memory_bytes, ratio)  # validates the ratio as a SliceError
    return capacity.device_capacity(gpu.memory_bytes, ratio)


# Binding conditions (Kubernetes DRADeviceBindingConditions, beta and on by default since 1.36):
# kube-scheduler copies them into each allocation of the device and binds the pod only once the
# allocation controller set CONFIRMED True in the claim's status.devices (no other claim
# overbooks the device); OVERBOOKED True makes it deallocate and try again. Published only when
# the controller runs (a pod would otherwise wait out the scheduler's 10-minute binding timeout).
CONDITION_CONFIRMED = "vgpu.dra.dev/CapacityConfirmed"
CONDITION_OVERBOOKED = "vgpu.dra.dev/Overbooked"


def build_device(
    gpu: GpuInfo,
    inventory: NodeInventory,
    ratio: float,
    taints: Sequence[JSON] = (),
    *,
    binding_conditions: bool = False,
) -> JSON:
    attributes = device_attributes(gpu, inventory)
    capacity = device_capacity(gpu, ratio)
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise SliceError(f"{gpu.device_name}: more than 32 attributes and capacities")
    if len(taints) > MAX_TAINTS_PER_DEVICE:
        raise SliceError(f"{gpu.device_name}: {len(taints)} taints, at most 16 are allowed")
    device: JSON = {
        "name": gpu.device_name,
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": capacity,
    }
    if taints:
        device["taints"] = [dict(taint) for taint in taints]
    if binding_conditions:
        device["bindingConditions"] = [CONDITION_CONFIRMED]
        device["bindingFailureConditions"] = [CONDITION_OVERBOOKED]
    return device


def slice_name(node_name: str, driver: str, part: int) -> str:
    """Deterministic slice name, so a restarted publisher finds its own slices by name."""
    name = f"{node_name}-{driver.replace('.', '-')}-{part}"
    if len(name) <= MAX_OBJECT_NAME:
        return name
    digest = hashlib.sha256(f"{node_name}/{driver}".encode()).hexdigest()[:16]
    return f"{node_name[: MAX_OBJECT_NAME - 40]}-{digest}-{part}"


def build_slices(
    inventory: NodeInventory,
    *,
    driver: str,
    node_name: str,
    node_uid: str,
    oversubscription_ratio: float = 1.0,
    max_devices_per_slice: int = MAX_DEVICES_PER_SLICE,
    taints: Mapping[str, Sequence[JSON]] | None = None,
    binding_conditions: bool = False,
) -> list[JSON]:
    """The slices this node should have, with `pool.generation` 0 (the publisher sets it).

    `binding_conditions`: devices carry CONDITION_CONFIRMED / CONDITION_OVERBOOKED (see there).

    `taints` maps device names to their DRA device taints (`kubelet_plugin.taints`). When any
    device carries taints, slices hold at most 64 devices (the API's limit for such slices).
    A node without GPUs publishes one empty slice, so the scheduler sees the pool (and the node's
    plugin is visibly alive) rather than nothing.
    """
    if not 1 <= max_devices_per_slice <= MAX_DEVICES_PER_SLICE:
        raise SliceError(f"max_devices_per_slice must be 1..128, got {max_devices_per_slice}")
    if not node_uid:
        raise SliceError(f"node {node_name!r} has no uid; the owner reference needs it")
    taints = taints or {}
    devices: list[JSON] = []
    counter_sets: list[JSON] = []
    for gpu in inventory.gpus:
        gpu_taints = taints.get(gpu.device_name, ())
        if not mig_slices.mig_active(gpu):
            devices.append(
                build_device(
                    gpu,
                    inventory,
                    oversubscription_ratio,
                    gpu_taints,
                    binding_conditions=binding_conditions,
                )
            )
            continue
        # A GPU in MIG mode: its counter set, the whole GPU (dynamic only) and its MIG devices.
        attributes = device_attributes(gpu, inventory)
        counter_sets.append(mig_slices.counter_set(gpu))
        if gpu.mig_strategy == "dynamic":
            devices.append(mig_slices.whole_gpu_device(gpu, attributes, gpu_taints))
        devices.extend(mig_slices.mig_devices(gpu, attributes, gpu_taints))
    if any("taints" in device or "consumesCounters" in device for device in devices):
        max_devices_per_slice = min(max_devices_per_slice, MAX_DEVICES_PER_SLICE_WITH_TAINTS)
    chunks: list[tuple[str, list[JSON]]] = [
        ("devices", devices[start : start + max_devices_per_slice])
        for start in range(0, len(devices), max_devices_per_slice)
    ]
    if not chunks and not counter_sets:
        chunks = [("devices", [])]
    chunks += [
        ("sharedCounters", counter_sets[start : start + MAX_COUNTER_SETS_PER_SLICE])
        for start in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    labels = {LABEL_MANAGED_BY: MANAGED_BY_VALUE}
    if len(node_name) <= MAX_LABEL_VALUE:
        labels[node_label(driver)] = node_name
    owner = {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
    return [
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node_name, driver, part),
                "labels": dict(labels),
                "ownerReferences": [dict(owner)],
            },
            "spec": {
                "driver": driver,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": 0, "resourceSliceCount": len(chunks)},
                # A slice holds devices or counter sets, never both (API validation).
                field: chunk,
            },
        }
        for part, (field, chunk) in enumerate(chunks)
    ]


# ---------------------------------------------------------------- comparison


def _quantity(value: Any) -> int | str:
    """Quantities compare by value: the API server re-formats them ("1048576" may come back
    as "1Mi"). Values that do not parse compare as text (and so count as a change)."""
    if isinstance(value, int):
        return value
    try:
        return parse_quantity(str(value))
    except ValueError:
        return str(value)


def _comparable_capacity(capacity: Mapping[str, Any]) -> JSON:
    result: JSON = {}
    for name, entry in sorted(capacity.items()):
        policy = entry.get("requestPolicy") or {}
        valid_range = policy.get("validRange") or {}
        result[name] = {
            "value": _quantity(entry.get("value")),
            "default": _quantity(policy["default"]) if "default" in policy else None,
            "validValues": [_quantity(v) for v in policy.get("validValues") or []],
            "validRange": {k: _quantity(v) for k, v in sorted(valid_range.items())},
        }
    return result


def comparable_spec(spec: Mapping[str, Any]) -> JSON:
    """The parts of a slice spec we set, normalised; generation excluded (the publisher bumps
    it only when this projection differs)."""
    pool = spec.get("pool") or {}
    devices = []
    for device in sorted(spec.get("devices") or [], key=lambda d: str(d.get("name"))):
        devices.append(
            {
                "name": device.get("name"),
                "allowMultipleAllocations": bool(device.get("allowMultipleAllocations")),
                "attributes": dict(sorted((device.get("attributes") or {}).items())),
                "capacity": _comparable_capacity(device.get("capacity") or {}),
                "taints": sorted(
                    (str(t.get("key")), str(t.get("value") or ""), str(t.get("effect")))
                    for t in device.get("taints") or []
                ),
                "bindingConditions": list(device.get("bindingConditions") or []),
                "bindingFailureConditions": list(device.get("bindingFailureConditions") or []),
                "consumesCounters": _comparable_counters(
                    device.get("consumesCounters"), "counterSet"
                ),
            }
        )
    return {
        "driver": spec.get("driver"),
        "nodeName": spec.get("nodeName"),
        "pool": {"name": pool.get("name"), "resourceSliceCount": pool.get("resourceSliceCount")},
        "devices": devices,
        "sharedCounters": _comparable_counters(spec.get("sharedCounters"), "name"),
    }


def _comparable_counters(entries: Any, key: str) -> list[Any]:
    """Counter sets or counter consumptions, by name, values compared as quantities."""
    return sorted(
        (
            str(entry.get(key)),
            sorted(
                (str(name), _quantity((counter or {}).get("value")))
                for name, counter in (entry.get("counters") or {}).items()
            ),
        )
        for entry in entries or []
    )


def owner_uids(obj: Mapping[str, Any]) -> list[str]:
    return [str(ref.get("uid")) for ref in (obj.get("metadata") or {}).get("ownerReferences") or []]


def same_content(desired: Mapping[str, Any], existing: Mapping[str, Any]) -> bool:
    """True when `existing` already says what `desired` says (spec and owner), ignoring
    generation, resourceVersion and API defaults."""
    return comparable_spec(desired.get("spec") or {}) == comparable_spec(
        existing.get("spec") or {}
    ) and owner_uids(desired) == owner_uids(existing)


def names_of(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(s["metadata"]["name"]) for s in slices]
