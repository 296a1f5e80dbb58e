"""What a pod asks for, parsed once: its claims' requests, constraints and config, and its policies.

Claims and DeviceClasses arrive as API dicts (`resource.k8s.io/v1`); everything is validated here
so the allocator only ever sees well-formed input, and a bad claim fails with a message naming the
claim and field. CEL expressions are compiled here (each text once per process).

Every object is hostile input: whatever its shape (a field of the wrong type, a count of 0, a
quantity beyond int64 or beyond the model's range), parsing raises `RequestError` naming the object
and the field, never another exception, so the caller refuses that one pod and goes on.
- `count`: the API defaults an ExactCount request's missing (or 0) count to 1 and refuses a
  negative one at create, so a stored claim always has 1..32; a count of 0 or below reaching us
  (a path that bypassed validation) is refused, never read as "all" or as one whole GPU. Above
  32 (`MAX_COUNT`, the API's limit on devices per claim, which kube-scheduler enforces too) is
  refused: no allocation of it could be written.
- capacity quantities: negative, beyond int64 or above `MAX_MODEL_QUANTITY` (the allocator's
  model bound) are refused with the request and capacity name.
- policy annotations: a list (GPU types, UUIDs) longer than `MAX_POLICY_LIST_BYTES` or with more
  than `MAX_POLICY_ITEMS` items is refused: every candidate device is matched against each item,
  so an unbounded list is a tenant's way to slow every placement down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dra_driver.allocator.cel import CelError, Selector, compile_selector
from dra_driver.allocator.quantity import MAX_MODEL_QUANTITY, parse_quantity

JSON = dict[str, Any]
NodePolicy = Literal["binpack", "spread"]
Topology = Literal["none", "numa", "link", "numa-strict", "link-strict"]

ANNOTATION_PREFIX = "vgpu.dra.dev/"
# Devices per request, and per claim: the API's limit on allocation results per claim
# (resource.k8s.io/v1 AllocationResultsMaxSize = 32; kube-scheduler refuses a claim needing more).
MAX_COUNT = 32
# Bounds of a policy annotation's comma list (GPU types or UUIDs): 10 KiB, the API's limit on a
# CEL selector expression (which the webhook turns these lists into), and 256 items.
MAX_POLICY_LIST_BYTES = 10 * 1024
MAX_POLICY_ITEMS = 256
# A claim annotation: each request naming no memory capacity takes this share of each candidate
# device's memory capacity instead of its default (docs/scheduling.md, "Percentage requests").
MEMORY_PERCENTAGE = ANNOTATION_PREFIX + "memory-percentage"


class RequestError(ValueError):
    """A claim, class or policy that cannot be honoured; the message names the object and field."""


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip().lower() for p in (text or "").split(",") if p.strip())


# The policy annotations, canonical names (issue 10's, which vgpu-manager users know under its
# `nvidia.com/` prefix; the webhook translates that prefix) -> the short names accepted as
# aliases. When a pod sets both, the canonical name wins.
NODE_POLICY = ANNOTATION_PREFIX + "node-scheduler-policy"
DEVICE_POLICY = ANNOTATION_PREFIX + "device-scheduler-policy"
TOPOLOGY = ANNOTATION_PREFIX + "device-topology-mode"
INCLUDE_TYPE = ANNOTATION_PREFIX + "include-gpu-type"
EXCLUDE_TYPE = ANNOTATION_PREFIX + "exclude-gpu-type"
INCLUDE_UUID = ANNOTATION_PREFIX + "include-gpu-uuid"
EXCLUDE_UUID = ANNOTATION_PREFIX + "exclude-gpu-uuid"
ALIASES: dict[str, str] = {
    NODE_POLICY: ANNOTATION_PREFIX + "node-policy",
    DEVICE_POLICY: ANNOTATION_PREFIX + "device-policy",
    TOPOLOGY: ANNOTATION_PREFIX + "topology",
    INCLUDE_TYPE: ANNOTATION_PREFIX + "gpu-type",
    INCLUDE_UUID: ANNOTATION_PREFIX + "gpu-uuid",
}
POLICY_ANNOTATIONS = (
    NODE_POLICY,
    DEVICE_POLICY,
    TOPOLOGY,
    INCLUDE_TYPE,
    EXCLUDE_TYPE,
    INCLUDE_UUID,
    EXCLUDE_UUID,
)


def canonical_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """The policy annotations of `annotations` under their canonical names (an alias only counts
    when its canonical name is absent); other annotations are left out."""
    found = {}
    for name in POLICY_ANNOTATIONS:
        alias = ALIASES.get(name)
        if name in annotations:
            found[name] = annotations[name]
        elif alias is not None and alias in annotations:
            found[name] = annotations[alias]
    return found


def _written(key: str, annotations: Mapping[str, Any]) -> str:
    """The name a policy was given under: the canonical one, or its alias."""
    alias = ALIASES.get(key, key)
    return alias if key not in annotations and alias in annotations else key


def _short(value: Any) -> str:
    """A user's value for a message: repr, cut to 80 characters (annotations may be 256 KiB)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _policy_list(written: str, text: Any) -> tuple[str, ...]:
    """A policy annotation's comma list, bounded (MAX_POLICY_LIST_BYTES, MAX_POLICY_ITEMS)."""
    if text is None:
        return ()
    value = str(text)
    size = len(value.encode())
    if size > MAX_POLICY_LIST_BYTES:
        raise RequestError(
            f"annotation {written}: {size} bytes; a list of GPU types or UUIDs may have at most "
            f"{MAX_POLICY_LIST_BYTES} bytes and {MAX_POLICY_ITEMS} items"
        )
    items = _csv(value)
    if len(items) > MAX_POLICY_ITEMS:
        raise RequestError(
            f"annotation {written}: {len(items)} items; a list of GPU types or UUIDs may have at "
            f"most {MAX_POLICY_ITEMS}"
        )
    return items


