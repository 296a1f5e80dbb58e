"""What a pod asks for, parsed once: its claims' requests, constraints and config, and its policies.

Claims and DeviceClasses arrive as API dicts (`resource.k8s.io/v1`); everything is validated here
so the allocator only ever sees well-formed input, and a bad claim fails with a message naming the
claim and field. CEL expressions are compiled here (each text once per process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dra_driver.allocator.cel import CelError, Selector, compile_selector
from dra_driver.allocator.quantity import QuantityError, parse_quantity

JSON = dict[str, Any]
NodePolicy = Literal["binpack", "spread"]
Topology = Literal["none", "numa", "link", "numa-strict", "link-strict"]

ANNOTATION_PREFIX = "vgpu.dra.dev/"
MAX_COUNT = 128  # devices per request (the API's limit on results per claim)
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
                alias = ALIASES.get(key, key)
                written = alias if key not in annotations and alias in annotations else key
                raise RequestError(f"annotation {written}={value!r}: use {choices}")
        return cls(
            node=node,  # type: ignore[arg-type]
            device=device,  # type: ignore[arg-type]
            topology=topology,  # type: ignore[arg-type]
            include_types=_csv(given.get(INCLUDE_TYPE)),
            exclude_types=_csv(given.get(EXCLUDE_TYPE)),
            include_uuids=_csv(given.get(INCLUDE_UUID)),
            exclude_uuids=_csv(given.get(EXCLUDE_UUID)),
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


def _selectors(raw: Sequence[Any] | None, where: str) -> tuple[Selector, ...]:
    out = []
    for i, entry in enumerate(raw or []):
        expression = ((entry or {}).get("cel") or {}).get("expression")
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
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 100:
        return int(text)
    raise RequestError(
        f"{ref}: annotation {MEMORY_PERCENTAGE}={annotations[MEMORY_PERCENTAGE]!r}: "
        "use an integer from 1 to 100 (percent of each GPU's memory)"
    )


def _alternative(
    name: str,
    raw: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    where: str,
    memory_percent: int = 0,
) -> Alternative:
    class_name = raw.get("deviceClassName")
    if not class_name:
        raise RequestError(f"{where}: deviceClassName is required")
    cls = classes.get(str(class_name))
    if cls is None:
        raise RequestError(f"{where}: DeviceClass {class_name!r} does not exist")
    cls_spec = cls.get("spec") or {}
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise RequestError(f"{where}: allocationMode {mode!r}: use ExactCount or All")
    count = int(raw.get("count", 1)) if mode == "ExactCount" else 0
    if mode == "ExactCount" and not 1 <= count <= MAX_COUNT:
        raise RequestError(f"{where}: count {count} not in 1..{MAX_COUNT}")
    capacity = []
    for key, value in ((raw.get("capacity") or {}).get("requests") or {}).items():
        try:
            amount = parse_quantity(str(value))
        except QuantityError as exc:
            raise RequestError(f"{where}: capacity.requests[{key}]: {exc}") from None
        if amount < 0:
            raise RequestError(f"{where}: capacity.requests[{key}] must not be negative")
        capacity.append((str(key), amount))
    own = _selectors(raw.get("selectors"), where)
    return Alternative(
        name=name,
        class_name=str(class_name),
        selectors=_selectors(cls_spec.get("selectors"), f"DeviceClass {class_name}") + own,
        all_devices=mode == "All",
        count=count,
        capacity=tuple(sorted(capacity)),
        tolerations=tuple(dict(t) for t in raw.get("tolerations") or []),
        admin=bool(raw.get("adminAccess")),
        class_config=tuple(dict(c) for c in cls_spec.get("config") or []),
        own_selectors=len(own),
        memory_percent=0 if names_memory(capacity) else memory_percent,
    )


def parse_claim(obj: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> Claim:
    """A ResourceClaim (API dict) and the DeviceClasses by name -> a validated `Claim`."""
    meta = obj.get("metadata") or {}
    ref = f"ResourceClaim {meta.get('namespace', '')}/{meta.get('name', '')}"
    percent = _memory_percentage(meta.get("annotations") or {}, ref)
    devices = (obj.get("spec") or {}).get("devices") or {}
    requests = []
    seen: set[str] = set()
    for i, raw in enumerate(devices.get("requests") or []):
        name = str(raw.get("name") or "")
        where = f"{ref}: requests[{i}] ({name})"
        if not name or name in seen:
            raise RequestError(f"{where}: each request needs a unique name")
        seen.add(name)
        if raw.get("exactly") and raw.get("firstAvailable"):
            raise RequestError(f"{where}: set exactly or firstAvailable, not both")
        if raw.get("exactly"):
            alternatives: tuple[Alternative, ...] = (
                _alternative(name, raw["exactly"], classes, where, percent),
            )
        elif raw.get("firstAvailable"):
            alternatives = tuple(
                _alternative(
                    f"{name}/{sub.get('name')}",
                    sub,
                    classes,
                    f"{where}/{sub.get('name')}",
                    percent,
                )
                for sub in raw["firstAvailable"]
            )
        else:
            raise RequestError(f"{where}: set exactly or firstAvailable")
        requests.append(Request(name, alternatives))
    if not requests:
        raise RequestError(f"{ref}: spec.devices.requests is empty")
    constraints = []
    for i, raw in enumerate(devices.get("constraints") or []):
        match, distinct = raw.get("matchAttribute"), raw.get("distinctAttribute")
        if bool(match) == bool(distinct):
            raise RequestError(
                f"{ref}: constraints[{i}] needs exactly one of matchAttribute/distinctAttribute"
            )
        names = tuple(str(r) for r in raw.get("requests") or [])
        unknown = [n for n in names if n not in seen]
        if unknown:
            raise RequestError(f"{ref}: constraints[{i}] names unknown requests {unknown}")
        attribute = str(match or distinct)
        if "/" not in attribute:
            raise RequestError(f"{ref}: constraints[{i}]: {attribute!r} must be fully qualified")
        constraints.append(Constraint(names, attribute, bool(distinct)))
    return Claim(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        requests=tuple(requests),
        constraints=tuple(constraints),
        config=tuple(dict(c) for c in devices.get("config") or []),
    )
