"""ResourceSlices of GPUs in MIG mode (dra_driver.mig_slices via slices.build_slices): counter
sets in slices of their own, <= 64 counter-consuming devices per slice, one device per placement,
the whole GPU consuming every slice; and the MIG counters reproduce NVIDIA's placement rules."""

from __future__ import annotations

import itertools
import json

from dra_driver import mig, slices
from dra_driver.gpu import NodeInventory
from dra_driver.mig import MigLayout, MigProfile
from tests.fixtures.claimdata import gpu

MIB = 1 << 20
# The simulated H100 80 GB's table (docs/mig.md).
H100 = (
    MigProfile(name="1g.10gb", nvml_index=0, profile_id=19, slices=1, memory_bytes=9984 * MIB,
               sm_count=16, instance_count=7, placement_size=1, starts=(0, 1, 2, 3, 4, 5, 6)),
    MigProfile(name="2g.20gb", nvml_index=1, profile_id=14, slices=2, memory_bytes=20096 * MIB,
               sm_count=32, instance_count=3, placement_size=2, starts=(0, 2, 4)),
    MigProfile(name="3g.40gb", nvml_index=2, profile_id=9, slices=3, memory_bytes=40448 * MIB,
               sm_count=60, instance_count=2, placement_size=4, starts=(0, 4)),
    MigProfile(name="4g.40gb", nvml_index=3, profile_id=5, slices=4, memory_bytes=40448 * MIB,
               sm_count=64, instance_count=1, placement_size=4, starts=(0,)),
    MigProfile(name="7g.80gb", nvml_index=4, profile_id=0, slices=7, memory_bytes=81152 * MIB,
               sm_count=132, instance_count=1, placement_size=8, starts=(0,)),
    MigProfile(name="1g.10gb+me", nvml_index=7, profile_id=20, slices=1,
               memory_bytes=9984 * MIB, sm_count=16, instance_count=1, placement_size=1,
               starts=(0, 1, 2, 3, 4, 5, 6)),
    MigProfile(name="1g.20gb", nvml_index=9, profile_id=15, slices=1, memory_bytes=20096 * MIB,
               sm_count=26, instance_count=4, placement_size=2, starts=(0, 2, 4, 6)),
)  # fmt: skip
LAYOUT = MigLayout(enabled=True, pending=True, profiles=H100)


def node(count: int, strategy: str = "dynamic") -> NodeInventory:
    gpus = tuple(
        gpu(i).model_copy(update={"mig_capable": True, "mig": LAYOUT, "mig_strategy": strategy})
        for i in range(count)
    )
    return NodeInventory(driver_version="580.95.05", cuda_driver_version="13.0", gpus=gpus)


def build(inventory: NodeInventory) -> list[dict]:  # type: ignore[type-arg]
    return slices.build_slices(inventory, driver="vgpu.dra.dev", node_name="n", node_uid="u")


def test_one_gpu_is_a_counter_slice_and_26_devices() -> None:
    built = build(node(1))
    device_slices = [s for s in built if "devices" in s["spec"]]
    counter_slices = [s for s in built if "sharedCounters" in s["spec"]]
    assert len(counter_slices) == 1 and "devices" not in counter_slices[0]["spec"]
    [counter_set] = counter_slices[0]["spec"]["sharedCounters"]
    assert counter_set["name"] == "gpu-0"
    assert counter_set["counters"]["compute-slices"] == {"value": "7"}
    assert counter_set["counters"]["instances-1g10gbme"] == {"value": "1"}
    assert len(counter_set["counters"]) == 8 + 1 + 1  # no counter for limits slices imply
    devices = [d for s in device_slices for d in s["spec"]["devices"]]
    # 7 + 3 + 2 + 1 + 1 + 7 + 4 placements, plus the whole GPU.
    assert len(devices) == 26
    whole = next(d for d in devices if d["name"] == "gpu-0")
    assert "allowMultipleAllocations" not in whole  # a GPU in MIG mode runs no shares
    used = whole["consumesCounters"][0]["counters"]
    assert {k for k in used if k.startswith("memory-slice-")} == {
        f"memory-slice-{i}" for i in range(8)
    }
    small = next(d for d in devices if d["name"] == "gpu-0-mig-3g40gb-4")
    assert small["attributes"]["profile"] == {"string": "3g.40gb"}
    assert small["attributes"]["parentUUID"] == {"string": gpu(0).uuid}
    assert small["consumesCounters"][0]["counters"] == {
        "memory-slice-4": {"value": "1"},
        "memory-slice-5": {"value": "1"},
        "memory-slice-6": {"value": "1"},
        "memory-slice-7": {"value": "1"},
        "compute-slices": {"value": "3"},
    }
    assert all(s["spec"]["pool"]["resourceSliceCount"] == len(built) for s in built)