_TOPOLOGY_MODES = {"none": 0, "numa": 1, "numa-strict": 1, "link": 2, "link-strict": 2}


@dataclass(frozen=True, slots=True)
class Policy:
    """How to choose among feasible placements (docs/scheduling.md defines each score)."""

    node: NodePolicy = "binpack"
    device: NodePolicy = "spread"
    topology: Topology = "none"
    include_types: tuple[str, ...] = ()  # lower-case substrings of productName
    exclude_types: tuple[str, ...] = ()
    include_uuids: tuple[str, ...] = ()  # lower-case UUIDs
    exclude_uuids: tuple[str, ...] = ()

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> Policy:
        """Read the policy annotations (`POLICY_ANNOTATIONS`, or their `ALIASES`) of a pod."""
        given = canonical_annotations(annotations)
        node = given.get(NODE_POLICY) or "binpack"
        device = given.get(DEVICE_POLICY) or "spread"
        topology = given.get(TOPOLOGY) or "none"
        for key, value, allowed in (
            (NODE_POLICY, node, ("binpack", "spread")),
            (DEVICE_POLICY, device, ("binpack", "spread")),
            (TOPOLOGY, topology, ("none", "numa", "link", "numa-strict", "link-strict")),
        ):
            if value not in allowed:
                choices = ", ".join(allowed)
                raise RequestError(
                    f"annotation {_written(key, annotations)}={_short(value)}: use {choices}"
                )
        lists = {
            key: _policy_list(_written(key, annotations), given.get(key))
            for key in (INCLUDE_TYPE, EXCLUDE_TYPE, INCLUDE_UUID, EXCLUDE_UUID)
        }
        return cls(
            node=node,  # type: ignore[arg-type]
            device=device,  # type: ignore[arg-type]
            topology=topology,  # type: ignore[arg-type]
            include_types=lists[INCLUDE_TYPE],
            exclude_types=lists[EXCLUDE_TYPE],
            include_uuids=lists[INCLUDE_UUID],
            exclude_uuids=lists[EXCLUDE_UUID],
        )

    # Derived once (every decision reads them several times): 0 none, 1 NUMA node, 2 NVLink
    # domain (the kernels' encoding); strict topology; binpack flags for the kernels.
    topology_mode: int = field(init=False, repr=False, compare=False)
    strict: bool = field(init=False, repr=False, compare=False)
    node_binpack: int = field(init=False, repr=False, compare=False)
    device_binpack: int = field(init=False, repr=False, compare=False)
    # Every field above in one string: with the claims' shapes, the key of the allocator's
    # per-decision caches (a string's hash is computed once; the dataclass's __hash__ is a
    # Python call per lookup).
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        derived = (
            ("topology_mode", _TOPOLOGY_MODES[self.topology]),
            ("strict", self.topology.endswith("-strict")),
            ("node_binpack", int(self.node == "binpack")),
            ("device_binpack", int(self.device == "binpack")),
            (
                "key",
                repr(
                    (
                        self.node,
                        self.device,
                        self.topology,
                        self.include_types,
                        self.exclude_types,
                        self.include_uuids,
                        self.exclude_uuids,
                    )
                ),
            ),
        )
        for name, value in derived:
            object.__setattr__(self, name, value)

    def admits(self, product: str, uuid: str) -> bool:
        """Include/exclude by GPU type (case-insensitive substring) and UUID."""
        product, uuid = product.lower(), uuid.lower()
        if self.include_types and not any(t in product for t in self.include_types):
            return False
        if any(t in product for t in self.exclude_types):
            return False
        if self.include_uuids and uuid not in self.include_uuids:
            return False
        return uuid not in self.exclude_uuids


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way to satisfy a request: `exactly`, or one `firstAvailable` subrequest."""

    name: str  # "req" or "req/sub", as it appears in allocation results
    class_name: str
    selectors: tuple[Selector, ...]  # class selectors first, then the request's
    all_devices: bool  # allocationMode All
    count: int
    capacity: tuple[tuple[str, int], ...]  # capacity name as written -> requested amount
    tolerations: tuple[JSON, ...]
    admin: bool
    class_config: tuple[JSON, ...]
    own_selectors: int = 0  # how many of `selectors` the request itself added
    # 1..100: the request takes ceil(pct/100 x memory capacity) of each device that has one
    # (claim annotation MEMORY_PERCENTAGE; only set when the request names no memory); 0: unset.
    memory_percent: int = 0
    # What determines which devices are selectable (the selection cache key); computed once, as
    # every decision looks it up several times.
    signature: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "signature",
            (
                tuple(s.source for s in self.selectors),
                tuple(repr(sorted(t.items())) for t in self.tolerations),
            ),
        )

    @property
    def capacity_key(self) -> tuple[Any, ...]:
        """What the consumption of this alternative on a device depends on (cache keys)."""
        return (self.capacity, self.memory_percent)

    def requested(self, name: str) -> int | None:
        for key, value in self.capacity:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: tuple[str, ...]  # empty: all requests of the claim
    attribute: str  # fully qualified
    distinct: bool  # distinctAttribute (else matchAttribute)


@dataclass(frozen=True, slots=True)
class Claim:
    uid: str
    namespace: str
    name: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]
    config: tuple[JSON, ...]  # the claim's own config entries
    # What decides where the claim can go, without its names: requests (selection, capacity,
    # count, mode, admin) and constraints, as one string (its hash is computed once, and the
    # allocator looks shapes up several times per decision); equal for claims of one template.
    shape: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "shape",
            repr(
                (
                    tuple(
                        (
                            request.name,
                            tuple(
                                (a.signature, a.capacity_key, a.all_devices, a.count, a.admin)
                                for a in request.alternatives
                            ),
                        )
                        for request in self.requests
                    ),
                    self.constraints,
                )
            ),
        )

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _mapping(value: Any, where: str, what: str) -> Mapping[str, Any]:
    """`value` as an object, {} when absent; RequestError for anything else."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(f"{where}: {what} must be an object, not {type(value).__name__}")
    return value


