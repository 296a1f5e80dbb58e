"""Refuse at the door what would otherwise fail later: the pure checks of the validating webhook.

A malformed VgpuConfig is otherwise discovered by the kubelet plugin at prepare, as a pod stuck in
ContainerCreating; the same parser (`dra_driver.config.parse_config`, one implementation) runs here
when a ResourceClaim, ResourceClaimTemplate or DeviceClass is written. Pods are refused when their
policy annotations contradict each other or name unknown values (the translator's own reader,
`translate.read_pod_policy`), or when they ask for more GPU memory than any GPU in the cluster
has. Each message names the field, the value and the allowed values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.webhook import legacy
from controller.webhook.translate import Refusal, read_pod_policy
from dra_driver import config, names
from dra_driver.allocator import QuantityError, parse_quantity

JSON = dict[str, Any]
MIB = 1 << 20

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
        return _devices(f"ResourceClaim {name}", "spec.devices", spec.get("devices"), facts)
    if kind == "ResourceClaimTemplate":
        devices = (spec.get("spec") or {}).get("devices")
        return _devices(f"ResourceClaimTemplate {name}", "spec.spec.devices", devices, facts)
    if kind == "Pod":
        return _pod(f"Pod {name}", obj, facts)
    return []


def _configs(where: str, path: str, entries: Any, facts: ClusterFacts) -> list[str]:
    problems = []
    for i, entry in enumerate(entries or []):
        opaque = (entry or {}).get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != facts.driver:
            continue  # another driver's config is that driver's business
        try:
            config.parse_config(opaque.get("parameters"))
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
