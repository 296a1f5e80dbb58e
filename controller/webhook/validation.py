"""Refuse at the door what would otherwise fail later: the pure checks of the validating webhook.

A malformed VgpuConfig is otherwise discovered by the kubelet plugin at prepare, as a pod stuck in
ContainerCreating; the same parser (`dra_driver.config.parse_config`, one implementation) runs here
when a ResourceClaim, ResourceClaimTemplate or DeviceClass is written. Pods are refused when their
policy annotations contradict each other or name unknown values (the translator's own reader,
`translate.read_pod_policy`), or when they ask for more GPU memory than any GPU in the cluster
has. Each message names the field, the value and the allowed values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.webhook import legacy
from controller.webhook.translate import Refusal, read_pod_policy
from dra_driver import config, kube, names
from dra_driver.allocator import QuantityError, parse_quantity

JSON = dict[str, Any]
MIB = 1 << 20
_PERCENT = re.compile(r"[0-9]{1,3}")

# Legacy resources that give GPU memory in MiB per GPU.
_MEMORY_MIB = (legacy.VGPU_MEMORY, legacy.HAMI_MEMORY, legacy.VCUDA_MEMORY)


@dataclass(frozen=True)
class ClusterFacts:
    largest_gpu_memory_mib: int | None  # None = unknown (no slices yet): skip the memory check
    # Product names seen in slices. Not a reason to refuse: a node pool scaled to zero may bring a
    # type back; kept for messages and future checks.
    gpu_types: frozenset[str] = frozenset()
    driver: str = names.DEFAULT_DRIVER_NAME
    device_classes: frozenset[str] = frozenset({names.DEFAULT_DRIVER_NAME})


def validate_object(obj: Mapping[str, Any], facts: ClusterFacts) -> list[str]:
    """Refusal messages for one object ([] = allowed)."""
    kind = obj.get("kind")
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or meta.get("generateName") or "")
    spec = obj.get("spec") or {}
    if kind == "DeviceClass":
        return _configs(f"DeviceClass {name}", "spec.config", spec.get("config"), facts)
    if kind == "ResourceClaim":
        where = f"ResourceClaim {name}"
        devices = spec.get("devices")
        return _devices(where, "spec.devices", devices, facts) + _memory_percentage(
            where, "metadata.annotations", meta.get("annotations"), devices, facts
        )
    if kind == "ResourceClaimTemplate":
        where = f"ResourceClaimTemplate {name}"
        devices = (spec.get("spec") or {}).get("devices")
        claim_meta = spec.get("metadata") or {}
        return (
            _devices(where, "spec.spec.devices", devices, facts)
            + _memory_percentage(
                where, "spec.metadata.annotations", claim_meta.get("annotations"), devices, facts
            )
            + _misplaced_percentage(where, meta.get("annotations"))
        )
    if kind == "Pod":
        return _pod(f"Pod {name}", obj, facts)
    return []


def _memory_percentage(
    where: str, path: str, annotations: Any, devices: Any, facts: ClusterFacts
) -> list[str]:
    """`vgpu.dra.dev/memory-percentage` on a claim: a percentage 1..100, and at least one request
    of our DeviceClasses that names no memory (the requests it applies to; contract with the
    allocation controller, which alone honours it)."""
    key = legacy.CANONICAL["memory_percentage"]
    if not isinstance(annotations, Mapping) or key not in annotations:
        return []
    raw = annotations[key]
    field = f"{where}: {path}[{key}]={str(raw)[:40]!r}"
    if not (isinstance(raw, str) and _PERCENT.fullmatch(raw) and 1 <= int(raw) <= 100):
        return [f"{field}: an integer percentage of each GPU's memory, 1..100"]
    classes = ", ".join(sorted(facts.device_classes))
    if not any(
        alternative.get("deviceClassName") in facts.device_classes
        and not _names_memory(alternative, facts.driver)
        for alternative in _alternatives(devices)
    ):
        return [
            f"{field}: applies to the requests of DeviceClass {classes} that name no capacity "
            f"{names.CAPACITY_MEMORY}, and this claim has none; drop the annotation, or drop "
            f"the {names.CAPACITY_MEMORY} request (a percentage and an absolute amount cannot "
            "be used together)"
        ]
    return []


def _misplaced_percentage(where: str, annotations: Any) -> list[str]:
    key = legacy.CANONICAL["memory_percentage"]
    if isinstance(annotations, Mapping) and key in annotations:
        return [
            f"{where}: metadata.annotations[{key}]: the template's own annotations do not reach "
            "its claims; put it under spec.metadata.annotations"
        ]
    return []


def _alternatives(devices: Any) -> list[Mapping[str, Any]]:
    """Every device request's `exactly` and `firstAvailable` entries."""
    found: list[Mapping[str, Any]] = []
    if not isinstance(devices, Mapping):
        return found
    for request in devices.get("requests") or []:
        if not isinstance(request, Mapping):
            continue
        if isinstance(request.get("exactly"), Mapping):
            found.append(request["exactly"])
        found += [s for s in request.get("firstAvailable") or [] if isinstance(s, Mapping)]
    return found