def _list(value: Any, where: str, what: str) -> Sequence[Any]:
    """`value` as a list, [] when absent; RequestError for anything else."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise RequestError(f"{where}: {what} must be a list, not {type(value).__name__}")
    return value


def _selectors(raw: Any, where: str) -> tuple[Selector, ...]:
    out = []
    for i, entry in enumerate(_list(raw, where, "selectors")):
        cel = _mapping(entry, where, f"selectors[{i}]").get("cel")
        expression = _mapping(cel, where, f"selectors[{i}].cel").get("expression")
        if not isinstance(expression, str) or not expression:
            raise RequestError(f"{where}: selectors[{i}] needs cel.expression")
        try:
            out.append(compile_selector(expression))
        except CelError as exc:
            raise RequestError(f"{where}: selectors[{i}]: {exc}") from None
    return tuple(out)


def names_memory(capacity: Sequence[tuple[str, int]]) -> bool:
    """Does a capacity request name the memory capacity (bare, or in any domain)?"""
    return any(key == "memory" or key.endswith("/memory") for key, _ in capacity)


def _memory_percentage(annotations: Mapping[str, Any], ref: str) -> int:
    """The claim's MEMORY_PERCENTAGE annotation as 1..100, 0 when absent."""
    if MEMORY_PERCENTAGE not in annotations:
        return 0
    text = str(annotations[MEMORY_PERCENTAGE]).strip()
    if text.isascii() and text.isdigit() and len(text) <= 3 and 1 <= int(text) <= 100:
        return int(text)
    raise RequestError(
        f"{ref}: annotation {MEMORY_PERCENTAGE}={_short(annotations[MEMORY_PERCENTAGE])}: "
        "use an integer from 1 to 100 (percent of each GPU's memory)"
    )