def test_eight_gpus_respect_the_api_limits_and_their_size_is_reported() -> None:
    built = build(node(8))
    device_slices = [s for s in built if "devices" in s["spec"]]
    counter_slices = [s for s in built if "sharedCounters" in s["spec"]]
    assert all(len(s["spec"]["devices"]) <= 64 for s in device_slices)
    assert sum(len(s["spec"]["devices"]) for s in device_slices) == 8 * 26
    assert all(len(s["spec"]["sharedCounters"]) <= 8 for s in counter_slices)
    for counter_set in counter_slices[0]["spec"]["sharedCounters"]:
        assert len(counter_set["counters"]) <= 32
    for device in (d for s in device_slices for d in s["spec"]["devices"]):
        assert len(device["attributes"]) + len(device["capacity"]) <= 32
        assert len(device["name"]) <= 63
    sizes = [len(json.dumps(s, separators=(",", ":"))) for s in built]
    assert max(sizes) < 1_500_000 // 10  # far under the object size limit (docs/mig.md)


def test_static_gpus_publish_only_their_instances() -> None:
    instance = mig.MigInstance(gi_id=1, profile_id=9, start=4, size=4, ci_id=0, uuid="MIG-x")
    layout = LAYOUT.model_copy(update={"instances": (instance,)})
    inventory = node(1, "static")
    inventory = inventory.model_copy(
        update={"gpus": (inventory.gpus[0].model_copy(update={"mig": layout}),)}
    )
    devices = [d for s in build(inventory) for d in s["spec"].get("devices", [])]
    assert [d["name"] for d in devices] == ["gpu-0-mig-3g40gb-4"]
    assert devices[0]["attributes"]["migUUID"] == {"string": "MIG-x"}


def test_off_strategy_keeps_the_shareable_gpu() -> None:
    [only] = build(node(1, "off"))
    [device] = only["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True and "consumesCounters" not in device


def _fits(layout: MigLayout, chosen: list[tuple[MigProfile, int]]) -> bool:
    left = mig.counters(layout)
    for profile, start in chosen:
        for name, value in mig.consumption(layout, profile, start).items():
            left[name] -= value
    return all(value >= 0 for value in left.values())


def _nvidia_rules(chosen: list[tuple[MigProfile, int]]) -> bool:
    """The simulator's creation rule (docs/mig.md, Placement rules)."""
    taken: set[int] = set()
    for profile, start in chosen:
        span = set(range(start, start + profile.placement_size))
        if span & taken:
            return False
        taken |= span
    per_profile = {p.profile_id: 0 for p, _ in chosen}
    for profile, _ in chosen:
        per_profile[profile.profile_id] += 1
        if per_profile[profile.profile_id] > profile.instance_count:
            return False
    return sum(p.slices for p, _ in chosen) <= 7 and len(chosen) <= 7


def test_counters_allow_exactly_what_nvidia_allows_for_pairs_and_triples() -> None:
    every = [(p, s) for p in H100 for s in p.starts]
    for size in (2, 3):
        for chosen in itertools.combinations(every, size):
            assert _fits(LAYOUT, list(chosen)) == _nvidia_rules(list(chosen)), chosen


def test_the_controllers_model_takes_mig_slices() -> None:
    """The policy path does not model counters yet (issue 26, item 3): its model must still
    read MIG slices without failing (counter-set slices carry no devices)."""
    from dra_driver.allocator.model import ClusterModel

    model = ClusterModel()
    built = build(node(2))
    for obj in built:
        model.apply("ResourceSlice", obj)
    assert any("gpu-0-mig-1g10gb-3" in str(key) for key in model.devices)
