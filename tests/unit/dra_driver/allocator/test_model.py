"""The allocator's model follows watch events: pools by generation, claims by uid, pods by node."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.allocator.cel import device_view
from dra_driver.allocator.model import ClusterModel, ModelError
from dra_driver.allocator.quantity import MAX_MODEL_QUANTITY
from tests.fixtures.allocator_cluster import DRIVER, GIB, node_events

MEM = f"{DRIVER}/memory"


def model_of(*groups: list[tuple[str, dict[str, Any]]]) -> ClusterModel:
    model = ClusterModel()
    for group in groups:
        for kind, obj in group:
            model.apply(kind, obj)
    return model


def allocated(uid: str, device: str, memory: str, *, node: str = "node-00000") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": node,
                            "device": device,
                            "shareID": f"share-{uid}",
                            "consumedCapacity": {"memory": memory, "cores": "10"},
                        }
                    ]
                }
            }
        },
    }


def test_only_the_highest_complete_generation_of_a_pool_counts() -> None:
    events = node_events(0, gpus=2)
    model = model_of(events)
    assert sorted(k[2] for k in model.devices) == ["gpu-0", "gpu-1"]
    newer = copy.deepcopy(events[1][1])
    newer["metadata"]["name"] = "other-slice"
    newer["spec"]["pool"].update(generation=2, resourceSliceCount=2)
    newer["spec"]["devices"] = newer["spec"]["devices"][:1]
    model.apply("ResourceSlice", newer)
    # Generation 2 is incomplete (1 of 2 slices): the pool has no usable devices meanwhile.
    assert model.devices == {}
    complete = copy.deepcopy(newer)
    complete["spec"]["pool"]["resourceSliceCount"] = 1
    model.apply("ResourceSlice", complete)
    assert sorted(k[2] for k in model.devices) == ["gpu-0"]  # the old generation is ignored
    model.delete("ResourceSlice", complete)
    assert sorted(k[2] for k in model.devices) == ["gpu-0", "gpu-1"]  # back to generation 0


def test_claims_consume_on_update_and_release_on_delete() -> None:
    model = model_of(node_events(0, gpus=2))
    layout = model.layout()
    row = layout.index[(DRIVER, "node-00000", "gpu-1")]
    model.apply("ResourceClaim", allocated("a", "gpu-1", "10Gi"))
    assert model.device_used((DRIVER, "node-00000", "gpu-1"))[MEM] == 10 * GIB
    assert model.layout() is layout and layout.mem_used[row] == 10 * GIB  # updated in place
    model.apply("ResourceClaim", allocated("a", "gpu-1", "4Gi"))  # an update replaces
    assert layout.mem_used[row] == 4 * GIB and layout.cores_used[row] == 10
    model.apply("ResourceClaim", allocated("b", "gpu-1", "1Gi"))
    assert layout.mem_used[row] == 5 * GIB
    model.delete("ResourceClaim", {"metadata": {"uid": "a"}})
    assert layout.mem_used[row] == 1 * GIB and layout.cores_used[row] == 10
    unallocated = {"metadata": {"uid": "b"}, "status": {}}
    model.apply("ResourceClaim", unallocated)  # deallocation releases too
    assert (
        layout.mem_used[row] == 0 and model.allocation_count((DRIVER, "node-00000", "gpu-1")) == 0
    )


def test_consumption_written_in_place_equals_a_rebuilt_layout() -> None:
    """Claim events update the laid-out rows where they are (the allocator's fast case); the
    arrays then equal those of a layout built afresh from the same model."""
    model = model_of(node_events(0, gpus=2), node_events(1, gpus=2))
    model.layout()
    model.apply("ResourceClaim", allocated("a", "gpu-1", "10Gi"))
    model.apply("ResourceClaim", allocated("b", "gpu-1", "1Gi", node="node-00001"))
    model.apply("ResourceClaim", allocated("a", "gpu-0", "4Gi"))
    model.delete("ResourceClaim", {"metadata": {"uid": "b"}})
    patched = model.layout()
    assert patched.mem_used.tolist() == [4 * GIB, 0, 0, 0]
    assert patched.node_mem_used.tolist() == [4 * GIB, 0]
    assert patched.node_seq.tolist() == [4, 5]  # each node stamped with its last change
    model._layout = None
    fresh = model.layout()
    for name in ("node_mem_used", "node_cores_used", "mem_used", "cores_used", "busy"):
        assert getattr(patched, name).tolist() == getattr(fresh, name).tolist(), name
    assert patched.used_by_dim.tolist() == fresh.used_by_dim.tolist()
    assert patched.dev.tolist() == fresh.dev.tolist()


def test_a_claim_seen_before_its_device_counts_once_the_device_appears() -> None:
    model = ClusterModel()
    model.apply("ResourceClaim", allocated("a", "gpu-0", "2Gi"))
    for kind, obj in node_events(0, gpus=1):
        model.apply(kind, obj)
    layout = model.layout()
    assert layout.mem_used[layout.index[(DRIVER, "node-00000", "gpu-0")]] == 2 * GIB


def test_bound_pods_count_against_their_node() -> None:
    model = model_of(node_events(0, gpus=1))
    pod = {
        "metadata": {"uid": "p"},
        "spec": {
            "nodeName": "node-00000",
            "containers": [{"resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
        },
        "status": {"phase": "Running"},
    }
    model.apply("Pod", pod)
    assert (model.node_cpu_used["node-00000"], model.node_mem_used["node-00000"]) == (4000, GIB)
    model.apply("Pod", {**pod, "status": {"phase": "Succeeded"}})  # finished pods free the node
    assert model.node_cpu_used["node-00000"] == 0


def test_bad_objects_are_refused_with_their_name() -> None:
    model = ClusterModel()
    with pytest.raises(ModelError, match="unknown kind 'Secret'"):
        model.apply("Secret", {})
    with pytest.raises(ModelError, match=r"spec\.driver and spec\.pool\.name"):
        model.apply("ResourceSlice", {"metadata": {"name": "s"}, "spec": {}})
    bad = copy.deepcopy(node_events(0, gpus=1)[1][1])
    bad["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    with pytest.raises(ModelError, match=r"device gpu-0.*lots"):
        model.apply("ResourceSlice", bad)
    # The bad slice changed nothing: a good slice of the same pool is taken afterwards.
    assert model.devices == {}
    for kind, obj in node_events(0, gpus=1):
        obj["metadata"]["name"] += "-good"
        model.apply(kind, obj)
    assert list(model.devices) == [(DRIVER, "node-00000", "gpu-0")]


def test_compact_devices_keep_what_was_published() -> None:
    """Devices are stored compactly (shared names, values and capacity tables; the CEL view
    built on demand) yet read back exactly as the slice published them."""
    events = node_events(0) + node_events(1)
    model = model_of(events)
    published = {
        (obj["spec"]["pool"]["name"], raw["name"]): raw
        for kind, obj in events
        if kind == "ResourceSlice"
        for raw in obj["spec"]["devices"]
    }
    for device in model.devices.values():
        raw = published[(device.key[1], device.key[2])]
        assert device.view == device_view(
            DRIVER, raw["attributes"], raw["capacity"], bool(raw.get("allowMultipleAllocations"))
        )
        for name, typed in raw["attributes"].items():
            [(kind, value)] = typed.items()
            qualified = name if "/" in name else f"{DRIVER}/{name}"  # e.g. resource.kubernetes.io/
            assert device.attribute(qualified) == (kind, value)
        assert device.attribute(f"{DRIVER}/noSuchAttribute") is None
    a, b = (
        model.devices[(DRIVER, "node-00000", "gpu-0")],
        model.devices[(DRIVER, "node-00001", "gpu-0")],
    )
    assert a.capacity is b.capacity and a.attribute_index is b.attribute_index  # shared


def test_a_consumed_amount_beyond_the_bound_counts_as_full() -> None:
    """Only schedulers write allocations: a claim reporting an amount beyond the model's bound
    (2^48; int64's edge included, or a negative one) is a foreign allocator's fault. It is
    counted as filling the device (one past any capacity), never as free, and no sum the layout
    holds overflows."""
    model = ClusterModel()
    for kind, obj in node_events(0, "NVIDIA A10", "pairs", 2):
        model.apply(kind, obj)
    key = (DRIVER, "node-00000", "gpu-0")
    result = {"request": "gpu", "driver": DRIVER, "pool": "node-00000", "device": "gpu-0"}

    def claim(uid: str, amount: str) -> dict[str, Any]:
        consumed = {**result, "shareID": uid, "consumedCapacity": {"memory": amount}}
        return {
            "metadata": {"uid": uid},
            "status": {"allocation": {"devices": {"results": [consumed]}}},
        }

    layout = model.layout()
    row = layout.index[key]
    for uid, amount in (("a", str((1 << 63) - 1)), ("b", "-1"), ("c", "1e30"), ("d", str(1 << 62))):
        model.apply("ResourceClaim", claim(uid, amount))
    assert model.device_used(key)[MEM] == 4 * (MAX_MODEL_QUANTITY + 1)  # exact, in Python
    assert model.allocation_count(key) == 4
    assert int(layout.mem_used[row]) == MAX_MODEL_QUANTITY + 1  # full, in int64
    assert int(model.layout().mem_used[row]) == MAX_MODEL_QUANTITY + 1  # rebuilt: the same
    for uid in "abcd":
        model.delete("ResourceClaim", {"metadata": {"uid": uid}})
    assert model.device_used(key)[MEM] == 0 and int(layout.mem_used[row]) == 0


def test_capacities_and_policies_beyond_the_bound_refuse_the_slice() -> None:
    """A slice whose capacity or request policy carries a value beyond 2^48 (int64's edge
    included) is refused with a reason and changes nothing; before, its arithmetic overflowed
    in the compiled kernel and ended the worker."""
    model = ClusterModel()
    edge = str((1 << 63) - 1)
    for field in ("value", "policy-max", "policy-step", "policy-valid"):
        bad = copy.deepcopy(node_events(0, gpus=1)[1][1])
        memory = bad["spec"]["devices"][0]["capacity"]["memory"]
        if field == "value":
            memory["value"] = edge
        elif field == "policy-valid":
            memory["requestPolicy"] = {"validValues": ["1Gi", edge]}
        else:
            memory["requestPolicy"] = {"validRange": {"min": "1Mi", field[7:]: edge}}
        with pytest.raises(ModelError, match=r"device gpu-0.*outside 0\.\.2\^48"):
            model.apply("ResourceSlice", bad)
    assert model.devices == {}


def test_a_bound_pod_with_absurd_requests_fills_its_node_without_overflow() -> None:
    """A pod bound by name past every scheduler, asking for 1e30 cpu: counted as taking the
    whole node (not as nothing), and a thousand of them keep the layout inside int64."""
    model = model_of(node_events(0, gpus=1))
    layout = model.layout()
    for i in range(1000):
        model.apply(
            "Pod",
            {
                "metadata": {"uid": f"p{i}", "namespace": "t", "name": f"p{i}"},
                "spec": {
                    "nodeName": "node-00000",
                    "containers": [{"resources": {"requests": {"cpu": "1e30", "memory": "1e19"}}}],
                },
                "status": {"phase": "Running"},
            },
        )
    assert model.node_cpu_used["node-00000"] == 1000 * MAX_MODEL_QUANTITY
    node = layout.node_index["node-00000"]
    assert int(layout.cpu_free[node]) < 0 and int(layout.mem_free[node]) < 0
    model._layout = None  # a full rebuild from the sums
    assert int(model.layout().cpu_free[0]) < 0