def _count(raw: Mapping[str, Any], where: str) -> int:
    """An ExactCount request's count: 1..MAX_COUNT. Missing means 1, as the API defaults it
    (it also turns an explicit 0 into 1 before storing); 0 or less can only come from a path
    that bypassed the API's validation and is refused, never read as "all" or a whole GPU."""
    count = raw.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int):
        raise RequestError(f"{where}: count {_short(count)}: an integer from 1 to {MAX_COUNT}")
    if count < 1:
        raise RequestError(
            f"{where}: count {count}: an ExactCount request needs at least 1 device (to ask "
            "for none, leave the request out)"
        )
    if count > MAX_COUNT:
        raise RequestError(
            f"{where}: count {count}: at most {MAX_COUNT} devices per claim (the API's limit "
            "on a claim's allocation results)"
        )
    return count


def _capacity(raw: Mapping[str, Any], where: str) -> list[tuple[str, int]]:
    """The capacity requests as integers in 0..MAX_MODEL_QUANTITY."""
    capacity_field = _mapping(raw.get("capacity"), where, "capacity")
    requests = _mapping(capacity_field.get("requests"), where, "capacity.requests")
    capacity = []
    for key, value in requests.items():
        field_name = f"capacity.requests[{_short(key)}]"
        try:
            amount = parse_quantity(str(value))
        except ValueError as exc:  # QuantityError, or a number too long to convert
            raise RequestError(f"{where}: {field_name}: {str(exc)[:200]}") from None
        if amount < 0:
            raise RequestError(f"{where}: {field_name} must not be negative")
        if amount > MAX_MODEL_QUANTITY:
            raise RequestError(
                f"{where}: {field_name}={_short(value)}: above {MAX_MODEL_QUANTITY}, the largest "
                "quantity the allocator takes (out of range)"
            )
        capacity.append((str(key), amount))
    return capacity


def _alternative(
    name: str,
    given: Any,
    classes: Mapping[str, Mapping[str, Any]],
    where: str,
    memory_percent: int = 0,
) -> Alternative:
    raw = _mapping(given, where, "the request")
    class_name = raw.get("deviceClassName")
    if not class_name or not isinstance(class_name, str):
        raise RequestError(f"{where}: deviceClassName is required")
    cls = classes.get(class_name)
    if cls is None:
        raise RequestError(f"{where}: DeviceClass {_short(class_name)} does not exist")
    cls_spec = _mapping(cls.get("spec"), f"DeviceClass {class_name}", "spec")
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise RequestError(f"{where}: allocationMode {_short(mode)}: use ExactCount or All")
    count = _count(raw, where) if mode == "ExactCount" else 0
    capacity = _capacity(raw, where)
    own = _selectors(raw.get("selectors"), where)
    tolerations = [
        dict(_mapping(t, where, f"tolerations[{i}]"))
        for i, t in enumerate(_list(raw.get("tolerations"), where, "tolerations"))
    ]
    class_where = f"DeviceClass {class_name}"
    class_config = [
        dict(_mapping(c, class_where, f"config[{i}]"))
        for i, c in enumerate(_list(cls_spec.get("config"), class_where, "config"))
    ]
    return Alternative(
        name=name,
        class_name=class_name,
        selectors=_selectors(cls_spec.get("selectors"), class_where) + own,
        all_devices=mode == "All",
        count=count,
        capacity=tuple(sorted(capacity)),
        tolerations=tuple(tolerations),
        admin=bool(raw.get("adminAccess")),
        class_config=tuple(class_config),
        own_selectors=len(own),
        memory_percent=0 if names_memory(capacity) else memory_percent,
    )


