"""The ResourceSlice builder: shape, typed attributes, capacities, API limits, comparison."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver import slices
from dra_driver.gpu import GpuInfo, NodeInventory
from dra_driver.slices import SliceError
from tests.fixtures.inventories import synthetic_inventory

GIB = 1 << 30


def gpu(index: int, **overrides: object) -> GpuInfo:
    fields: dict[str, object] = {
        "index": index,
        "uuid": f"GPU-{index:08x}-0000-4000-8000-000000000000",
        "product_name": "NVIDIA H100 80GB HBM3",
        "brand": "NVIDIA",
        "architecture": "Hopper",
        "cuda_compute_capability": "9.0",
        "memory_bytes": 80 * GIB,
        "sm_count": 132,
        "numa_node": index // 4,
        "pci_bus_id": f"0000:{0x18 + index:02x}:00.0",
        "pcie_root": f"pci0000:{0x17 + index:02x}",
        "minor_number": index,
        "mig_capable": True,
        "nvlink_peers": (),
        "nvlink_domain": 0,
    }
    fields.update(overrides)
    return GpuInfo.model_validate(fields)


def node(*gpus: GpuInfo, driver_version: str = "580.95.05") -> NodeInventory:
    return NodeInventory(driver_version=driver_version, cuda_driver_version="13.0", gpus=gpus)


def build(inventory: NodeInventory, **kwargs: object) -> list[dict[str, Any]]:
    params: dict[str, object] = {"driver": "vgpu.dra.dev", "node_name": "node-1", "node_uid": "u-1"}
    params.update(kwargs)
    return slices.build_slices(inventory, **params)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "semver"),
    [
        ("580.95.05", "580.95.5"),
        ("9.0", "9.0.0"),
        ("13", "13.0.0"),
        ("535.104.05", "535.104.5"),
        ("1.2.3.4", "1.2.3+4"),
        ("r580", None),
        ("", None),
        ("1..2", None),
    ],
)
def test_versions_map_to_semver(raw: str, semver: str | None) -> None:
    assert slices.to_semver(raw) == semver


def test_one_pool_per_node_with_typed_attributes() -> None:
    (obj,) = build(node(gpu(0), gpu(1, numa_node=None, nvlink_domain=None, pcie_root=None)))
    assert obj["apiVersion"] == "resource.k8s.io/v1"
    spec = obj["spec"]
    assert spec["driver"] == "vgpu.dra.dev"
    assert spec["nodeName"] == "node-1"
    assert spec["pool"] == {"name": "node-1", "generation": 0, "resourceSliceCount": 1}
    first, second = spec["devices"]
    assert first["name"] == "gpu-0" and first["allowMultipleAllocations"] is True
    attrs = first["attributes"]
    assert attrs["index"] == {"int": 0}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["architecture"] == {"string": "Hopper"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": "580.95.5"}
    assert attrs["cudaDriverVersion"] == {"version": "13.0.0"}
    assert attrs["memoryBytes"] == {"int": 80 * GIB}
    assert attrs["smCount"] == {"int": 132}
    assert attrs["numaNode"] == {"int": 0}
    assert attrs["nvlinkDomain"] == {"int": 0}
    assert attrs["migCapable"] == {"bool": True}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.0"}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:17"}
    # unknown topology is left out rather than published as a fake value
    for missing in ("numaNode", "nvlinkDomain", "resource.kubernetes.io/pcieRoot"):
        assert missing not in second["attributes"]


def test_capacities_memory_default_is_the_whole_gpu_and_cores_default_zero() -> None:
    (obj,) = build(node(gpu(0)))
    capacity = obj["spec"]["devices"][0]["capacity"]
    memory = str(80 * GIB)
    assert capacity["memory"] == {
        "value": memory,
        "requestPolicy": {
            "default": memory,
            "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"},
        },
    }
    assert capacity["cores"] == {
        "value": "100",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
    }


def test_oversubscription_scales_memory_to_whole_mib() -> None:
    (obj,) = build(node(gpu(0, memory_bytes=24 * GIB + 12345)), oversubscription_ratio=1.5)
    value = int(obj["spec"]["devices"][0]["capacity"]["memory"]["value"])
    assert value % (1 << 20) == 0
    assert 36 * GIB - (1 << 20) < value <= 36 * GIB + 18518
    with pytest.raises(SliceError, match=r"ratio must be >= 1\.0"):
        build(node(gpu(0)), oversubscription_ratio=0.5)
    with pytest.raises(SliceError, match="ratio"):
        build(node(gpu(0)), oversubscription_ratio=float("nan"))


def test_api_limits_devices_are_split_and_attributes_bounded() -> None:
    many = node(*(gpu(i) for i in range(5)))
    objs = build(many, max_devices_per_slice=2)
    assert [len(o["spec"]["devices"]) for o in objs] == [2, 2, 1]
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {3}
    assert len({o["metadata"]["name"] for o in objs}) == 3
    for device in objs[0]["spec"]["devices"]:
        assert len(device["attributes"]) + len(device["capacity"]) <= 32
    long_name = node(gpu(0, product_name="X" * 100))
    (obj,) = build(long_name)
    assert len(obj["spec"]["devices"][0]["attributes"]["productName"]["string"]) == 64
    with pytest.raises(SliceError, match=r"1\.\.128"):
        build(many, max_devices_per_slice=129)


def test_owner_reference_and_labels() -> None:
    (obj,) = build(node(gpu(0)), node_uid="abc-123")
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "abc-123"}
    ]
    assert obj["metadata"]["labels"]["vgpu.dra.dev/node"] == "node-1"
    with pytest.raises(SliceError, match="no uid"):
        build(node(gpu(0)), node_uid="")


def test_a_node_without_gpus_publishes_one_empty_slice() -> None:
    (obj,) = build(node())
    assert obj["spec"]["devices"] == []
    assert obj["spec"]["pool"]["resourceSliceCount"] == 1


def test_slice_names_are_deterministic_and_bounded() -> None:
    assert slices.slice_name("node-1", "vgpu.dra.dev", 0) == "node-1-vgpu-dra-dev-0"
    long = slices.slice_name("n" * 250, "vgpu.dra.dev", 3)
    assert len(long) <= 253 and long.endswith("-3")
    assert long == slices.slice_name("n" * 250, "vgpu.dra.dev", 3)


def test_comparison_ignores_generation_and_quantity_formatting() -> None:
    (desired,) = build(node(gpu(0)))
    served = copy.deepcopy(desired)
    served["spec"]["pool"]["generation"] = 7
    served["metadata"]["resourceVersion"] = "42"
    capacity = served["spec"]["devices"][0]["capacity"]
    capacity["memory"]["value"] = "80Gi"
    capacity["memory"]["requestPolicy"]["validRange"]["min"] = "1048576"
    assert slices.same_content(desired, served)


def test_comparison_sees_real_changes() -> None:
    (desired,) = build(node(gpu(0)))
    changed_memory = copy.deepcopy(desired)
    changed_memory["spec"]["devices"][0]["capacity"]["memory"]["value"] = "40Gi"
    assert not slices.same_content(desired, changed_memory)
    changed_attr = copy.deepcopy(desired)
    changed_attr["spec"]["devices"][0]["attributes"]["numaNode"] = {"int": 1}
    assert not slices.same_content(desired, changed_attr)
    other_owner = copy.deepcopy(desired)
    other_owner["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    assert not slices.same_content(desired, other_owner)


def test_device_taints_are_published_and_cap_slices_at_64_devices() -> None:
    inv = synthetic_inventory(100)
    name = inv.gpus[3].device_name
    taint = {
        "key": "vgpu.dra.dev/xid",
        "value": "xid-94",
        "effect": "NoSchedule",
        "timeAdded": "2026-11-23T15:00:00Z",
    }
    built = slices.build_slices(
        inv, driver="vgpu.dra.dev", node_name="node-1", node_uid="uid-1", taints={name: [taint]}
    )
    assert [len(s["spec"]["devices"]) for s in built] == [64, 36]
    by_name = {d["name"]: d for s in built for d in s["spec"]["devices"]}
    assert by_name[name]["taints"] == [taint]
    assert "taints" not in by_name[inv.gpus[4].device_name]
    untainted = slices.build_slices(
        inv, driver="vgpu.dra.dev", node_name="node-1", node_uid="uid-1"
    )
    assert [len(s["spec"]["devices"]) for s in untainted] == [100]
    # The API server stamps or re-formats timeAdded: not a change; a new taint value is.
    served = copy.deepcopy(built[0])
    served["spec"]["devices"][3]["taints"][0]["timeAdded"] = "2026-11-23T15:00:00+00:00"
    assert slices.same_content(built[0], served)
    served["spec"]["devices"][3]["taints"][0]["value"] = "xid-95"
    assert not slices.same_content(built[0], served)
    with pytest.raises(slices.SliceError, match="at most 16"):
        slices.build_slices(
            inv, driver="d.dev", node_name="n", node_uid="u", taints={name: [taint] * 17}
        )


def test_binding_conditions_are_published_only_when_asked_and_count_as_a_change() -> None:
    inv = synthetic_inventory(2)
    plain = slices.build_slices(inv, driver="vgpu.dra.dev", node_name="n", node_uid="u")
    bound = slices.build_slices(
        inv, driver="vgpu.dra.dev", node_name="n", node_uid="u", binding_conditions=True
    )
    for device in plain[0]["spec"]["devices"]:
        assert "bindingConditions" not in device and "bindingFailureConditions" not in device
    for device in bound[0]["spec"]["devices"]:
        assert device["bindingConditions"] == [slices.CONDITION_CONFIRMED]
        assert device["bindingFailureConditions"] == [slices.CONDITION_OVERBOOKED]
    assert not slices.same_content(bound[0], plain[0])  # toggling republishes the pool
    assert slices.same_content(bound[0], copy.deepcopy(bound[0]))
