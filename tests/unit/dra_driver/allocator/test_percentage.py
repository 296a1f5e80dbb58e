"""Percentage memory requests (claim annotation `vgpu.dra.dev/memory-percentage`): parsing, the
amount per device size, request-policy rounding, free capacity, and the kernels' oracle alike."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.allocator.allocate import Allocator, Placement, Unschedulable
from dra_driver.allocator.model import ClusterModel
from dra_driver.allocator.request import MEMORY_PERCENTAGE, Policy, RequestError, parse_claim
from tests.fixtures.allocation_check import check_allocation
from tests.fixtures.allocator_cluster import (
    DEVICE_CLASS,
    DRIVER,
    GIB,
    PRODUCTS,
    claim_obj,
    node_events,
)
from tests.unit.dra_driver.allocator import reference
from tests.unit.dra_driver.allocator.extension import needs_extension

MiB = 1 << 20
CLASSES = {DRIVER: DEVICE_CLASS}
POD: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {}}
MEMORY = f"{DRIVER}/memory"


def percent_claim(name: str, percent: str, **kwargs: Any) -> dict[str, Any]:
    obj = claim_obj(name, **kwargs)
    obj["metadata"]["annotations"] = {MEMORY_PERCENTAGE: percent}
    return obj


def allocator(*groups: list[tuple[str, dict[str, Any]]], oracle: bool = False) -> Allocator:
    """An allocator over these events; with `oracle`, running the kernels' Python twins."""
    model = ClusterModel()
    for group in groups:
        for kind, obj in group:
            model.apply(kind, obj)
    alloc = Allocator(model)
    if oracle:
        alloc.scan, alloc.search = reference.scan, reference.search
    return alloc


def place(alloc: Allocator, obj: dict[str, Any], policy: Policy | None = None) -> Placement:
    claim = parse_claim(obj, CLASSES)
    placement = alloc.place(POD, [claim], policy or Policy())
    # The node's guard and the e2e checks accept it: consumedCapacity follows the percentage.
    assert check_allocation(alloc.model, claim, placement.allocation(claim.uid)) == []
    alloc.commit(placement)
    return placement


def consumed_memory(placement: Placement) -> list[int]:
    return [dict(r.consumed)[MEMORY] for _, results in placement.results for r in results]


def test_the_annotation_applies_to_every_request_that_names_no_memory() -> None:
    obj = percent_claim("a", "50", cores="30")
    exactly = obj["spec"]["devices"]["requests"][0].pop("exactly")
    obj["spec"]["devices"]["requests"] = [
        {
            "name": "gpu",
            "firstAvailable": [
                {**exactly, "name": "two", "count": 2},
                {**exactly, "name": "sized", "capacity": {"requests": {"memory": "1Gi"}}},
            ],
        },
        {"name": "plain", "exactly": {"deviceClassName": DRIVER}},
    ]
    claim = parse_claim(obj, CLASSES)
    percents = {alt.name: alt.memory_percent for r in claim.requests for alt in r.alternatives}
    assert percents == {"gpu/two": 50, "gpu/sized": 0, "plain": 50}
    assert parse_claim(claim_obj("b"), CLASSES).requests[0].alternatives[0].memory_percent == 0


@pytest.mark.parametrize("value", ["0", "101", "-5", "50%", "12.5", "", "half", "\uff11\uff10"])
def test_a_bad_percentage_fails_the_claim_naming_claim_annotation_and_range(value: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_claim(percent_claim("bad", value), CLASSES)
    message = str(caught.value)
    assert "ResourceClaim default/bad" in message
    assert MEMORY_PERCENTAGE in message
    assert "1 to 100" in message


@needs_extension
def test_half_of_each_gpu_size() -> None:
    """50% of an 80Gi H100 is 40Gi, 50% of a 24Gi A10 is 12Gi; the node is told so."""
    alloc = allocator(
        node_events(0, "NVIDIA H100 80GB HBM3", gpus=1), node_events(1, "NVIDIA A10", gpus=1)
    )
    on_h100 = place(alloc, percent_claim("a", "50"), Policy(include_types=("h100",)))
    on_a10 = place(alloc, percent_claim("b", "50"), Policy(include_types=("a10",)))
    assert consumed_memory(on_h100) == [40 * GIB]
    assert consumed_memory(on_a10) == [12 * GIB]
    api = on_a10.allocation("uid-b")["devices"]["results"][0]
    assert api["consumedCapacity"]["memory"] == str(12 * GIB)
    # Each GPU has half its memory left: one more 50% share fits on each, then none.
    place(alloc, percent_claim("c", "50"), Policy(include_types=("h100",)))
    place(alloc, percent_claim("d", "50"), Policy(include_types=("a10",)))
    with pytest.raises(
        Unschedulable, match=r"1 GPU with 1% of its memory free; closest: node-0000. \(0 GPUs\)"
    ):
        place(alloc, percent_claim("e", "1"))


@needs_extension
def test_percentage_is_rounded_up_to_the_step() -> None:
    alloc = allocator(node_events(0, "NVIDIA H100 80GB HBM3", gpus=1))
    # 33% of 80Gi is not a whole MiB: the 1Mi step rounds it up.
    [amount] = consumed_memory(place(alloc, percent_claim("a", "33")))
    assert amount == -(-(33 * 80 * GIB) // 100 // MiB) * MiB
    assert amount % MiB == 0 and amount >= 33 * 80 * GIB / 100


@needs_extension
def test_percentage_follows_valid_values_and_is_refused_above_them() -> None:
    events = node_events(0, "NVIDIA H100 80GB HBM3", gpus=1)
    slice_obj = copy.deepcopy(events[1][1])
    slice_obj["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {
        "default": "8Gi",
        "validValues": ["4Gi", "8Gi", "16Gi"],
    }
    alloc = allocator([events[0], ("ResourceSlice", slice_obj)])
    assert consumed_memory(place(alloc, percent_claim("a", "5"))) == [4 * GIB]  # exactly 4Gi
    assert consumed_memory(place(alloc, percent_claim("b", "6"))) == [8 * GIB]  # 4.8Gi -> 8Gi
    with pytest.raises(Unschedulable):  # 25% = 20Gi: above every valid value
        place(alloc, percent_claim("c", "25"))


@needs_extension
def test_an_explicit_memory_request_wins_over_the_annotation() -> None:
    alloc = allocator(node_events(0, "NVIDIA A10", gpus=1))
    assert consumed_memory(place(alloc, percent_claim("a", "90", memory="1Gi"))) == [GIB]


@needs_extension
def test_the_oracle_picks_the_same_devices_with_the_same_amounts() -> None:
    groups = [node_events(n, product, "pairs", gpus=4) for n, product in enumerate(PRODUCTS)]
    fast, slow = allocator(*groups), allocator(*groups, oracle=True)
    for i, percent in enumerate(["30", "70", "50", "50", "100", "10"] * 3):
        obj = percent_claim(f"c{i}", percent, count=1 + i % 2)
        outcomes: list[Placement | str] = []
        for alloc in (fast, slow):
            try:
                outcomes.append(place(alloc, copy.deepcopy(obj), Policy(device="binpack")))
            except Unschedulable as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