def _request(
    i: int,
    given: Any,
    classes: Mapping[str, Mapping[str, Any]],
    ref: str,
    percent: int,
) -> Request:
    raw = _mapping(given, ref, f"requests[{i}]")
    name = raw.get("name")
    where = f"{ref}: requests[{i}] ({_short(name) if not isinstance(name, str) else name})"
    if not name or not isinstance(name, str):
        raise RequestError(f"{where}: each request needs a unique name")
    exactly, first = raw.get("exactly"), raw.get("firstAvailable")
    if exactly and first:
        raise RequestError(f"{where}: set exactly or firstAvailable, not both")
    if exactly:
        return Request(name, (_alternative(name, exactly, classes, where, percent),))
    if not first:
        raise RequestError(f"{where}: set exactly or firstAvailable")
    alternatives = []
    for j, sub in enumerate(_list(first, where, "firstAvailable")):
        sub_name = _mapping(sub, where, f"firstAvailable[{j}]").get("name")
        if not sub_name or not isinstance(sub_name, str):
            raise RequestError(f"{where}: firstAvailable[{j}] needs a name")
        alternatives.append(
            _alternative(f"{name}/{sub_name}", sub, classes, f"{where}/{sub_name}", percent)
        )
    return Request(name, tuple(alternatives))


def _devices_at_least(request: Request) -> int:
    """The fewest devices any way of satisfying `request` takes (All: at least one)."""
    return min(1 if a.all_devices else a.count for a in request.alternatives)


def parse_claim(obj: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> Claim:
    """A ResourceClaim (API dict) and the DeviceClasses by name -> a validated `Claim`;
    RequestError (naming the claim and field) for anything else, whatever the object holds."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    ref = f"ResourceClaim {meta.get('namespace', '')}/{meta.get('name', '')}"
    try:
        return _parse_claim(obj, meta, classes, ref)
    except RequestError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
        # A shape the checks above did not foresee: still this claim's error, not the caller's.
        raise RequestError(f"{ref}: malformed ({type(exc).__name__}: {str(exc)[:200]})") from None


def _parse_claim(
    obj: Mapping[str, Any],
    meta: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    ref: str,
) -> Claim:
    percent = _memory_percentage(_mapping(meta.get("annotations"), ref, "annotations"), ref)
    spec = _mapping(obj.get("spec"), ref, "spec")
    devices = _mapping(spec.get("devices"), ref, "spec.devices")
    requests = []
    seen: set[str] = set()
    for i, raw in enumerate(_list(devices.get("requests"), ref, "spec.devices.requests")):
        request = _request(i, raw, classes, ref, percent)
        if request.name in seen:
            raise RequestError(
                f"{ref}: requests[{i}] ({request.name}): each request needs a unique name"
            )
        seen.add(request.name)
        requests.append(request)
    if not requests:
        raise RequestError(f"{ref}: spec.devices.requests is empty")
    least = sum(_devices_at_least(r) for r in requests)
    if least > MAX_COUNT:
        raise RequestError(
            f"{ref}: its requests need at least {least} devices; at most {MAX_COUNT} per claim "
            "(the API's limit on a claim's allocation results)"
        )
    constraints = []
    for i, entry in enumerate(_list(devices.get("constraints"), ref, "spec.devices.constraints")):
        raw = _mapping(entry, ref, f"constraints[{i}]")
        match, distinct = raw.get("matchAttribute"), raw.get("distinctAttribute")
        if bool(match) == bool(distinct):
            raise RequestError(
                f"{ref}: constraints[{i}] needs exactly one of matchAttribute/distinctAttribute"
            )
        names = tuple(str(r) for r in _list(raw.get("requests"), ref, f"constraints[{i}].requests"))
        unknown = [n for n in names if n not in seen]
        if unknown:
            raise RequestError(f"{ref}: constraints[{i}] names unknown requests {unknown}")
        attribute = str(match or distinct)
        if "/" not in attribute:
            raise RequestError(f"{ref}: constraints[{i}]: {attribute!r} must be fully qualified")
        constraints.append(Constraint(names, attribute, bool(distinct)))
    config = [
        dict(_mapping(c, ref, f"spec.devices.config[{i}]"))
        for i, c in enumerate(_list(devices.get("config"), ref, "spec.devices.config"))
    ]
    return Claim(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        requests=tuple(requests),
        constraints=tuple(constraints),
        config=tuple(config),
    )
