"""Reading a ResourceClaim's allocation for this driver on this node.

The kubelet hands the plugin only {namespace, name, uid}; everything else comes from the
ResourceClaim object. `fetch_claim` is the one I/O call (through `dra_driver.kube`);
`parse_allocation` is pure: claim dict -> the devices allocated to this driver on this node, with
their consumed capacity and the opaque configs that came with the allocation. Called by
`kubelet_plugin.prepare`; `kubelet_plugin.plan` turns the result into files.

A claim is hostile input: whatever it holds, reading it fails that claim alone, with a
`ClaimError` that names the field, never an exception of another kind (which prepare reports as
an internal error). Every level is checked for its type (an object where an object belongs, a
list where a list does), strings and lists are bounded (`MAX_*`: far above what the API server
accepts, so only an object that was not validated by one meets them), quantities must fit in
int64, and an opaque config that the API client cut because it was nested too deeply
(`kube.PRUNED`) is refused as such. Fields this driver does not know are ignored, as new API
fields must be; unknown fields of our own opaque config are refused by `VgpuConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dra_driver import cdi, kube, names
from dra_driver.allocator import QuantityError, parse_quantity

# Bounds on what a claim may hold, far above the API server's own (32 results, 32 config
# entries, 32 requests per entry, names of at most 253 characters, quantities in canonical
# form): they only keep a claim that no API server validated from costing more than a claim.
MAX_RESULTS = 256
MAX_CONFIGS = 256
MAX_CONFIG_REQUESTS = 256
MAX_NAME_CHARS = 253
MAX_QUANTITY_CHARS = 64
# An opaque config is at most 10 KiB in the API; a walk looking for a cut subtree stops here.
MAX_CONFIG_NODES = 100_000


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
    meta = claim.get("metadata") if isinstance(claim, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    if uid != ref.uid:
        raise ClaimError(
            f"ResourceClaim {clip(ref.namespace)}/{clip(ref.name)} has UID {clip(str(uid))}, "
            f"the kubelet asked for {clip(ref.uid)} (the claim was deleted and recreated)"
        )
    return claim


def parse_allocation(
    claim: dict[str, Any], ref: ClaimRef, *, driver: str, node_name: str
) -> ClaimAllocation:
    """Pick this driver's results out of `status.allocation`; reject results for other nodes.

    ClaimError for anything that cannot be read (module docstring), naming the field.
    """
    if not isinstance(claim, dict):
        raise ClaimError(f"ResourceClaim {ref} is not an object but {_kind(claim)}")
    status = _object(claim.get("status"), "status", ref)
    if not status.get("allocation"):
        raise ClaimError(f"ResourceClaim {ref} is not allocated")
    allocation = _object(status["allocation"], "status.allocation", ref)
    where = "status.allocation.devices"
    device_block = _object(allocation.get("devices"), where, ref)
    devices: list[AllocatedDevice] = []
    results = _list(device_block.get("results"), f"{where}.results", ref, MAX_RESULTS)
    for position, item in enumerate(results):
        result = _object(item, f"{where}.results[{position}]", ref)
        if result.get("driver") != driver:
            continue
        devices.append(_device(result, f"{where}.results[{position}]", ref, node_name))
    if not devices:
        raise ClaimError(f"ResourceClaim {ref} has no devices allocated by driver {driver!r}")
    configs = []
    entries = _list(device_block.get("config"), f"{where}.config", ref, MAX_CONFIGS)
    for position, item in enumerate(entries):
        field_name = f"{where}.config[{position}]"
        entry = _object(item, field_name, ref)
        opaque = _object(entry.get("opaque"), f"{field_name}.opaque", ref)
        if opaque.get("driver") != driver:
            continue
        requests = _list(entry.get("requests"), f"{field_name}.requests", ref, MAX_CONFIG_REQUESTS)
        parameters = opaque.get("parameters")
        if _holds_pruned(parameters):
            raise ClaimError(
                f"ResourceClaim {ref}: {field_name}.opaque.parameters is nested deeper than "
                f"{kube.MAX_JSON_DEPTH} levels and could not be read (a "
                f"{names.CONFIG_KIND} is a flat object of scalars)"
            )
        configs.append(
            OpaqueConfig(
                source=_text(entry.get("source"), f"{field_name}.source", ref),
                requests=tuple(
                    _text(name, f"{field_name}.requests[{index}]", ref)
                    for index, name in enumerate(requests)
                ),
                parameters=parameters,
            )
        )
    return ClaimAllocation(ref=ref, devices=tuple(devices), configs=tuple(configs))


def _device(result: dict[str, Any], where: str, ref: ClaimRef, node_name: str) -> AllocatedDevice:
    device = _text(result.get("device"), f"{where}.device", ref)
    request = _text(result.get("request"), f"{where}.request", ref)
    pool = _text(result.get("pool"), f"{where}.pool", ref)
    if pool != node_name:
        raise ClaimError(
            f"ResourceClaim {ref}: device {device!r} of request {request!r} is in pool "
            f"{pool!r}, but this node's pool is {node_name!r}"
        )
    consumed: dict[str, int] = {}
    capacities = _object(result.get("consumedCapacity"), f"{where}.consumedCapacity", ref)
    for key, quantity in capacities.items():
        # Capacity names may be qualified with the driver's domain; only ours matter.
        short = key.rsplit("/", 1)[-1]
        if short not in (names.CAPACITY_MEMORY, names.CAPACITY_CORES):
            continue
        consumed[short] = _quantity(quantity, f"consumedCapacity {clip(key)}", device, ref)
    share_id = _text(result.get("shareID"), f"{where}.shareID", ref)
    if share_id and not cdi.valid_claim_uid(share_id):  # it names a CDI device
        raise ClaimError(
            f"ResourceClaim {ref}: {where}.shareID {clip(share_id)!r} is not a UID (letters, "
            f"digits and '-')"
        )
    admin = result.get("adminAccess")
    if admin is not None and not isinstance(admin, bool):
        raise ClaimError(
            f"ResourceClaim {ref}: {where}.adminAccess must be true or false, got {_kind(admin)}"
        )
    return AllocatedDevice(
        request=request,
        pool=pool,
        device=device,
        share_id=share_id or None,
        admin_access=bool(admin),
        consumed=consumed,
    )


def _quantity(value: Any, what: str, device: str, ref: ClaimRef) -> int:
    """A quantity (a string, or a JSON integer) that fits in int64."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ClaimError(
            f"ResourceClaim {ref}: {what} of device {device!r} must be a quantity, got "
            f"{_kind(value)}"
        )
    text = str(value)
    if len(text) > MAX_QUANTITY_CHARS:
        raise ClaimError(
            f"ResourceClaim {ref}: {what} of device {device!r} is {len(text)} characters long, "
            f"not a quantity (at most {MAX_QUANTITY_CHARS})"
        )
    try:
        return parse_quantity(text)
    except QuantityError as exc:
        raise ClaimError(
            f"ResourceClaim {ref}: {what}={text!r} of device {device!r}: {exc}"
        ) from None