def _names_memory(alternative: Mapping[str, Any], driver: str) -> bool:
    requests = (alternative.get("capacity") or {}).get("requests") or {}
    # Bare or in any domain, as the allocator reads it (dra_driver.allocator.request).
    return any(str(k).rsplit("/", 1)[-1] == names.CAPACITY_MEMORY for k in requests)


def _holds_pruned(value: Any) -> bool:
    """Whether the decoder cut part of `value` (JSON nested too deeply: `kube.PRUNED`)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item == kube.PRUNED:
            return True
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _configs(where: str, path: str, entries: Any, facts: ClusterFacts) -> list[str]:
    problems = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        opaque = (entry or {}).get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != facts.driver:
            continue  # another driver's config is that driver's business
        parameters = opaque.get("parameters")
        if _holds_pruned(parameters):
            problems.append(
                f"{where}: {path}[{i}].opaque.parameters: nested too deeply (JSON deeper than "
                f"{kube.MAX_JSON_DEPTH} levels in the admission request); a VgpuConfig is a "
                "flat object"
            )
            continue
        try:
            config.parse_config(parameters)
        except config.ConfigError as exc:
            problems.append(f"{where}: {path}[{i}].opaque.parameters: {exc}")
    return problems


def _devices(where: str, path: str, devices: Any, facts: ClusterFacts) -> list[str]:
    if not isinstance(devices, Mapping):
        return []
    problems = _configs(where, f"{path}.config", devices.get("config"), facts)
    for i, request in enumerate(devices.get("requests") or []):
        if not isinstance(request, Mapping):
            continue
        alternatives = []
        if isinstance(request.get("exactly"), Mapping):
            alternatives.append((f"{path}.requests[{i}].exactly", request["exactly"]))
        for j, sub in enumerate(request.get("firstAvailable") or []):
            if isinstance(sub, Mapping):
                alternatives.append((f"{path}.requests[{i}].firstAvailable[{j}]", sub))
        for at, alternative in alternatives:
            if alternative.get("deviceClassName") in facts.device_classes:
                problems += _capacity(where, at, alternative, facts)
    return problems


def _capacity(
    where: str, at: str, alternative: Mapping[str, Any], facts: ClusterFacts
) -> list[str]:
    requests = (alternative.get("capacity") or {}).get("requests") or {}
    problems = []
    for key, raw in requests.items():
        short = str(key).removeprefix(f"{facts.driver}/")
        if short not in (names.CAPACITY_MEMORY, names.CAPACITY_CORES):
            continue
        try:
            value = parse_quantity(str(raw))
        except QuantityError:
            continue  # the API server's own validation refuses malformed quantities
        field = f"{at}.capacity.requests[{key}]"
        if short == names.CAPACITY_CORES and value > 100:
            problems.append(f"{where}: {field}={raw}: cores are a percentage of one GPU, 0..100")
        largest = facts.largest_gpu_memory_mib
        if short == names.CAPACITY_MEMORY and largest is not None and value > largest * MIB:
            problems.append(
                f"{where}: {field}={raw}: more memory than any GPU in the cluster has "
                f"(largest: {largest}Mi)"
            )
    return problems


def _pod(where: str, pod: Mapping[str, Any], facts: ClusterFacts) -> list[str]:
    problems = []
    try:
        read_pod_policy(pod)
    except Refusal as exc:
        problems.append(f"{where}: {exc}")
    largest = facts.largest_gpu_memory_mib
    if largest is None:
        return problems
    spec = pod.get("spec") or {}
    for field_name in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(field_name) or []):
            res = (container or {}).get("resources") or {}
            for part in ("limits", "requests"):
                for key in _MEMORY_MIB:
                    raw = (res.get(part) or {}).get(key)
                    if raw is None:
                        continue
                    try:
                        mib = parse_quantity(str(raw))
                    except QuantityError:
                        continue  # the translator refuses it with its own message
                    if mib > largest:
                        problems.append(
                            f"{where}: spec.{field_name}[{index}].resources.{part}[{key}]={raw} "
                            f"MiB: more memory than any GPU in the cluster has (largest: "
                            f"{largest} MiB)"
                        )
    return problems
