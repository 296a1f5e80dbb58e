"""Pure planning: limits per device, config merging per request, the overbooking guard and the
exact vgpu.conf text the hook parses."""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_plugin.claims import ClaimError, ClaimRef, parse_allocation
from kubelet_plugin.plan import (
    ClaimPlan,
    OverbookedError,
    check_capacity,
    log_level,
    plan_claim,
    render_hook_config,
)
from tests.fixtures.claimdata import (
    DRIVER,
    NODE,
    GiB,
    claim,
    config_entry,
    gpu,
    inventory,
    result,
    vgpu_config,
)


def plan_of(obj: dict[str, Any], inv: Any = None, **kwargs: Any) -> ClaimPlan:
    meta = obj["metadata"]
    ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
    allocation = parse_allocation(obj, ref, driver=DRIVER, node_name=NODE)
    return plan_claim(allocation, inv or inventory(), **kwargs)


def test_consumed_capacity_becomes_the_limits() -> None:
    plan = plan_of(claim([result("gpu-2", memory="10Gi", cores=30, share_id="abc")]))
    [device] = plan.devices
    assert (device.uuid, device.minor, device.memory, device.cores) == (
        gpu(2).uuid,
        2,
        10 * GiB,
        30,
    )
    assert (device.policy, device.oversubscribe) == ("fixed", False)
    assert plan.cdi_device_name(device) == f"{plan.uid}-gpu-2-abc"


def test_absent_capacity_means_whole_gpu_and_no_core_cap() -> None:
    [device] = plan_of(claim([result("gpu-0")])).devices
    assert (device.memory, device.cores) == (80 * GiB, 0)
    assert device.share_id is None


def test_unknown_device_is_an_error() -> None:
    with pytest.raises(ClaimError, match=r"device 'gpu-9' is not on this node \(known: gpu-0"):
        plan_of(claim([result("gpu-9")]))


def test_cores_out_of_range() -> None:
    with pytest.raises(ClaimError, match=r"cores=101; allowed 0\.\.100"):
        plan_of(claim([result("gpu-0", cores=101)]))


def test_class_config_then_claim_config_per_request() -> None:
    obj = claim(
        [result("gpu-0", request="a"), result("gpu-1", request="b")],
        configs=[
            # claim entries listed first on purpose: the claim must still win over the class
            config_entry(vgpu_config(computePolicy="balance"), requests=["b"]),
            config_entry(
                vgpu_config(computePolicy="none", memoryOversubscription=True), source="FromClass"
            ),
            config_entry(vgpu_config(logLevel="debug"), requests=["a"]),
        ],
    )
    a, b = plan_of(obj).devices
    assert (a.policy, a.oversubscribe, a.log_level) == ("none", True, "debug")
    assert (b.policy, b.oversubscribe, b.log_level) == ("balance", True, None)


def test_invalid_config_error_names_claim_request_and_field() -> None:
    obj = claim([result("gpu-0")], configs=[config_entry(vgpu_config(computePolicy="max"))])
    with pytest.raises(ClaimError) as err:
        plan_of(obj)
    message = str(err.value)
    assert "request 'gpu'" in message
    assert "'computePolicy' has invalid value 'max'; allowed: fixed|balance|none" in message


def test_hook_config_text_is_exact() -> None:
    obj = claim(
        [result("gpu-1", memory="1Gi", cores=10), result("gpu-3", request="other")],
        uid="11111111-2222-3333-4444-555555555555",
        configs=[config_entry(vgpu_config(memoryOversubscription=True), requests=["other"])],
    )
    assert render_hook_config(plan_of(obj)) == (
        "# vgpu-dra hook configuration (written by the kubelet plugin at prepare)\n"
        "version 1\n"
        "claim 11111111-2222-3333-4444-555555555555\n"
        f"device uuid={gpu(1).uuid} memory={1 << 30} cores=10 policy=fixed oversubscribe=0\n"
        f"device uuid={gpu(3).uuid} memory={80 * GiB} cores=0 policy=fixed oversubscribe=1\n"
    )


def test_two_shares_of_one_gpu_in_one_claim_add_up() -> None:
    obj = claim(
        [
            result("gpu-0", request="a", memory="2Gi", cores=60, share_id="s1"),
            result("gpu-0", request="b", memory="3Gi", cores=60, share_id="s2"),
        ]
    )
    plan = plan_of(obj)
    assert plan.visible_uuids() == [gpu(0).uuid]
    assert f"memory={5 << 30} cores=100 " in render_hook_config(plan)


