"""Reading a ResourceClaim's allocation for this driver on this node.

The kubelet hands the plugin only {namespace, name, uid}; everything else comes from the
ResourceClaim object. `fetch_claim` is the one I/O call (through `dra_driver.kube`);
`parse_allocation` is pure: claim dict -> the devices allocated to this driver on this node, with
their consumed capacity and the opaque configs that came with the allocation. Called by
`kubelet_plugin.prepare`; `kubelet_plugin.plan` turns the result into files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dra_driver import kube, names
from dra_driver.allocator import QuantityError, parse_quantity


class ClaimError(ValueError):
    """The claim cannot be prepared; the message tells the user why (returned to the kubelet)."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What the kubelet names in a prepare/unprepare call."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        # The kubelet passes these through from the API, but a hostile or broken caller may not:
        # anything echoed into errors and logs is clipped.
        return f"{clip(self.namespace)}/{clip(self.name)} ({clip(self.uid)})"


# Longer than any valid namespace, name (253) is rare; a UID is 36 characters.
CLIP_CHARS = 64


def clip(text: str, limit: int = CLIP_CHARS) -> str:
    """`text` shortened for errors and logs, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text)} chars)"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One allocation result of this driver: a device (a GPU) for one request."""

    request: str
    pool: str
    device: str
    share_id: str | None = None
    # Admin access (monitoring, KEP-5018): the device is reachable without consuming capacity.
    admin_access: bool = False
    # Consumed capacity in base units (bytes for memory, percent for cores); absent keys were
    # not consumed (memory absent = the whole GPU, cores absent = no cap).
    consumed: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """An opaque config entry of the allocation that is addressed to this driver."""

    source: str  # "FromClass" | "FromClaim"
    requests: tuple[str, ...]  # empty = all requests
    parameters: Any

    def applies_to(self, request: str) -> bool:
        """True when the entry names no request, the request, or (for `req/sub`) its parent."""
        if not self.requests:
            return True
        parent = request.split("/", 1)[0]
        return request in self.requests or parent in self.requests


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    """A claim's allocation as far as this driver on this node is concerned."""

    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...]


def fetch_claim(
    client: kube.KubeClient, ref: ClaimRef, timeout_s: float | None = None
) -> dict[str, Any]:
    """GET the claim; its UID must be the one the kubelet asked for (else it was recreated).

    `timeout_s` bounds the request (the kubelet call's remaining time); no answer in time is a
    ClaimError that says the kubelet will retry.
    """
    claim_path = kube.path(kube.RESOURCE_API, "resourceclaims", ref.name, namespace=ref.namespace)
    try:
        claim = client.get(claim_path, timeout_s=timeout_s)
    except kube.NotFound:
        raise ClaimError(
            f"ResourceClaim {clip(ref.namespace)}/{clip(ref.name)} not found"
        ) from None
    except kube.TooDeep:
        raise ClaimError(
            f"ResourceClaim {ref} is nested too deeply to read (an opaque config hundreds of "
            f"levels deep?); a VgpuConfig is a flat object"
        ) from None
    except kube.Unreachable as exc:
        budget = f" within {timeout_s:.1f} s" if timeout_s is not None else ""
        raise ClaimError(
            f"cannot read ResourceClaim {ref}: the API server did not answer{budget} "
            f"({exc.message}); retryable, the kubelet retries the prepare"
        ) from None
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"ResourceClaim {clip(ref.namespace)}/{clip(ref.name)} has UID {clip(str(uid))}, "
            f"the kubelet asked for {clip(ref.uid)} (the claim was deleted and recreated)"
        )
    return claim


def parse_allocation(
    claim: dict[str, Any], ref: ClaimRef, *, driver: str, node_name: str
) -> ClaimAllocation:
    """Pick this driver's results out of `status.allocation`; reject results for other nodes."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref} is not allocated")
    device_block = allocation.get("devices") or {}
    devices: list[AllocatedDevice] = []
    for result in device_block.get("results") or []:
        if result.get("driver") != driver:
            continue
        pool = str(result.get("pool", ""))
        if pool != node_name:
            raise ClaimError(
                f"ResourceClaim {ref}: device {result.get('device')!r} of request "
                f"{result.get('request')!r} is in pool {pool!r}, but this node's pool is "
                f"{node_name!r}"
            )
        devices.append(_device(result, ref))
    if not devices:
        raise ClaimError(f"ResourceClaim {ref} has no devices allocated by driver {driver!r}")
    configs = tuple(
        OpaqueConfig(
            source=str(entry.get("source", "")),
            requests=tuple(entry.get("requests") or ()),
            parameters=entry["opaque"].get("parameters"),
        )
        for entry in device_block.get("config") or []
        if (entry.get("opaque") or {}).get("driver") == driver
    )
    return ClaimAllocation(ref=ref, devices=tuple(devices), configs=configs)


def _device(result: dict[str, Any], ref: ClaimRef) -> AllocatedDevice:
    consumed: dict[str, int] = {}
    for key, quantity in (result.get("consumedCapacity") or {}).items():
        # Capacity names may be qualified with the driver's domain; only ours matter.
        short = key.rsplit("/", 1)[-1]
        if short not in (names.CAPACITY_MEMORY, names.CAPACITY_CORES):
            continue
        try:
            consumed[short] = parse_quantity(str(quantity))
        except QuantityError as exc:
            raise ClaimError(
                f"ResourceClaim {ref}: consumedCapacity {key}={quantity!r} of device "
                f"{result.get('device')!r}: {exc}"
            ) from None
    share_id = result.get("shareID")
    return AllocatedDevice(
        request=str(result.get("request", "")),
        pool=str(result.get("pool", "")),
        device=str(result.get("device", "")),
        share_id=str(share_id) if share_id else None,
        admin_access=bool(result.get("adminAccess")),
        consumed=consumed,
    )
