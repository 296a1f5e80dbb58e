"""The one definition of a GPU's consumable capacity, and the places that must agree on it."""

from __future__ import annotations

import math

import pytest

from dra_driver import capacity
from dra_driver.allocator import parse_quantity
from dra_driver.slices import SliceError, device_capacity
from kubelet_plugin.claims import ClaimError, ClaimRef, parse_allocation
from kubelet_plugin.plan import check_capacity, plan_claim
from tests.fixtures.claimdata import DRIVER, NODE, GiB, claim, gpu, inventory, result

MiB = 1 << 20


def test_memory_is_scaled_and_rounded_down_to_whole_mib() -> None:
    assert capacity.scaled_memory(16 * GiB, 1.0) == 16 * GiB
    assert capacity.scaled_memory(16 * GiB + 5, 1.0) == 16 * GiB
    assert capacity.scaled_memory(10 * MiB, 1.55) == 15 * MiB  # 15.5 MiB -> 15 MiB
    assert capacity.scaled_memory(10, 1.0) == MiB  # never below one step


@pytest.mark.parametrize("ratio", [0.5, 0.0, -1.0, math.nan])
def test_bad_ratio_is_refused(ratio: float) -> None:
    with pytest.raises(capacity.CapacityError, match=r"ratio must be >= 1\.0"):
        capacity.scaled_memory(GiB, ratio)


def test_published_capacity_is_the_module_value() -> None:
    published = capacity.device_capacity(16 * GiB + 3 * MiB // 2, 2.0)
    memory = published["memory"]
    assert parse_quantity(memory["value"]) == capacity.scaled_memory(16 * GiB + 3 * MiB // 2, 2.0)
    assert memory["requestPolicy"]["validRange"]["max"] == memory["value"]
    assert published["cores"]["value"] == str(capacity.CORES_TOTAL)
    assert device_capacity(gpu(0), 2.0) == capacity.device_capacity(gpu(0).memory_bytes, 2.0)
    with pytest.raises(SliceError, match="ratio"):
        device_capacity(gpu(0), 0.5)


def test_guard_uses_the_published_capacity_not_unrounded_bytes() -> None:
    # A GPU whose memory is not a whole number of MiB publishes the value rounded down; an
    # allocation of the unrounded total exceeds what was published and must be refused at prepare.
    # (Before the capacity module the guard compared against bytes x ratio, unrounded, and let
    # this through.)
    odd = 16 * GiB + MiB // 2
    inv = inventory(memory=odd)
    obj = claim([result("gpu-0", memory=str(odd))])
    meta = obj["metadata"]
    ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
    # A claim that alone asks more than the published capacity is refused as invalid
    # (it can never be honoured; not "overbooked", which would blame the other claims).
    plan = plan_claim(parse_allocation(obj, ref, driver=DRIVER, node_name=NODE), inv)
    with pytest.raises(ClaimError, match=f"more than it has \\(memory {16 * GiB} bytes"):
        check_capacity(plan, [], inv)