def test_conflicting_policies_on_one_gpu_are_refused() -> None:
    obj = claim(
        [
            result("gpu-0", request="a", memory="2Gi", share_id="s1"),
            result("gpu-0", request="b", memory="3Gi", share_id="s2"),
        ],
        configs=[config_entry(vgpu_config(computePolicy="none"), requests=["b"])],
    )
    with pytest.raises(ClaimError, match="different computePolicy values"):
        plan_of(obj)


def test_log_level_is_the_most_verbose_asked_for() -> None:
    obj = claim(
        [result("gpu-0", request="a"), result("gpu-1", request="b")],
        configs=[
            config_entry(vgpu_config(logLevel="info"), requests=["a"]),
            config_entry(vgpu_config(logLevel="warn"), requests=["b"]),
        ],
    )
    assert log_level(plan_of(obj)) == "info"
    assert log_level(plan_of(claim([result("gpu-0")]))) is None


def test_overbooking_guard_memory_and_cores() -> None:
    inv = inventory(memory=16 * GiB)
    first = plan_of(claim([result("gpu-0", memory="10Gi", cores=70)]), inv)
    check_capacity(first, [], inv)  # fits on an empty device
    fits = plan_of(claim([result("gpu-0", memory="6Gi", cores=30)]), inv)
    check_capacity(fits, [first], inv)
    too_much_memory = plan_of(claim([result("gpu-0", memory="7Gi")]), inv)
    with pytest.raises(OverbookedError) as err:
        check_capacity(too_much_memory, [first], inv)
    assert "device gpu-0: memory 18253611008 bytes requested in total" in str(err.value)
    assert f"this claim {7 * GiB}" in str(err.value)
    assert f"capacity {16 * GiB} bytes" in str(err.value)
    too_many_cores = plan_of(claim([result("gpu-0", memory="1Gi", cores=31)]), inv)
    with pytest.raises(OverbookedError, match=r"cores 101 requested in total .* > capacity 100"):
        check_capacity(too_many_cores, [first], inv)


def test_oversubscription_ratio_scales_memory_capacity() -> None:
    inv = inventory(memory=16 * GiB)
    first = plan_of(claim([result("gpu-0", memory="16Gi")]), inv)
    second = plan_of(claim([result("gpu-0", memory="8Gi")]), inv)
    with pytest.raises(OverbookedError):
        check_capacity(second, [first], inv)
    check_capacity(second, [first], inv, oversubscription_ratio=1.5)


def test_guard_ignores_the_claims_own_previous_record_and_other_devices() -> None:
    inv = inventory(memory=16 * GiB)
    plan = plan_of(claim([result("gpu-0", memory="16Gi")]), inv)
    elsewhere = plan_of(claim([result("gpu-1", memory="16Gi")]), inv)
    check_capacity(plan, [plan, elsewhere], inv)


def test_admin_access_is_uncapped_and_not_counted() -> None:
    inv = inventory(memory=16 * GiB)
    full = plan_of(claim([result("gpu-0", memory="16Gi", cores=100)]), inv)
    obj = claim([result("gpu-0", memory="1Gi", cores=5)])
    obj["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    admin = plan_of(obj, inv)
    [device] = admin.devices
    assert (device.memory, device.cores, device.policy, device.admin_access) == (
        16 * GiB,
        0,
        "none",
        True,
    )
    check_capacity(admin, [full], inv)  # monitoring a full GPU is allowed
    check_capacity(full, [admin], inv)  # and does not block tenants


def test_bad_config_from_a_device_class_says_so() -> None:
    obj = claim(
        [result("gpu-0")],
        configs=[config_entry(vgpu_config(computePolicy="fast"), source="FromClass")],
    )
    with pytest.raises(ClaimError) as err:
        plan_of(obj)
    assert "config from its DeviceClass (FromClass: fix the DeviceClass" in str(err.value)
    assert "'computePolicy' has invalid value 'fast'" in str(err.value)
    obj = claim([result("gpu-0")], configs=[config_entry(vgpu_config(computePolicy="fast"))])
    with pytest.raises(ClaimError, match="config from the claim: invalid VgpuConfig"):
        plan_of(obj)