def _object(value: Any, what: str, ref: ClaimRef) -> dict[str, Any]:
    """`value` as a JSON object (absent: empty); ClaimError naming `what` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ClaimError(f"ResourceClaim {ref}: {what} must be an object, got {_kind(value)}")
    return value


def _list(value: Any, what: str, ref: ClaimRef, limit: int) -> list[Any]:
    """`value` as a JSON array of at most `limit` items (absent: empty)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ClaimError(f"ResourceClaim {ref}: {what} must be a list, got {_kind(value)}")
    if len(value) > limit:
        raise ClaimError(
            f"ResourceClaim {ref}: {what} has {len(value)} entries, more than the {limit} this "
            f"driver reads"
        )
    return value


def _text(value: Any, what: str, ref: ClaimRef) -> str:
    """`value` as a string of at most MAX_NAME_CHARS characters (absent: empty)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ClaimError(f"ResourceClaim {ref}: {what} must be a string, got {_kind(value)}")
    if len(value) > MAX_NAME_CHARS:
        raise ClaimError(
            f"ResourceClaim {ref}: {what} is {len(value)} characters long, more than the "
            f"{MAX_NAME_CHARS} a name may have ({clip(value)!r})"
        )
    return value


def _kind(value: Any) -> str:
    """What a value of the wrong type is, for an error message (never the value itself)."""
    if value == kube.PRUNED:
        return f"a subtree nested deeper than {kube.MAX_JSON_DEPTH} levels (cut when read)"
    if isinstance(value, str):
        return f"the string {clip(value)!r}"
    return {dict: "an object", list: "a list", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _holds_pruned(value: Any) -> bool:
    """True when `value` is or holds kube.PRUNED (iterative, bounded: MAX_CONFIG_NODES)."""
    stack = [value]
    seen = 0
    while stack and seen < MAX_CONFIG_NODES:
        item = stack.pop()
        seen += 1
        if item == kube.PRUNED:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
