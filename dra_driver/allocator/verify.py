"""Is a given allocation one the API allows on this model? The allocator's acceptance check.

Whoever made an allocation (kube-scheduler, another controller, ourselves), this answers with the
API's rules only (no policy): every result names a known device on one node; each request got
its count (or, in All mode, every matching device); the devices match the class and request
selectors and tolerate their taints; consumed capacity is what the device's requestPolicy makes of
the request; nothing is overbooked given every other allocated claim; a device without
allowMultipleAllocations is held by one claim only; matchAttribute / distinctAttribute hold.

The e2e test uses it to prove every allocation the real kube-scheduler makes is one the allocator
accepts as feasible, and the property tests use it on the allocator's own placements.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.allocator.cel import CelError
from dra_driver.allocator.model import ClusterModel, Device, consumption
from dra_driver.allocator.nodefit import blocking_taint
from dra_driver.allocator.quantity import QuantityError, parse_quantity
from dra_driver.allocator.request import Alternative, Claim


def _alternatives(claim: Claim) -> dict[str, Alternative]:
    return {alt.name: alt for request in claim.requests for alt in request.alternatives}


def expected_consumption(alt: Alternative, device: Device) -> dict[str, int] | None:
    """What `alt` consumes of `device` under its request policies (None: not allowed)."""
    amounts = consumption(alt.capacity, device, alt.memory_percent)
    return None if amounts is None else dict(amounts)


def check_allocation(model: ClusterModel, claim: Claim, allocation: Mapping[str, Any]) -> list[str]:
    """Problems with `allocation` (the claim's `status.allocation`); empty when feasible.

    The claim's own consumption must not yet be counted in `model` (check before applying the
    claim's event, or after deleting it).
    """
    problems: list[str] = []
    results = (allocation.get("devices") or {}).get("results") or []
    alternatives = _alternatives(claim)
    nodes: set[str] = set()
    per_request: dict[str, list[Device]] = {}
    added: dict[tuple[str, str, str], dict[str, int]] = {}
    for i, result in enumerate(results):
        where = f"results[{i}] ({result.get('request')}: {result.get('device')})"
        key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
        device = model.devices.get(key)
        alt = alternatives.get(str(result.get("request")))
        if device is None:
            problems.append(f"{where}: no such device in the model")
            continue
        if alt is None:
            problems.append(f"{where}: the claim has no request of that name")
            continue
        nodes.add(device.node)
        per_request.setdefault(alt.name, []).append(device)
        try:
            if not all(s.matches(device.view) for s in alt.selectors):
                problems.append(f"{where}: does not match the selectors")
        except CelError as exc:
            problems.append(f"{where}: {exc}")
        if blocking_taint(device.taints, alt.tolerations) is not None:
            problems.append(f"{where}: device taint not tolerated")
        if result.get("adminAccess"):
            continue
        if not device.allow_multiple:
            if model.allocation_count(key) > 0 or key in added:
                problems.append(f"{where}: device is not shareable and already allocated")
            added.setdefault(key, {})
            continue
        problems += _check_capacity(
            model, device=device, alt=alt, result=result, added=added, where=where
        )
    if len(nodes) > 1:
        problems.append(f"devices on several nodes: {sorted(nodes)}")
    problems += _check_counts(model, claim, per_request)
    problems += _check_constraints(claim, per_request)
    return problems


def _check_counts(
    model: ClusterModel, claim: Claim, per_request: dict[str, list[Device]]
) -> list[str]:
    """Each request got exactly one alternative, with its count (All: every matching device)."""
    problems: list[str] = []
    for request in claim.requests:
        used_alts = [a for a in request.alternatives if a.name in per_request]
        if len(used_alts) != 1:
            problems.append(f"request {request.name}: {len(used_alts)} alternatives allocated")
            continue
        alt = used_alts[0]
        got = per_request[alt.name]
        if alt.all_devices:
            node = got[0].node
            matching = []
            for d in model.devices.values():
                if d.node != node or blocking_taint(d.taints, alt.tolerations) is not None:
                    continue
                try:
                    if all(s.matches(d.view) for s in alt.selectors):
                        matching.append(d.key)
                except CelError:
                    continue
            if sorted(d.key for d in got) != sorted(matching):
                problems.append(f"request {alt.name}: All mode did not get every matching device")
        elif len(got) != alt.count:
            problems.append(f"request {alt.name}: {len(got)} devices for count {alt.count}")
    return problems


def _check_constraints(claim: Claim, per_request: dict[str, list[Device]]) -> list[str]:
    problems: list[str] = []
    for k, constraint in enumerate(claim.constraints):
        names = constraint.requests or tuple(r.name for r in claim.requests)
        devices = [d for name, ds in per_request.items() if name.split("/")[0] in names for d in ds]
        values = [d.attribute(constraint.attribute) for d in devices]
        if any(v is None for v in values):
            problems.append(f"constraints[{k}]: a device lacks {constraint.attribute}")
        elif constraint.distinct and len(set(values)) != len(values):
            problems.append(f"constraints[{k}]: {constraint.attribute} values repeat")
        elif not constraint.distinct and len(set(values)) > 1:
            problems.append(f"constraints[{k}]: {constraint.attribute} values differ")
    return problems


def _check_capacity(
    model: ClusterModel,
    *,
    device: Device,
    alt: Alternative,
    result: Mapping[str, Any],
    added: dict[tuple[str, str, str], dict[str, int]],
    where: str,
) -> list[str]:
    """Consumed capacity follows the request policy and nothing is overbooked."""
    problems: list[str] = []
    key = device.key
    if model.is_held(key):
        problems.append(f"{where}: device is held exclusively by another claim")
    expected = expected_consumption(alt, device)
    if expected is None:
        problems.append(f"{where}: the request policy does not allow this request")
        return problems
    consumed: dict[str, int] = {}
    try:
        for name, value in (result.get("consumedCapacity") or {}).items():
            qualified = name if "/" in name else f"{key[0]}/{name}"
            consumed[qualified] = parse_quantity(str(value))
    except QuantityError as exc:
        problems.append(f"{where}: consumedCapacity: {exc}")
        return problems
    for name, amount in expected.items():
        if consumed.get(name, amount) != amount:
            problems.append(f"{where}: consumed {name}={consumed[name]}, the policy gives {amount}")
    extra = added.setdefault(key, {})
    used = model.device_used(key)
    for name, amount in expected.items():
        extra[name] = extra.get(name, 0) + amount
        if used.get(name, 0) + extra[name] > device.capacity[name].value:
            problems.append(f"{where}: {name} overbooked")
    return problems
