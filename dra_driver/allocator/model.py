"""The cluster as the allocator sees it, kept current by watch events, never rebuilt per decision.

Inputs are plain dicts as the API serves them (what `dra_driver.kube` returns): ResourceSlices,
Nodes, Pods and ResourceClaims, each applied with `apply(kind, obj)` / `delete(kind, obj)`.

- Devices come only from the highest generation of each pool, and only once that generation is
  complete (all `resourceSliceCount` slices seen), as the API asks consumers to do. Only
  node-local slices (`spec.nodeName`) are modelled.
- Consumption comes from every allocated claim whoever allocated it (`status.allocation`), keyed by
  claim uid, so an update replaces and a delete releases; the allocator's own decisions enter the
  same way (`assume`), and the claim's real update later replaces them.
- Per node: labels, taints, unschedulable, allocatable cpu/memory and what bound pods request.
- DeviceTaintRules (`resource.k8s.io/v1`, an admin's taint on devices picked by driver, pool and
  device name): a device matched by a rule carries the rule's taint beside its slice's own, as
  kube-scheduler sees it; a rule's change republishes the pools it touches (in place, below).

The flat arrays the kernels read (one row per device, devices grouped by node, nodes in name
order) are derived lazily: a slice that republishes the same devices on the same nodes rewrites
their rows in place; any other slice or node change marks the layout stale and the next decision
rebuilds it once; a claim or bound-pod change only adjusts the affected rows. In-place changes
stamp their node (`Layout.node_seq`) so the allocator rescans only those nodes.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from dra_driver import names
from dra_driver.allocator.cel import DEVICE_FIELDS, device_view
from dra_driver.allocator.quantity import (
    MAX_MODEL_QUANTITY,
    SATURATED,
    QuantityError,
    RequestPolicy,
    round_request,
)
from dra_driver.allocator.quantity import parse_quantity as _parse_quantity

log = logging.getLogger(__name__)

JSON = dict[str, Any]
KINDS = ("ResourceSlice", "Node", "Pod", "ResourceClaim", "DeviceTaintRule")


@functools.lru_cache(maxsize=4096)
def parse_quantity(text: str, scale: int = 0) -> int:
    """A quantity as the model takes it: 0..MAX_MODEL_QUANTITY, else QuantityError (the object
    that carries it is refused with that reason; see quantity.MAX_MODEL_QUANTITY for why).

    Cached: slices repeat the same few quantity strings ("1Mi", "100", each GPU model's memory)
    thousands of times.
    """
    value = _parse_quantity(text, scale)
    if not 0 <= value <= MAX_MODEL_QUANTITY:
        raise QuantityError(
            f"quantity {text!r} is outside 0..2^48 (the allocator's bound for any capacity, "
            "request or policy value)"
        )
    return value


DeviceKey = tuple[str, str, str]  # (driver, pool, device)
# Columns of `Layout.dev`, the search kernel's per-device matrix (_scan.pyx has the same enum).
DEV_MULTI, DEV_ALLOCATED, DEV_HELD, DEV_NUMA, DEV_LINK, DEV_LINK_SIZE, DEV_MEM, DEV_CORES = range(8)
DEV_FIELDS = 8


class ModelError(ValueError):
    """An object that cannot be modelled (names the object and the field)."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """One consumable capacity of a device: its value and request policy, as integers."""

    value: int
    policy: RequestPolicy | None  # None: no requestPolicy (the request is taken as is)


def _int_policy(raw: Mapping[str, Any] | None) -> RequestPolicy | None:
    if not raw:
        return None
    valid_range = raw.get("validRange") or {}

    def text(value: Any) -> str | None:
        return None if value is None else str(value)

    return _policy(
        text(raw.get("default")),
        tuple(str(v) for v in raw.get("validValues") or []),
        text(valid_range.get("min")),
        text(valid_range.get("max")),
        text(valid_range.get("step")),
    )


@functools.lru_cache(maxsize=1024)
def _policy(
    default: str | None,
    valid_values: tuple[str, ...],
    min_value: str | None,
    max_value: str | None,
    step: str | None,
) -> RequestPolicy:
    """One RequestPolicy per distinct text (every GPU of a model publishes the same one)."""

    def q(value: str | None) -> int | None:
        return None if value is None else parse_quantity(value)

    return RequestPolicy(
        default=q(default),
        valid_values=tuple(sorted(parse_quantity(v) for v in valid_values)),
        min_value=q(min_value),
        max_value=q(max_value),
        step=q(step),
    )


CEL_FIELDS = frozenset(DEVICE_FIELDS)
ATTRIBUTE_KINDS = ("int", "bool", "string", "version")  # first one present wins, as in the API


@functools.lru_cache(maxsize=8192)
def _interned(value: Any) -> Any:
    return value


def _shared(value: Any) -> Any:
    """One object for equal immutable values (qualified names, attribute values, capacity
    tables): 40,000 devices publish the same few hundred of them. Bounded, so values seen once
    (UUIDs, bus IDs) pass through without being kept."""
    try:
        return _interned(value)
    except TypeError:  # unhashable (a malformed attribute value): kept as is
        return value


@functools.lru_cache(maxsize=1024)
def _capacity_table(items: tuple[tuple[str, Capacity], ...]) -> Mapping[str, Capacity]:
    """One read-only capacity mapping per distinct table (every GPU of a model has the same)."""
    return MappingProxyType(dict(items))


@functools.lru_cache(maxsize=1024)
def _attribute_index(names: tuple[str, ...]) -> Mapping[str, int]:
    """Qualified attribute name -> position in a device's values, one per distinct name list."""
    return MappingProxyType({name: i for i, name in enumerate(names)})


@dataclass(slots=True)
class Device:
    """One published device with everything selection and fitting need, parsed once.

    Compact on purpose (a model holds 40,000 of these at 5,000 nodes x 8 GPUs; 35 MiB instead
    of 187 MiB with per-device dicts): attribute values are a tuple of (kind, value) pairs
    behind one shared name -> position index per distinct name list; equal names, values and
    capacity tables are one shared object; the CEL `device` variable is built when an
    expression needs it (results are cached per device generation, so rarely) instead of being
    kept per device.
    """

    key: DeviceKey
    node: str
    allow_multiple: bool
    attribute_index: Mapping[str, int]  # qualified name -> position in attribute_values (shared)
    attribute_values: tuple[tuple[str, Any], ...]  # (kind, value as published)
    capacity: Mapping[str, Capacity]  # qualified name ("<domain>/<name>"); shared, read-only
    capacity_text: tuple[tuple[str, str], ...]  # qualified name -> value as published (for CEL)
    taints: tuple[JSON, ...]
    generation: int  # bumped whenever this device is (re)published: keys the CEL cache
    numa: int = -1
    link: int = -1
    product: str = ""
    uuid: str = ""

    def attribute(self, qualified: str) -> Any:
        """(kind, value) of a fully qualified attribute, or None."""
        i = self.attribute_index.get(qualified)
        return None if i is None else self.attribute_values[i]

    @property
    def attributes(self) -> dict[str, tuple[str, Any]]:
        """Qualified name -> (kind, value), for every attribute of a known type."""
        return dict(zip(self.attribute_index, self.attribute_values, strict=True))

    @property
    def view(self) -> JSON:
        """The CEL `device` variable (built on each call: callers cache what they evaluate)."""
        return self.cel_view(CEL_FIELDS)

    def cel_view(self, fields: frozenset[str]) -> JSON:
        """The CEL `device` variable with only `fields` filled (attributes and capacity are the
        costly part; an expression that cannot read them gets empty maps, same result)."""
        return device_view(
            self.key[0],
            {name: {kind: value} for name, (kind, value) in self.attributes.items()}
            if "attributes" in fields
            else {},
            {name: {"value": text} for name, text in self.capacity_text}
            if "capacity" in fields
            else {},
            self.allow_multiple,
        )


def percent_of(percent: int, capacity: int) -> int:
    """ceil(percent / 100 x capacity), in integers (what a percentage request asks for)."""
    return -(-percent * capacity // 100)


def requested_amounts(
    requests: tuple[tuple[str, int], ...], device: Device, memory_percent: int = 0
) -> dict[str, int] | None:
    """Capacity requests keyed by qualified name (bare names are the device driver's); None when
    the device lacks a requested capacity (it cannot serve the request). With `memory_percent`
    (the request names no memory), a device with a memory capacity is asked for that share of it."""
    driver = device.key[0]
    out: dict[str, int] = {}
    for name, value in requests:
        qualified = name if "/" in name else f"{driver}/{name}"
        if qualified not in device.capacity:
            return None
        out[qualified] = value
    if memory_percent:
        memory = device.capacity.get(f"{driver}/{names.CAPACITY_MEMORY}")
        if memory is not None:
            out[f"{driver}/{names.CAPACITY_MEMORY}"] = percent_of(memory_percent, memory.value)
    return out


def consumption(
    requests: tuple[tuple[str, int], ...], device: Device, memory_percent: int = 0
) -> tuple[tuple[str, int], ...] | None:
    """What a request consumes of a multi-allocatable device, per capacity, under its request
    policies (sorted by name); None when the device lacks a capacity or a policy refuses."""
    requested = requested_amounts(requests, device, memory_percent)
    if requested is None:
        return None
    out = []
    for name, cap in device.capacity.items():
        want = requested.get(name)
        amount: int | None
        if cap.policy is not None:
            amount = round_request(want, cap.policy, cap.value)
        else:
            amount = want if want is not None else cap.value
        if amount is None:
            return None
        out.append((name, amount))
    return tuple(sorted(out))


@dataclass(slots=True)
class _Slice:
    """What the model keeps of one ResourceSlice: its pool position and parsed devices."""

    driver: str
    pool: str
    generation: int
    count: int  # resourceSliceCount
    devices: list[Device]


@dataclass(slots=True)
class NodeInfo:
    name: str
    labels: dict[str, str]
    taints: list[JSON]
    unschedulable: bool
    cpu_milli: int  # allocatable
    memory: int  # allocatable bytes
    generation: int = 0


@dataclass(frozen=True, slots=True)
class TaintRule:
    """What the model keeps of one DeviceTaintRule: its selector (None = field not set, any
    value matches) and its taint as the API serves it."""

    driver: str | None
    pool: str | None
    device: str | None
    taint: JSON

    def matches_pool(self, driver: str, pool: str) -> bool:
        return self.driver in (None, driver) and self.pool in (None, pool)

    def matches(self, key: DeviceKey) -> bool:
        return self.matches_pool(key[0], key[1]) and self.device in (None, key[2])


def taint_rule(obj: Mapping[str, Any]) -> TaintRule | None:
    """The rule of a DeviceTaintRule object; None when it selects nothing (no deviceSelector,
    as the API defines it) or carries no taint key."""
    spec = obj.get("spec") or {}
    selector = spec.get("deviceSelector")
    taint = spec.get("taint") or {}
    if not isinstance(selector, Mapping) or not isinstance(taint, Mapping) or not taint.get("key"):
        return None

    def field_of(name: str) -> str | None:
        value = selector.get(name)
        return None if value is None else str(value)

    return TaintRule(field_of("driver"), field_of("pool"), field_of("device"), dict(taint))


class Consumption(NamedTuple):
    """What one allocation result takes of one device (capacity qualified name -> amount)."""

    device: DeviceKey
    amounts: tuple[tuple[str, int], ...]
    exclusive: bool  # a device without allowMultipleAllocations (or admin access: False)


@dataclass(slots=True)
class Layout:
    """Flat arrays over devices (grouped by node; nodes in name order), for the fitting kernel."""

    nodes: list[str]
    devices: list[Device]
    node_start: npt.NDArray[np.int64]
    node_end: npt.NDArray[np.int64]
    dev_node: npt.NDArray[np.int64]
    mem_total: npt.NDArray[np.int64]
    cores_total: npt.NDArray[np.int64]
    mem_default: npt.NDArray[np.int64]  # what a request naming no memory consumes
    cores_default: npt.NDArray[np.int64]
    mem_used: npt.NDArray[np.int64]
    cores_used: npt.NDArray[np.int64]
    busy: npt.NDArray[np.int64]  # 1 when the device can take no further allocation
    numa: npt.NDArray[np.int64]
    link: npt.NDArray[np.int64]
    link_size: npt.NDArray[np.int64]  # devices of this node in the same NVLink domain
    node_mem_total: npt.NDArray[np.int64]  # per node: sums of its devices' columns above
    node_cores_total: npt.NDArray[np.int64]
    node_mem_used: npt.NDArray[np.int64]  # kept current with mem_used
    node_cores_used: npt.NDArray[np.int64]
    node_seq: npt.NDArray[np.int64]  # per node: model.change_seq of its last change
    row_seq: npt.NDArray[np.int64]  # per device: model.change_seq of its last republication
    cpu_free: npt.NDArray[np.int64]  # per node: allocatable cpu millis minus bound pods
    mem_free: npt.NDArray[np.int64]  # per node: allocatable memory minus bound pods
    # For the exact search (_scan.search): every capacity name any device publishes gets a
    # column; cap is -1 where a device lacks it. `dev` holds the DEV_* columns per device.
    dims: dict[str, int]
    cap: npt.NDArray[np.int64]  # [devices, dims]
    used_by_dim: npt.NDArray[np.int64]  # [devices, dims], kept current like mem_used
    dev: npt.NDArray[np.int64]  # [devices, DEV_FIELDS]
    index: dict[DeviceKey, int] = field(default_factory=dict)
    node_index: dict[str, int] = field(default_factory=dict)
    epoch: int = 0
    patch_seq: int = 0  # change_seq of the last in-place republication (row_seq)


class DeviceUsage(dict[str, int]):
    """One device's consumption (capacity name -> amount; a name stays at 0 once released)
    with its `allocations` (results on the device) and `exclusive` (of those, the ones that
    hold it whole) counts."""

    __slots__ = ("allocations", "exclusive")

    def __init__(self) -> None:
        super().__init__()
        self.allocations = 0
        self.exclusive = 0


_NO_USAGE = DeviceUsage()  # what an unconsumed device reads as (never written)


def default_consumption(capacity: Capacity | None) -> int:
    """What a request that names this capacity not at all consumes (0 when absent)."""
    if capacity is None:
        return 0
    if capacity.policy is None:
        return capacity.value
    amount = round_request(None, capacity.policy, capacity.value)
    return capacity.value if amount is None else amount


def _held(amount: int) -> int:
    """A device's used amount as the layout holds it: at most one past any capacity, so "full"
    stays full and node sums stay in int64 (quantity.MAX_MODEL_QUANTITY)."""
    return min(amount, MAX_MODEL_QUANTITY + 1)


def _free(total: int, used: int) -> int:
    """A node's free cpu or memory for the layout, kept inside int64."""
    return max(total - used, -SATURATED)


def _consumed(claim_uid: str, name: str, text: Any) -> int:
    """One consumedCapacity amount of an allocation. Only schedulers write allocations, so an
    amount out of range is a foreign allocator's fault: counted as full, never as free."""
    try:
        return parse_quantity(str(text))
    except QuantityError as exc:
        log.warning(
            "ResourceClaim %s: consumedCapacity %s: %s; counted as full", claim_uid, name, exc
        )
        return MAX_MODEL_QUANTITY + 1


def _qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _cpu_milli(text: Any) -> int:
    return parse_quantity(str(text), 3) if text is not None else 0


def _bytes(text: Any) -> int:
    return parse_quantity(str(text)) if text is not None else 0


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(cpu millis, memory bytes) a pod requests: containers summed, >= each init container."""
    spec = pod.get("spec") or {}

    def of(container: Mapping[str, Any]) -> tuple[int, int]:
        requests = (container.get("resources") or {}).get("requests") or {}
        try:
            return _cpu_milli(requests.get("cpu")), _bytes(requests.get("memory"))
        except QuantityError as exc:
            raise QuantityError(f"container {container.get('name')!r}: requests: {exc}") from None

    cpu = mem = 0
    for container in spec.get("containers") or []:
        c, m = of(container)
        cpu, mem = cpu + c, mem + m
    for container in spec.get("initContainers") or []:
        c, m = of(container)
        cpu, mem = max(cpu, c), max(mem, m)
    return min(cpu, MAX_MODEL_QUANTITY), min(mem, MAX_MODEL_QUANTITY)


class ClusterModel:
    """Devices, nodes, bound pods and allocated claims; see the module docstring."""

    def __init__(self) -> None:
        self._slices: dict[str, _Slice] = {}
        self._pools: dict[tuple[str, str], set[str]] = {}  # pool -> names of its slices
        self._pool_devices: dict[tuple[str, str], list[Device]] = {}
        self.devices: dict[DeviceKey, Device] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self._pods: dict[str, tuple[str, int, int]] = {}  # uid -> (node, cpu, mem)
        self.node_cpu_used: dict[str, int] = {}
        self.node_mem_used: dict[str, int] = {}
        self._claims: dict[str, list[Consumption]] = {}
        self.rules: dict[str, TaintRule] = {}  # DeviceTaintRule name -> what it taints
        # Per device ever consumed: capacity name -> amount, and the allocation counts
        self.used: dict[DeviceKey, DeviceUsage] = {}
        self._generation = itertools.count(1)
        self._layout: Layout | None = None
        self.layout_epoch = 0  # bumped on every layout rebuild (the allocator's caches key on it)
        self.change_seq = 0  # bumped on every change of a laid-out node (Layout.node_seq)

    # ------------------------------------------------------------ events

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """An add or update event of one object."""
        if kind == "ResourceSlice":
            self._apply_slice(obj)
        elif kind == "Node":
            self._apply_node(obj)
        elif kind == "Pod":
            self._apply_pod(obj)
        elif kind == "ResourceClaim":
            self._apply_claim(obj)
        elif kind == "DeviceTaintRule":
            name = str((obj.get("metadata") or {}).get("name"))
            self._set_rule(name, taint_rule(obj))
        else:
            raise ModelError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")

    def delete(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A delete event of one object (only its identity is read)."""
        meta = obj.get("metadata") or {}
        if kind == "ResourceSlice":
            name = str(meta.get("name"))
            old = self._slices.pop(name, None)
            if old is not None:
                self._pools[(old.driver, old.pool)].discard(name)
                self._rebuild_pool(old.driver, old.pool)
        elif kind == "Node":
            if self.nodes.pop(str(meta.get("name")), None) is not None:
                self._layout = None
        elif kind == "Pod":
            self._unbind_pod(str(meta.get("uid")))
        elif kind == "ResourceClaim":
            self._set_claim(str(meta.get("uid")), [])
        elif kind == "DeviceTaintRule":
            self._set_rule(str(meta.get("name")), None)
        else:
            raise ModelError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")

    def _apply_slice(self, obj: Mapping[str, Any]) -> None:
        spec = obj.get("spec") or {}
        name = str((obj.get("metadata") or {}).get("name"))
        pool = spec.get("pool") or {}
        if not spec.get("driver") or not pool.get("name"):
            raise ModelError(f"ResourceSlice {name}: spec.driver and spec.pool.name are required")
        driver, pool_name, node = str(spec["driver"]), str(pool["name"]), spec.get("nodeName")
        # Parsed before anything is stored: a bad slice changes nothing. Network-attached slices
        # (no nodeName) are kept for the pool's completeness count but carry no devices.
        devices = (
            [self._device(driver, pool_name, str(node), raw) for raw in spec.get("devices") or []]
            if node
            else []
        )
        entry = _Slice(
            driver,
            pool_name,
            int(pool.get("generation", 0)),
            int(pool.get("resourceSliceCount", 1)),
            devices,
        )
        old = self._slices.get(name)
        if old is not None:
            self._pools[(old.driver, old.pool)].discard(name)
        self._slices[name] = entry
        self._pools.setdefault((driver, pool_name), set()).add(name)
        self._rebuild_pool(driver, pool_name)
        if old is not None and (old.driver, old.pool) != (driver, pool_name):
            self._rebuild_pool(old.driver, old.pool)

    def _set_rule(self, name: str, rule: TaintRule | None) -> None:
        """Take a DeviceTaintRule's new state (None: gone or selecting nothing) and republish
        every pool its old or new selector touches."""
        old = self.rules.pop(name, None)
        if rule is not None:
            self.rules[name] = rule
        if old == rule:
            return
        touched = [r for r in (old, rule) if r is not None]
        for driver, pool in list(self._pools):
            if any(r.matches_pool(driver, pool) for r in touched):
                self._rebuild_pool(driver, pool)

    def _ruled(self, device: Device) -> Device:
        """The device with the taints of every rule that matches it added to its slice's own
        (the order of rule names, so a rebuild gives the same tuple)."""
        extra = tuple(
            rule.taint for _, rule in sorted(self.rules.items()) if rule.matches(device.key)
        )
        return replace(device, taints=device.taints + extra) if extra else device

    def _rebuild_pool(self, driver: str, pool: str) -> None:
        """Recompute one pool's devices: highest generation, complete, node-local slices only."""
        names = self._pools.get((driver, pool), set())
        mine = [self._slices[n] for n in names]
        previous = self._pool_devices.pop((driver, pool), [])
        for device in previous:
            self.devices.pop(device.key, None)
        devices: list[Device] = []
        if mine:
            top = max(s.generation for s in mine)
            current = [s for s in mine if s.generation == top]
            if len(current) >= max(s.count for s in current):
                for entry in current:
                    devices += entry.devices
        else:
            self._pools.pop((driver, pool), None)
        if self.rules:
            devices = [self._ruled(d) for d in devices]
        for device in devices:
            self.devices[device.key] = device
        if devices:
            self._pool_devices[(driver, pool)] = devices
        if not self._patch_layout(previous, devices):
            self._layout = None

    def _patch_layout(self, previous: list[Device], devices: list[Device]) -> bool:
        """Republished devices with the same names on the same nodes (a new generation, changed
        taints, attributes or capacity values): rewrite their rows in place instead of a full
        rebuild, stamping the rows (`row_seq`) and their node (`node_seq`) so the allocator
        refreshes what it derived from them. False when the layout must be rebuilt."""
        layout = self._layout
        if layout is None or not devices:
            return False
        if sorted((d.key, d.node) for d in previous) != sorted((d.key, d.node) for d in devices):
            return False
        rows = [layout.index[d.key] for d in devices]
        if any(name not in layout.dims for d in devices for name in d.capacity):
            return False  # a new capacity name: the matrix needs a new column
        self.change_seq += 1
        nodes = set()
        for row, d in zip(rows, devices, strict=True):
            driver = d.key[0]
            mem = d.capacity.get(f"{driver}/{names.CAPACITY_MEMORY}")
            cores = d.capacity.get(f"{driver}/{names.CAPACITY_CORES}")
            layout.devices[row] = d
            layout.mem_total[row] = mem.value if mem else 0
            layout.cores_total[row] = cores.value if cores else 0
            layout.mem_default[row] = default_consumption(mem)
            layout.cores_default[row] = default_consumption(cores)
            layout.busy[row] = int(self.is_held(d.key))
            layout.numa[row] = d.numa
            layout.link[row] = d.link
            layout.cap[row] = -1
            for name, capacity in d.capacity.items():
                layout.cap[row, layout.dims[name]] = capacity.value
            layout.dev[row, DEV_MULTI] = int(d.allow_multiple)
            layout.dev[row, DEV_HELD] = layout.busy[row]
            layout.dev[row, DEV_NUMA] = d.numa
            layout.dev[row, DEV_LINK] = d.link
            layout.row_seq[row] = self.change_seq
            nodes.add(int(layout.dev_node[row]))
        for node in nodes:
            s, e = int(layout.node_start[node]), int(layout.node_end[node])
            members = layout.devices[s:e]
            for row in range(s, e):
                link = layout.devices[row].link
                size = sum(1 for o in members if o.link == link) if link >= 0 else 0
                layout.link_size[row] = size
                layout.dev[row, DEV_LINK_SIZE] = size
            layout.node_mem_total[node] = int(layout.mem_total[s:e].sum())
            layout.node_cores_total[node] = int(layout.cores_total[s:e].sum())
            layout.node_seq[node] = self.change_seq
        layout.patch_seq = self.change_seq
        return True

    def _device(self, driver: str, pool: str, node: str, raw: Mapping[str, Any]) -> Device:
        key = (driver, pool, str(raw.get("name")))
        attributes: dict[str, tuple[str, Any]] = {}
        for name, typed in (raw.get("attributes") or {}).items():
            for kind in ATTRIBUTE_KINDS:
                if kind in typed:
                    attributes[_shared(_qualify(name, driver))] = _shared((kind, typed[kind]))
                    break  # a type this version does not know stays invisible, as in the API
        raw_capacity = raw.get("capacity") or {}
        try:
            capacity = _capacity_table(
                tuple(
                    (
                        _shared(_qualify(k, driver)),
                        Capacity(
                            parse_quantity(str(v.get("value", "0"))),
                            _int_policy(v.get("requestPolicy")),
                        ),
                    )
                    for k, v in raw_capacity.items()
                )
            )
        except QuantityError as exc:
            raise ModelError(f"ResourceSlice pool {pool}, device {key[2]}: {exc}") from None
        capacity_text = _shared(
            tuple(
                (_shared(_qualify(k, driver)), str(v.get("value", "0")))
                for k, v in raw_capacity.items()
            )
        )
        numa = attributes.get(f"{driver}/numaNode")
        link = attributes.get(f"{driver}/nvlinkDomain")
        product = attributes.get(f"{driver}/productName")
        uuid = attributes.get(f"{driver}/uuid")
        return Device(
            key=key,
            node=node,
            allow_multiple=bool(raw.get("allowMultipleAllocations")),
            attribute_index=_attribute_index(tuple(attributes)),
            attribute_values=tuple(attributes.values()),
            capacity=capacity,
            capacity_text=capacity_text,
            taints=tuple(raw.get("taints") or ()),
            generation=next(self._generation),
            numa=int(numa[1]) if numa is not None and numa[0] == "int" else -1,
            link=int(link[1]) if link is not None and link[0] == "int" else -1,
            product=str(product[1]) if product is not None and product[0] == "string" else "",
            uuid=str(uuid[1]) if uuid is not None and uuid[0] == "string" else "",
        )

    def _apply_node(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        allocatable = (obj.get("status") or {}).get("allocatable") or {}
        try:
            info = NodeInfo(
                name=str(meta.get("name")),
                labels=dict(meta.get("labels") or {}),
                taints=list(spec.get("taints") or []),
                unschedulable=bool(spec.get("unschedulable")),
                cpu_milli=_cpu_milli(allocatable.get("cpu", "0")),
                memory=_bytes(allocatable.get("memory", "0")),
            )
        except QuantityError as exc:
            raise ModelError(f"Node {meta.get('name')}: allocatable: {exc}") from None
        self.nodes[info.name] = info
        self._layout = None

    def _apply_pod(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid"))
        node = (obj.get("spec") or {}).get("nodeName")
        phase = (obj.get("status") or {}).get("phase")
        self._unbind_pod(uid)
        if node and phase not in ("Succeeded", "Failed"):
            try:
                cpu, mem = pod_requests(obj)
            except QuantityError as exc:
                # Bound to a node by name, past every scheduler: its kubelet refuses it, but
                # until then it is counted as taking everything rather than nothing.
                log.warning(
                    "pod %s/%s on node %s: %s; counted as using the whole node",
                    meta.get("namespace"),
                    meta.get("name"),
                    node,
                    exc,
                )
                cpu = mem = MAX_MODEL_QUANTITY
            self._pods[uid] = (str(node), cpu, mem)
            self.node_cpu_used[node] = self.node_cpu_used.get(node, 0) + cpu
            self.node_mem_used[node] = self.node_mem_used.get(node, 0) + mem
            self._node_free_changed(str(node))

    def _unbind_pod(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is not None:
            node, cpu, mem = old
            self.node_cpu_used[node] -= cpu
            self.node_mem_used[node] -= mem
            self._node_free_changed(node)

    def _node_free_changed(self, node: str) -> None:
        layout = self._layout
        if layout is not None and node in layout.node_index:
            i = layout.node_index[node]
            self.change_seq += 1
            layout.node_seq[i] = self.change_seq
            info = self.nodes[node]
            layout.cpu_free[i] = _free(info.cpu_milli, self.node_cpu_used.get(node, 0))
            layout.mem_free[i] = _free(info.memory, self.node_mem_used.get(node, 0))

    def _apply_claim(self, obj: Mapping[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid"))
        allocation = (obj.get("status") or {}).get("allocation")
        results = ((allocation or {}).get("devices") or {}).get("results") or []
        consumption: list[Consumption] = []
        for result in results:
            if result.get("adminAccess"):
                continue  # admin access never consumes
            driver = str(result.get("driver"))
            key = (driver, str(result.get("pool")), str(result.get("device")))
            consumed = result.get("consumedCapacity") or {}
            amounts = tuple(
                sorted((_qualify(k, driver), _consumed(uid, k, v)) for k, v in consumed.items())
            )
            device = self.devices.get(key)
            exclusive = device is None or not device.allow_multiple
            consumption.append(Consumption(key, amounts, exclusive and "shareID" not in result))
        self._set_claim(uid, consumption)

    def assume(self, claim_uid: str, consumption: list[Consumption]) -> None:
        """Record the allocator's own decision until the claim's update event replaces it."""
        self._set_claim(claim_uid, consumption)

    def _set_claim(self, uid: str, consumption: list[Consumption]) -> None:
        for entry in self._claims.pop(uid, []):
            self._account(entry, -1)
        if consumption:
            self._claims[uid] = consumption
            for entry in consumption:
                self._account(entry, +1)

    def _account(self, entry: Consumption, sign: int) -> None:
        used = self.used.get(entry.device)
        if used is None:
            used = self.used[entry.device] = DeviceUsage()
        for name, amount in entry.amounts:
            used[name] = used.get(name, 0) + sign * amount
        used.allocations += sign
        if entry.exclusive:
            used.exclusive += sign
        layout = self._layout
        row = None if layout is None else layout.index.get(entry.device)
        if layout is None or row is None:
            return
        driver = entry.device[0]
        self.change_seq += 1
        node = int(layout.dev_node[row])
        layout.node_seq[node] = self.change_seq
        mem = _held(used.get(f"{driver}/{names.CAPACITY_MEMORY}", 0))
        cores = _held(used.get(f"{driver}/{names.CAPACITY_CORES}", 0))
        layout.node_mem_used[node] += mem - int(layout.mem_used[row])
        layout.node_cores_used[node] += cores - int(layout.cores_used[row])
        layout.mem_used[row] = mem
        layout.cores_used[row] = cores
        layout.busy[row] = layout.dev[row, DEV_HELD] = int(self.is_held(entry.device))
        layout.dev[row, DEV_ALLOCATED] = int(used.allocations > 0)
        for name, _ in entry.amounts:
            column = layout.dims.get(name)
            if column is not None:
                layout.used_by_dim[row, column] = _held(used[name])

    # ------------------------------------------------------------ derived

    def layout(self) -> Layout:
        """The kernel's flat arrays (rebuilt only after slice or node changes)."""
        if self._layout is None:
            self._layout = self._build_layout()
        return self._layout

    def _build_layout(self) -> Layout:
        by_node: dict[str, list[Device]] = {}
        for device in self.devices.values():
            if device.node in self.nodes:
                by_node.setdefault(device.node, []).append(device)
        node_names = sorted(by_node)
        devices: list[Device] = []
        starts, ends = [], []
        for name in node_names:
            starts.append(len(devices))
            devices.extend(sorted(by_node[name], key=lambda d: d.key))
            ends.append(len(devices))
        n = len(devices)

        def arr(values: list[int]) -> npt.NDArray[np.int64]:
            return np.asarray(values, dtype=np.int64).reshape(len(values))

        node_of = [0] * n
        for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
            node_of[s:e] = [i] * (e - s)
        mem_total, cores_total, mem_used, cores_used, busy = [], [], [], [], []
        mem_default, cores_default = [], []
        for d in devices:
            driver = d.key[0]
            mem = d.capacity.get(f"{driver}/{names.CAPACITY_MEMORY}")
            cores = d.capacity.get(f"{driver}/{names.CAPACITY_CORES}")
            used = self.used.get(d.key, _NO_USAGE)
            mem_total.append(mem.value if mem else 0)
            cores_total.append(cores.value if cores else 0)
            mem_default.append(default_consumption(mem))
            cores_default.append(default_consumption(cores))
            mem_used.append(_held(used.get(f"{driver}/{names.CAPACITY_MEMORY}", 0)))
            cores_used.append(_held(used.get(f"{driver}/{names.CAPACITY_CORES}", 0)))
            busy.append(int(self.is_held(d.key)))
        link_size = []
        for i, d in enumerate(devices):
            s, e = starts[node_of[i]], ends[node_of[i]]
            link_size.append(sum(1 for o in devices[s:e] if o.link == d.link) if d.link >= 0 else 0)
        dims = {name: i for i, name in enumerate(sorted({c for d in devices for c in d.capacity}))}
        cap = np.full((n, len(dims)), -1, dtype=np.int64)
        used_by_dim = np.zeros((n, len(dims)), dtype=np.int64)
        dev = np.zeros((n, DEV_FIELDS), dtype=np.int64)
        for i, d in enumerate(devices):
            for name, capacity in d.capacity.items():
                cap[i, dims[name]] = capacity.value
            for name, amount in self.used.get(d.key, _NO_USAGE).items():
                if name in dims:
                    used_by_dim[i, dims[name]] = _held(amount)
            driver = d.key[0]
            dev[i] = (
                int(d.allow_multiple),
                int(self.allocation_count(d.key) > 0),
                busy[i],
                d.numa,
                d.link,
                link_size[i],
                dims.get(f"{driver}/{names.CAPACITY_MEMORY}", -1),
                dims.get(f"{driver}/{names.CAPACITY_CORES}", -1),
            )

        def node_sum(values: list[int]) -> npt.NDArray[np.int64]:
            return arr(
                [min(sum(values[s:e]), SATURATED) for s, e in zip(starts, ends, strict=True)]
            )

        self.layout_epoch += 1
        return Layout(
            nodes=node_names,
            devices=devices,
            node_start=arr(starts),
            node_end=arr(ends),
            dev_node=arr(node_of),
            mem_total=arr(mem_total),
            cores_total=arr(cores_total),
            mem_default=arr(mem_default),
            cores_default=arr(cores_default),
            mem_used=arr(mem_used),
            cores_used=arr(cores_used),
            busy=arr(busy),
            numa=arr([d.numa for d in devices]),
            link=arr([d.link for d in devices]),
            link_size=arr(link_size),
            node_mem_total=node_sum(mem_total),
            node_cores_total=node_sum(cores_total),
            node_mem_used=node_sum(mem_used),
            node_cores_used=node_sum(cores_used),
            node_seq=np.zeros(len(node_names), dtype=np.int64),
            row_seq=np.zeros(n, dtype=np.int64),
            cpu_free=arr(
                [_free(self.nodes[n].cpu_milli, self.node_cpu_used.get(n, 0)) for n in node_names]
            ),
            mem_free=arr(
                [_free(self.nodes[n].memory, self.node_mem_used.get(n, 0)) for n in node_names]
            ),
            dims=dims,
            cap=cap,
            used_by_dim=used_by_dim,
            dev=dev,
            index={d.key: i for i, d in enumerate(devices)},
            node_index={n: i for i, n in enumerate(node_names)},
            epoch=self.layout_epoch,
        )

    def device_used(self, key: DeviceKey) -> Mapping[str, int]:
        """Capacity name -> amount the device's allocations consume (empty: none)."""
        return self.used.get(key, _NO_USAGE)

    def allocation_count(self, key: DeviceKey) -> int:
        """How many allocation results the device has (admin access not counted)."""
        used = self.used.get(key)
        return 0 if used is None else used.allocations

    def is_held(self, key: DeviceKey) -> bool:
        """True when the device can take no further allocation at all."""
        used = self.used.get(key)
        if used is None:
            return False
        if used.exclusive > 0:
            return True
        device = self.devices.get(key)
        return device is not None and not device.allow_multiple and used.allocations > 0
