"""The acceptance check refuses allocations the API would not allow."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.allocator.allocate import Allocator
from dra_driver.allocator.model import ClusterModel
from dra_driver.allocator.request import Policy, parse_claim
from tests.fixtures.allocation_check import check_allocation
from tests.fixtures.allocator_cluster import DEVICE_CLASS, DRIVER, claim_obj, node_events
from tests.unit.dra_driver.allocator.extension import needs_extension

pytestmark = needs_extension

CLASSES = {DRIVER: DEVICE_CLASS}


def setup() -> tuple[Allocator, Any, dict[str, Any]]:
    model = ClusterModel()
    for events in (node_events(0, shape="pairs"), node_events(1, shape="pairs")):
        for kind, obj in events:
            model.apply(kind, obj)
    alloc = Allocator(model)
    claim = parse_claim(
        claim_obj("a", count=2, memory="10Gi", cores="30", match=f"{DRIVER}/nvlinkDomain"),
        CLASSES,
    )
    placement = alloc.place({"spec": {}}, [claim], Policy())
    return alloc, claim, placement.allocation(claim.uid)


def test_a_valid_allocation_passes_and_each_fault_is_named() -> None:
    alloc, claim, allocation = setup()
    assert check_allocation(alloc.model, claim, allocation) == []
    results = allocation["devices"]["results"]

    def broken(change: Any) -> list[str]:
        bad = copy.deepcopy(allocation)
        change(bad["devices"]["results"])
        return check_allocation(alloc.model, claim, bad)

    assert any("values differ" in p for p in broken(lambda r: r[1].update(device="gpu-2")))
    assert any("several nodes" in p for p in broken(lambda r: r[1].update(pool="node-00001")))
    assert any(
        "policy gives" in p
        for p in broken(lambda r: r[0]["consumedCapacity"].update(memory=str(5 << 30)))
    )
    assert any("count 2" in p for p in broken(lambda r: r.pop()))
    assert any("no such device" in p for p in broken(lambda r: r[0].update(device="gpu-99")))
    # Once another claim filled the GPUs, the same allocation overbooks.
    full = claim_obj("b", count=2, cores="80", memory="1Gi")
    other = copy.deepcopy(full)
    other["status"] = {"allocation": copy.deepcopy(allocation)}
    for r in other["status"]["allocation"]["devices"]["results"]:
        r["consumedCapacity"]["cores"] = "80"
    alloc.model.apply("ResourceClaim", other)
    assert any("cores overbooked" in p for p in check_allocation(alloc.model, claim, allocation))
    assert results
