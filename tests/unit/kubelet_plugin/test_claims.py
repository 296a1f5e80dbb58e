"""Parsing a claim's allocation: this driver's results on this node, configs, quantities."""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_plugin.claims import ClaimError, ClaimRef, parse_allocation
from tests.fixtures.claimdata import (
    DRIVER,
    NODE,
    claim,
    config_entry,
    result,
    vgpu_config,
)


def ref_of(obj: dict[str, Any]) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def test_results_of_other_drivers_are_ignored_and_quantities_parsed() -> None:
    obj = claim(
        [
            result("gpu-1", memory="10Gi", cores=30, share_id="s-1"),
            result("nic-0", driver="net.example.com", pool="elsewhere"),
        ],
        configs=[
            config_entry(vgpu_config(computePolicy="none"), requests=["gpu"]),
            {"source": "FromClaim", "opaque": {"driver": "net.example.com", "parameters": {}}},
        ],
    )
    allocation = parse_allocation(obj, ref_of(obj), driver=DRIVER, node_name=NODE)
    [device] = allocation.devices
    assert (device.device, device.share_id, device.consumed) == (
        "gpu-1",
        "s-1",
        {"memory": 10 << 30, "cores": 30},
    )
    assert len(allocation.configs) == 1
    assert allocation.configs[0].requests == ("gpu",)


def test_qualified_capacity_names_are_understood() -> None:
    obj = claim([result("gpu-0")])
    obj["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {
        "vgpu.dra.dev/memory": "1500Mi",
        "other.example.com/thing": "3",
    }
    [device] = parse_allocation(obj, ref_of(obj), driver=DRIVER, node_name=NODE).devices
    assert device.consumed == {"memory": 1500 << 20}


def test_unallocated_claim() -> None:
    obj = claim([result("gpu-0")])
    del obj["status"]
    with pytest.raises(ClaimError, match="is not allocated"):
        parse_allocation(obj, ref_of(obj), driver=DRIVER, node_name=NODE)


def test_device_in_another_pool_is_an_error_naming_both_pools() -> None:
    obj = claim([result("gpu-0", pool="node-2")])
    with pytest.raises(ClaimError, match="in pool 'node-2', but this node's pool is 'node-1'"):
        parse_allocation(obj, ref_of(obj), driver=DRIVER, node_name=NODE)


def test_no_results_for_this_driver() -> None:
    obj = claim([result("nic-0", driver="net.example.com")])
    with pytest.raises(ClaimError, match=r"no devices allocated by driver 'vgpu.dra.dev'"):
        parse_allocation(obj, ref_of(obj), driver=DRIVER, node_name=NODE)


def test_bad_quantity_names_the_capacity() -> None:
    obj = claim([result("gpu-0", memory="lots")])
    with pytest.raises(ClaimError, match="consumedCapacity memory='lots'"):
        parse_allocation(obj, ref_of(obj), driver=DRIVER, node_name=NODE)


def test_config_applies_to_subrequests_of_a_named_request() -> None:
    obj = claim(
        [result("gpu-0", request="gpu/small")],
        configs=[config_entry(vgpu_config(), requests=["gpu"])],
    )
    [entry] = parse_allocation(obj, ref_of(obj), driver=DRIVER, node_name=NODE).configs
    assert entry.applies_to("gpu/small")
    assert entry.applies_to("gpu")
    assert not entry.applies_to("other")
