"""Place a pod's claims: the best (node, devices, consumed capacity, shareIDs) or a reason.

One decision, in three steps, all over the incrementally maintained `ClusterModel`:

1. Node fit (cached per pod shape and layout): selector, affinity, taints, unschedulable,
   cpu/memory.
2. The scan (`_scan.scan`, in C): for every node, every request with one alternative is
   screened on free memory/cores, selectability (CEL, include/exclude, device taints; cached per
   device generation) and topology, and the node gets its policy key. Keys are kept per request
   shape and policy; later decisions rescan only the nodes changed since. Only this step touches
   nodes x devices.
3. The exact search, on the best-keyed node only (then the next, if it fails): capacity
   requestPolicy rounding, several requests and claims sharing devices, firstAvailable in order,
   matchAttribute/distinctAttribute, All mode, topology groups first (smallest NVLink domain that
   fits), devices ordered by the device policy, within a step budget. The node's devices and the
   requests are encoded here as integer arrays (cached per request shape and node until the
   layout changes); the walk itself is `_scan.search`, in C.

Refusals explain themselves with the closest node ("no node has 2 GPUs in one NVLink domain with
20Gi and 30 cores free each; closest: node-3 (1 GPU)").
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from dra_driver.allocator.cel import CelError
from dra_driver.allocator.model import (
    ClusterModel,
    Consumption,
    Device,
    Layout,
    consumption,
    requested_amounts,
)
from dra_driver.allocator.nodefit import blocking_taint, static_misfit
from dra_driver.allocator.quantity import format_quantity
from dra_driver.allocator.request import Alternative, Claim, Constraint, Policy, Request

try:
    from dra_driver.allocator import _scan
except ImportError:  # not built: Allocator() says so (the model and quantities work without it)
    _scan = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
SEARCH_BUDGET = 20_000  # device choices tried per node before the node counts as not fitting
FIT_CACHE_MAX = 65_536  # (request capacity, node) entries of the static fit cache
KEYS_CACHE_MAX = 256  # request shapes x policies whose node keys are kept
# Nodes where a claim with firstAvailable subrequests fits, searched for one where earlier
# subrequests fit (kube-scheduler stops filtering at 100 feasible nodes, minFeasibleNodesToFind).
RANKED_NODES_MAX = 100
ALT_FIELDS = 3  # columns of the search's per-alternative matrix: all devices, count, admin
_PER_DEVICE = frozenset({"attributes", "capacity"})  # device fields that differ between GPUs


class Unschedulable(Exception):
    """No placement exists; `str()` is a reason a user understands."""


class DeviceResult(NamedTuple):
    """One allocated device of one request, as it will appear in the claim's allocation."""

    request: str
    driver: str
    pool: str
    device: str
    consumed: tuple[tuple[str, int], ...]  # qualified capacity name -> amount
    share_id: str | None
    admin: bool
    tolerations: tuple[JSON, ...] = ()
    # What `Allocator.commit` records for this result (derived from the fields above, made
    # once per alternative and device: it never makes two otherwise equal results differ)
    consumption: Consumption | None = None

    def to_api(self) -> JSON:
        result: JSON = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.admin:
            result["adminAccess"] = True
        if self.share_id is not None:
            result["shareID"] = self.share_id
        if self.consumed:
            prefix = f"{self.driver}/"
            result["consumedCapacity"] = {
                (k[len(prefix) :] if k.startswith(prefix) else k): str(v) for k, v in self.consumed
            }
        if self.tolerations:
            result["tolerations"] = [dict(t) for t in self.tolerations]
        return result


class Placement(NamedTuple):
    """Where a pod's claims go."""

    node: str
    key: float  # the node's policy key (docs/scheduling.md)
    results: tuple[tuple[Claim, tuple[DeviceResult, ...]], ...]

    def allocation(self, claim_uid: str) -> JSON:
        """`status.allocation` for one of the placed claims (results, config, nodeSelector)."""
        for claim, results in self.results:
            if claim.uid != claim_uid:
                continue
            config: list[JSON] = []
            for request in claim.requests:
                used = {r.request for r in results if r.request.split("/")[0] == request.name}
                for alt in request.alternatives:
                    if alt.name in used:
                        config += [
                            {"source": "FromClass", "requests": [alt.name], **c}
                            for c in alt.class_config
                        ]
            config += [{"source": "FromClaim", **c} for c in claim.config]
            return {
                "devices": {"results": [r.to_api() for r in results], "config": config},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [self.node]}
                            ]
                        }
                    ]
                },
            }
        raise KeyError(claim_uid)


def _share_base(claim_uid: str, request: str) -> int:
    """The first 16 bytes of SHA-256("claim uid/request"), as a 128-bit integer: what every
    shareID of one request is derived from (one hash per request, not per device)."""
    return int.from_bytes(hashlib.sha256(f"{claim_uid}/{request}".encode()).digest()[:16])


def _share_id(base: int, position: int) -> str:
    """The shareID of the request's device at `position` (its place among the request's
    results): `base` (see `_share_base`) with the position XORed into bytes 12..15 (its low
    32 bits), formatted as a version-4 UUID (RFC 9562 version and variant bits), like
    uuid.UUID(bytes=..., version=4) would, without building the object: the version nibble
    becomes 4, the variant's two high bits 10. Bytes 12..15 hold neither, so positions of one
    request always give different IDs (docs/scheduling.md, "shareIDs")."""
    if not 0 <= position < 1 << 32:
        raise ValueError(f"shareID position {position} out of range")
    h = f"{base ^ position:032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def _plural(n: int, word: str = "GPU") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# What the scan needs per request shape: screened alternatives, forced groups, masks, memory,
# memory percentage, cores and counts (see Allocator._screen).
_Screen = tuple[
    list[Alternative],
    npt.NDArray[np.int64],
    npt.NDArray[np.int8],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]


def _shape(claims: Sequence[Claim], policy: Policy) -> tuple[Any, ...]:
    """What the static inputs of a decision depend on (not claim names, not consumption): the
    cache key of the scan's screen and, with a node, of the search's encoding."""
    return (
        policy.include_types,
        policy.exclude_types,
        policy.include_uuids,
        policy.exclude_uuids,
        *(claim.shape for claim in claims),
    )


@dataclass(frozen=True, slots=True)
class _Encoding:
    """The search kernel's static inputs for one request shape on one node (see `_encoding`)."""

    alternatives: tuple[Alternative, ...]  # in kernel order (alts rows)
    arrays: tuple[npt.NDArray[Any], ...]  # reqs, alts, mask, servable, amount, applies, ...
    # (alternative row, node-local device row) -> what a result holds, filled as devices are
    # picked (decisions of one shape pick the same few devices again and again)
    picks: dict[tuple[int, int], _Pick] = field(default_factory=dict)


class _Pick(NamedTuple):
    """A `DeviceResult` without its shareID, per alternative and device (see `_Encoding`; a
    tuple, as it is made for nearly every pick of a filling cluster)."""

    request: str
    driver: str
    pool: str
    device: str
    consumed: tuple[tuple[str, int], ...]
    shared: bool  # gets a shareID
    admin: bool
    tolerations: tuple[JSON, ...]
    consumption: Consumption  # what committing such a result records


def _picked(
    chosen_alt: npt.NDArray[np.int64], picks: npt.NDArray[np.int64], npicks: npt.NDArray[np.int64]
) -> list[tuple[int, tuple[int, ...]]]:
    """The search's outputs as (alternative row, node-local device rows) per flat request."""
    return [
        (int(a), tuple(picks[i, :count].tolist()))
        for i, (a, count) in enumerate(zip(chosen_alt.tolist(), npicks.tolist(), strict=True))
    ]


def _shape_arrays(
    claims: Sequence[Claim], flat: list[tuple[int, Request]]
) -> tuple[
    list[Alternative],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int8],
    npt.NDArray[np.int64],
    list[tuple[int, Constraint]],
]:
    """The search inputs that depend on the requests only (see _scan.search): the
    alternatives in kernel order, reqs, alts, applies, distinct, and the constraint slots."""
    n_req = len(flat)
    alt_list: list[Alternative] = []
    reqs = np.empty((n_req, 2), dtype=np.int64)
    for i, (_, request) in enumerate(flat):
        reqs[i, 0] = len(alt_list)
        alt_list.extend(request.alternatives)
        reqs[i, 1] = len(alt_list)
    alts = np.asarray(
        [(int(alt.all_devices), alt.count, int(alt.admin)) for alt in alt_list],
        dtype=np.int64,
    ).reshape(len(alt_list), ALT_FIELDS)
    slots = [(ci, c) for ci, claim in enumerate(claims) for c in claim.constraints]
    applies = np.zeros((n_req, len(slots)), dtype=np.int8)
    for i, (ci, request) in enumerate(flat):
        for s, (owner, constraint) in enumerate(slots):
            if owner == ci and (not constraint.requests or request.name in constraint.requests):
                applies[i, s] = 1
    distinct = np.asarray([int(c.distinct) for _, c in slots], dtype=np.int64).reshape(len(slots))
    return alt_list, reqs, alts, applies, distinct, slots


class Allocator:
    """Decisions over one `ClusterModel` (needs the built `_scan` extension)."""

    def __init__(self, model: ClusterModel) -> None:
        if _scan is None:
            raise RuntimeError(
                "the allocator's Cython extension dra_driver.allocator._scan is not built "
                "(make native, or pip install .)"
            )
        self.model = model
        # The two kernels (the tests put their pure-Python oracle here to compare decisions).
        self.scan: Callable[..., None] = _scan.scan
        self.search: Callable[..., int] = _scan.search
        self._masks: dict[tuple[Any, ...], npt.NDArray[np.int8]] = {}
        # per mask: selectable devices per driver (kept exact through in-place republications)
        self._mask_drivers: dict[tuple[Any, ...], dict[str, int]] = {}
        self._mask_epoch = -1
        self._mask_source: dict[tuple[Any, ...], tuple[Alternative, Policy]] = {}
        self._patch_seq = 0  # the layout's patch_seq this allocator's caches reflect
        # (expression, device key) or (expression, driver, allowMultipleAllocations) ->
        # (device generation or 0, result or CEL error)
        self._cel: dict[tuple[Any, ...], tuple[int, bool | str]] = {}
        self._amounts: dict[tuple[Any, ...], tuple[Any, tuple[tuple[str, int], ...] | None]] = {}
        self._static: dict[str, tuple[int, npt.NDArray[np.int8], dict[str, int]]] = {}
        self._fits: dict[tuple[Any, ...], tuple[npt.NDArray[np.int8], npt.NDArray[np.int64]]] = {}
        self._encodings: dict[tuple[Any, ...], _Encoding] = {}
        self._screens: dict[tuple[Any, ...], _Screen] = {}
        # (shape, policy) -> (model.change_seq, node_ok, keys, closeness) of the last scan
        self._node_keys: dict[tuple[Any, ...], Any] = {}

    # ------------------------------------------------------------ selection

    def _selectable(self, alt: Alternative, policy: Policy, device: Device) -> bool:
        if blocking_taint(device.taints, alt.tolerations) is not None:
            return False
        if not policy.admits(device.product, device.uuid):
            return False
        # Built only when some selector has no cached result, with the fields it can read.
        view: JSON | None = None
        have: frozenset[str] = frozenset()
        for selector in alt.selectors:  # class first; stop at the first False, like the API
            # An expression that reads neither attributes nor capacity (a class's
            # `device.driver == "..."`) has one result per driver: evaluated once, not per device.
            if selector.fields & _PER_DEVICE:
                cache_key: tuple[Any, ...] = (selector.source, device.key)
                generation = device.generation
            else:
                cache_key, generation = (selector.source, device.key[0], device.allow_multiple), 0
            hit = self._cel.get(cache_key)
            if hit is None or hit[0] != generation:
                if view is None or not selector.fields <= have:
                    have = have | selector.fields
                    view = device.cel_view(have)
                try:
                    value: bool | str = selector.matches(view)
                except CelError as exc:
                    value = str(exc)
                hit = (generation, value)
                self._cel[cache_key] = hit
            if isinstance(hit[1], str):
                raise Unschedulable(f"device {'/'.join(device.key)}: {hit[1]}")
            if not hit[1]:
                return False
        return True

    def _current(self, layout: Layout) -> None:
        """Drop every cache derived from an older layout (slices or nodes changed); after devices
        were republished in place, refresh the rows derived from them."""
        if self._mask_epoch == layout.epoch and self._patch_seq != layout.patch_seq:
            self._refresh_rows(layout)
        if self._mask_epoch != layout.epoch:
            self._patch_seq = layout.patch_seq
            self._masks.clear()
            self._mask_source.clear()
            self._mask_drivers.clear()
            self._static.clear()
            self._fits.clear()
            self._encodings.clear()
            self._screens.clear()
            self._node_keys.clear()
            # Forget CEL results of devices that are gone (and the per-driver ones).
            devices = self.model.devices
            self._cel = {k: v for k, v in self._cel.items() if k[1] in devices}
            self._mask_epoch = layout.epoch

    def _refresh_rows(self, layout: Layout) -> None:
        """Devices republished in place (same names, same nodes; see ClusterModel): recompute
        their rows of every selection mask, and drop what holds copies of masks or per-node
        fits (screens, encodings); their nodes are stamped changed, so node keys follow."""
        rows = np.nonzero(layout.row_seq > self._patch_seq)[0]
        self._patch_seq = layout.patch_seq
        for key, (alt, policy) in list(self._mask_source.items()):
            mask = self._masks[key]
            drivers = self._mask_drivers[key]
            try:
                for row in rows:
                    device = layout.devices[row]
                    now = int(self._selectable(alt, policy, device))
                    drivers[device.key[0]] = drivers.get(device.key[0], 0) + now - int(mask[row])
                    mask[row] = now
            except Unschedulable:  # a CEL error now: rebuilt (and reported) when next needed
                del self._masks[key], self._mask_source[key], self._mask_drivers[key]
        self._fits.clear()
        self._encodings.clear()
        self._screens.clear()

    def _mask(self, layout: Layout, alt: Alternative, policy: Policy) -> npt.NDArray[np.int8]:
        self._current(layout)
        key = (
            alt.signature,
            policy.include_types,
            policy.exclude_types,
            policy.include_uuids,
            policy.exclude_uuids,
        )
        mask = self._masks.get(key)
        if mask is None:
            mask = np.fromiter(
                (self._selectable(alt, policy, d) for d in layout.devices),
                dtype=np.int8,
                count=len(layout.devices),
            )
            self._masks[key] = mask
            self._mask_source[key] = (alt, policy)
            drivers: dict[str, int] = {}
            for device, selectable in zip(layout.devices, mask, strict=True):
                if selectable:
                    drivers[device.key[0]] = drivers.get(device.key[0], 0) + 1
            self._mask_drivers[key] = drivers
        return mask

    def _forced_group(
        self, layout: Layout, claim: Claim, request: Request, alt: Alternative, policy: Policy
    ) -> int:
        """1 / 2 when a matchAttribute of the claim puts this request's devices on one NUMA node /
        NVLink domain, as the layout's arrays know them (the attribute in the driver's domain of
        every selectable device); else 0. Lets the scan drop nodes that cannot satisfy it."""
        self._mask(layout, alt, policy)
        drivers = self._mask_drivers[
            (
                alt.signature,
                policy.include_types,
                policy.exclude_types,
                policy.include_uuids,
                policy.exclude_uuids,
            )
        ]
        for constraint in claim.constraints:
            if constraint.distinct or (
                constraint.requests and request.name not in constraint.requests
            ):
                continue
            domain, _, name = constraint.attribute.rpartition("/")
            kind = {"numaNode": 1, "nvlinkDomain": 2}.get(name, 0)
            if kind and {d for d, count in drivers.items() if count > 0} == {domain}:
                return kind
        return 0

    # ------------------------------------------------------------ node fit

    def _node_ok(
        self, layout: Layout, pod: Mapping[str, Any], cpu: int, mem: int
    ) -> tuple[npt.NDArray[np.int8], dict[str, int]]:
        spec = pod.get("spec") or {}
        # Most pods set none of the three: skip serialising them.
        if spec.get("nodeSelector") or spec.get("affinity") or spec.get("tolerations"):
            shape = json.dumps(
                [spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")],
                sort_keys=True,
            )
        else:
            shape = ""
        cached = self._static.get(shape)
        if cached is None or cached[0] != layout.epoch:
            reasons: dict[str, int] = {}
            values = []
            for name in layout.nodes:
                info = self.model.nodes[name]
                why = static_misfit(spec, name, info.labels, info.taints, info.unschedulable)
                if why is not None:
                    reasons[why] = reasons.get(why, 0) + 1
                values.append(why is None)
            cached = (layout.epoch, np.asarray(values, dtype=np.int8), reasons)
            self._static[shape] = cached
        ok, reasons = cached[1], cached[2]  # read-only: copied before any change
        if cpu or mem:
            reasons = dict(reasons)
            short_cpu = (ok > 0) & (layout.cpu_free < cpu)
            short_mem = (ok > 0) & ~short_cpu & (layout.mem_free < mem)
            for why, short in (("insufficient cpu", short_cpu), ("insufficient memory", short_mem)):
                count = int(short.sum())
                if count:
                    reasons[why] = reasons.get(why, 0) + count
            ok = ((ok > 0) & ~short_cpu & ~short_mem).astype(np.int8)
        return ok, reasons

    # ------------------------------------------------------------ decision

    def place(
        self,
        pod: Mapping[str, Any],
        claims: Sequence[Claim],
        policy: Policy,
        pod_resources: tuple[int, int] = (0, 0),
    ) -> Placement:
        """The best placement of all `claims` together, or Unschedulable with the reason.

        Each decision's duration is logged at debug level (the controller's scale benchmark
        reads it): "decision <node|unschedulable> in <ms> ms (layout rebuilt: <bool>)"."""
        debug = log.isEnabledFor(logging.DEBUG)
        started = time.perf_counter() if debug else 0.0
        epoch = self.model.layout_epoch
        outcome = "unschedulable"
        try:
            placement = self._place(pod, claims, policy, pod_resources)
            outcome = placement.node
            return placement
        finally:
            if debug:
                log.debug(
                    "decision %s in %.3f ms (layout rebuilt: %s)",
                    outcome,
                    (time.perf_counter() - started) * 1e3,
                    self.model.layout_epoch != epoch,
                )

    def _place(
        self,
        pod: Mapping[str, Any],
        claims: Sequence[Claim],
        policy: Policy,
        pod_resources: tuple[int, int],
    ) -> Placement:
        layout = self.model.layout()
        if not layout.nodes:
            raise Unschedulable("no node publishes devices (no complete ResourceSlice pool)")
        # Caches derived from an older layout go first (node fit's among them: dropping it
        # after computing it would make the next decision compute it again).
        self._current(layout)
        node_ok, reasons = self._node_ok(layout, pod, *pod_resources)
        flat = [(ci, req) for ci, claim in enumerate(claims) for req in claim.requests]
        shape = _shape(claims, policy)
        screen = self._screens.get(shape)
        if screen is None:
            screen = self._screen(layout, claims, flat, policy)
            if len(self._screens) >= FIT_CACHE_MAX:
                self._screens.clear()
            self._node_keys.clear()
            self._screens[shape] = screen
        screened = screen[0]
        keys, closeness = self._keys(layout, node_ok, screen, shape, policy)
        tried = 0
        # firstAvailable: a node where earlier subrequests fit beats the policy's best node
        # (kube-scheduler's DynamicResources score); the key decides between equal ranks.
        ranked = any(len(req.alternatives) > 1 for _, req in flat)
        chosen: tuple[int, Placement] | None = None
        feasible = 0
        while True:
            best = int(np.argmax(keys))
            if keys[best] < 0:
                break
            tried += 1
            found = self._search_node(
                layout, best, claims=claims, flat=flat, policy=policy, shape=shape
            )
            if found is not None:
                rank = _rank(found) if ranked else 0
                if chosen is None or rank < chosen[0]:
                    chosen = (rank, Placement(layout.nodes[best], float(keys[best]), found))
                feasible += 1
                if chosen[0] == 0 or feasible >= RANKED_NODES_MAX:
                    return chosen[1]
            keys[best] = -1.0
        if chosen is not None:
            return chosen[1]
        raise Unschedulable(
            self._reason(
                layout=layout,
                node_ok=node_ok,
                reasons=reasons,
                screened=screened,
                closeness=closeness,
                policy=policy,
                tried=tried,
            )
        )

    def _keys(
        self,
        layout: Layout,
        node_ok: npt.NDArray[np.int8],
        screen: _Screen,
        shape: tuple[Any, ...],
        policy: Policy,
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """Every node's key and closeness for this request shape and policy. A node's figures
        depend only on its own rows, so after the first scan of a shape only the nodes changed
        since (consumption, bound pods: `layout.node_seq`) or whose fit changed are scanned
        again; the others keep their figures. The result equals a full scan."""
        _, req_group, masks, req_mem, req_pct, req_cores, req_count = screen
        # The forced groups are part of the key: an in-place republication can change which
        # drivers' devices are selectable, and with them every node's figures.
        cache_key = (shape, policy.topology_mode, policy.strict, policy.node, req_group.tobytes())
        seq = self.model.change_seq
        cached = self._node_keys.get(cache_key)
        if cached is None:
            todo = node_ok
        else:
            dirty = (layout.node_seq > cached[0]) | (node_ok != cached[1])
            if not dirty.any():
                return cached[2].copy(), cached[3].copy()
            todo = (node_ok > 0) & dirty
        keys = np.empty(len(layout.nodes), dtype=np.float64)
        closeness = np.empty(len(layout.nodes), dtype=np.int64)
        self.scan(
            layout.node_start,
            layout.node_end,
            todo.astype(np.int8),
            layout.node_mem_total,
            layout.node_mem_used,
            layout.node_cores_total,
            layout.node_cores_used,
            layout.mem_total,
            layout.cores_total,
            layout.mem_default,
            layout.cores_default,
            layout.mem_used,
            layout.cores_used,
            layout.busy,
            layout.numa,
            layout.link,
            layout.link_size,
            masks,
            req_mem,
            req_pct,
            req_cores,
            req_count,
            req_group,
            policy.topology_mode,
            int(policy.strict),
            policy.node_binpack,
            keys,
            closeness,
        )
        if cached is not None:
            keys = np.where(dirty, keys, cached[2])
            closeness = np.where(dirty, closeness, cached[3])
        if len(self._node_keys) >= KEYS_CACHE_MAX:
            self._node_keys.clear()
        self._node_keys[cache_key] = (seq, node_ok, keys, closeness)
        return keys.copy(), closeness.copy()

    def _screen(
        self,
        layout: Layout,
        claims: Sequence[Claim],
        flat: list[tuple[int, Request]],
        policy: Policy,
    ) -> _Screen:
        """The scan's per-request inputs for one request shape (static per layout): the requests
        it screens (one alternative, no admin access), their forced groups, masks and sizes."""
        screened_requests = [
            (claims[ci], req)
            for ci, req in flat
            if len(req.alternatives) == 1 and not req.alternatives[0].admin
        ]
        screened = [req.alternatives[0] for _, req in screened_requests]
        req_group = np.asarray(
            [
                self._forced_group(layout, claim, req, req.alternatives[0], policy)
                for claim, req in screened_requests
            ],
            dtype=np.int64,
        )
        masks = np.zeros((len(screened), len(layout.devices)), dtype=np.int8)
        for row, alt in enumerate(screened):
            masks[row] = self._mask(layout, alt, policy)
        req_mem = np.asarray([_requested(a, "memory") for a in screened], dtype=np.int64)
        req_pct = np.asarray([a.memory_percent for a in screened], dtype=np.int64)
        req_cores = np.asarray([_requested(a, "cores") for a in screened], dtype=np.int64)
        req_count = np.asarray([-1 if a.all_devices else a.count for a in screened], np.int64)
        return (screened, req_group, masks, req_mem, req_pct, req_cores, req_count)

    def commit(self, placement: Placement) -> None:
        """Count the placement's consumption in the model until the claims' updates arrive."""
        for claim, results in placement.results:
            self.model.assume(
                claim.uid,
                [
                    r.consumption
                    or Consumption(
                        (r.driver, r.pool, r.device), r.consumed, exclusive=r.share_id is None
                    )
                    for r in results
                    if not r.admin
                ],
            )

    # ------------------------------------------------------------ exact search on one node

    def _search_node(
        self,
        layout: Layout,
        node: int,
        *,
        claims: Sequence[Claim],
        flat: list[tuple[int, Request]],
        policy: Policy,
        shape: tuple[Any, ...],
    ) -> tuple[tuple[Claim, tuple[DeviceResult, ...]], ...] | None:
        """Run the search kernel on one node; its picks as results (None: nothing fits within
        the budget)."""
        start = int(layout.node_start[node])
        enc = self._node_encoding(
            layout, node, claims=claims, flat=flat, policy=policy, shape=shape
        )
        picked = self._run_search(layout, node, enc, policy)
        if picked is None:
            return None
        out: list[list[DeviceResult]] = [[] for _ in claims]
        for (ci, _), (a, rows) in zip(flat, picked, strict=True):
            base: int | None = None  # hashed on the request's first shared device
            for position, row in enumerate(rows):
                pick = enc.picks.get((a, row))
                if pick is None:
                    pick = enc.picks[a, row] = self._pick(enc.alternatives[a], start + row, layout)
                share = None
                if pick.shared:
                    if base is None:
                        base = _share_base(claims[ci].uid, pick.request)
                    share = _share_id(base, position)
                out[ci].append(
                    DeviceResult(
                        pick.request,
                        pick.driver,
                        pick.pool,
                        pick.device,
                        pick.consumed,
                        share,
                        pick.admin,
                        pick.tolerations,
                        pick.consumption,
                    )
                )
        return tuple((claim, tuple(results)) for claim, results in zip(claims, out, strict=True))

    def _node_encoding(
        self,
        layout: Layout,
        node: int,
        *,
        claims: Sequence[Claim],
        flat: list[tuple[int, Request]],
        policy: Policy,
        shape: tuple[Any, ...],
    ) -> _Encoding:
        """The search kernel's inputs for this request shape on `node` (cached)."""
        start = int(layout.node_start[node])
        enc = self._encodings.get((shape, start))
        if enc is None:
            enc = self._encoding(layout, claims=claims, flat=flat, policy=policy, start=start)
            if len(self._encodings) >= FIT_CACHE_MAX:  # many request shapes x nodes: start over
                self._encodings.clear()
            self._encodings[(shape, start)] = enc
        return enc

    def _run_search(
        self, layout: Layout, node: int, enc: _Encoding, policy: Policy
    ) -> list[tuple[int, tuple[int, ...]]] | None:
        """The search kernel on one node: (alternative row, node-local device rows) per flat
        request, None when nothing fits within the budget."""
        start, end = int(layout.node_start[node]), int(layout.node_end[node])
        n_req = len(enc.arrays[0])
        chosen_alt = np.zeros(n_req, dtype=np.int64)
        picks = np.zeros((n_req, end - start), dtype=np.int64)
        npicks = np.zeros(n_req, dtype=np.int64)
        found = self.search(
            layout.dev[start:end],
            layout.cap[start:end],
            layout.used_by_dim[start:end],
            *enc.arrays,
            policy.topology_mode,
            int(policy.strict),
            policy.device_binpack,
            SEARCH_BUDGET,
            chosen_alt,
            picks,
            npicks,
        )
        return _picked(chosen_alt, picks, npicks) if found else None

    def _pick(self, alt: Alternative, row: int, layout: Layout) -> _Pick:
        """What a result of `alt` on the device at layout `row` holds, but its shareID."""
        device = layout.devices[row]
        consumed = self._consumed(alt, device)
        shared = device.allow_multiple and not alt.admin
        return _Pick(
            alt.name,
            device.key[0],
            device.key[1],
            device.key[2],
            consumed,
            shared,
            alt.admin,
            alt.tolerations,
            Consumption(device.key, consumed, exclusive=not shared),
        )

    def _encoding(
        self,
        layout: Layout,
        *,
        claims: Sequence[Claim],
        flat: list[tuple[int, Request]],
        policy: Policy,
        start: int,
    ) -> _Encoding:
        """The search kernel's static inputs for these requests on the node whose devices start
        at `start`: they depend on the published devices and the requests' shape only (not on
        claim names or consumption), so pods made from one template reuse them (cached by the
        caller until the layout changes)."""
        end = int(layout.node_end[layout.dev_node[start]])
        m = end - start
        alt_list, reqs, alts, applies, distinct, slots = _shape_arrays(claims, flat)
        n_alt = len(alt_list)
        mask = np.empty((n_alt, m), dtype=np.int8)
        servable = np.empty((n_alt, m), dtype=np.int8)
        amount = np.empty((n_alt, m, len(layout.dims)), dtype=np.int64)
        for a, alt in enumerate(alt_list):
            mask[a] = self._mask(layout, alt, policy)[start:end]
            servable[a], amount[a] = self._static_fit(layout, alt, start, end)
        cval = np.full((len(slots), m), -1, dtype=np.int64)
        for s, (_, constraint) in enumerate(slots):
            ids: dict[Any, int] = {}  # equal attribute values get equal ids
            for j in range(m):
                value = layout.devices[start + j].attribute(constraint.attribute)
                if value is not None:
                    cval[s, j] = ids.setdefault(value, len(ids))
        arrays = (reqs, alts, mask, servable, amount, applies, distinct, cval)
        return _Encoding(tuple(alt_list), arrays)

    def _amounts_of(self, alt: Alternative, device: Device) -> tuple[tuple[str, int], ...] | None:
        """What `alt` consumes of a multi-allocatable device under its request policies
        (cached per capacity table); None when the device cannot serve it."""
        # The amounts depend on the driver and the capacity table only, and every GPU of a model
        # shares one table object (model.py): keyed by its identity, which the entry keeps alive.
        table = device.capacity
        cache_key = (alt.capacity_key, device.key[0], id(table))
        hit = self._amounts.get(cache_key)
        if hit is None or hit[0] is not table:
            if len(self._amounts) >= FIT_CACHE_MAX:
                self._amounts.clear()
            hit = (table, consumption(alt.capacity, device, alt.memory_percent))
            self._amounts[cache_key] = hit
        return hit[1]

    def _device_fit(
        self, alt: Alternative, device: Device, layout: Layout, amount: npt.NDArray[np.int64]
    ) -> bool:
        """Can `alt` be served by `device` as published? For a multi-allocatable device, also
        writes what it consumes into `amount` (one row of capacity columns, `layout.dims`)."""
        if alt.admin:
            return requested_amounts(alt.capacity, device, alt.memory_percent) is not None
        if not device.allow_multiple:
            requested = requested_amounts(alt.capacity, device, alt.memory_percent)
            return requested is not None and all(
                device.capacity[n].value >= v for n, v in requested.items()
            )
        amounts = self._amounts_of(alt, device)
        if amounts is None:
            return False
        for name, value in amounts:
            amount[layout.dims[name]] = value
        return True

    def _consumed(self, alt: Alternative, device: Device) -> tuple[tuple[str, int], ...]:
        """The consumedCapacity of one picked device (none for admin access or a whole device)."""
        if alt.admin or not device.allow_multiple:
            return ()
        return self._amounts_of(alt, device) or ()

    def _static_fit(
        self, layout: Layout, alt: Alternative, start: int, end: int
    ) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64]]:
        """Per device of one node: can `alt` be served by it as published (servable), and what
        it consumes per capacity column. Depends on published devices only: cached per layout."""
        key = (alt.capacity_key, alt.admin, start)
        hit = self._fits.get(key)
        if hit is not None:
            return hit
        m = end - start
        servable = np.zeros(m, dtype=np.int8)
        amount = np.zeros((m, len(layout.dims)), dtype=np.int64)
        for j in range(m):
            servable[j] = self._device_fit(alt, layout.devices[start + j], layout, amount[j])
        if len(self._fits) >= FIT_CACHE_MAX:  # many request shapes x nodes: start over
            self._fits.clear()
            self._encodings.clear()
        self._fits[key] = (servable, amount)
        return servable, amount

    # ------------------------------------------------------------ explanations

    def _reason(
        self,
        *,
        layout: Layout,
        node_ok: npt.NDArray[np.int8],
        reasons: dict[str, int],
        screened: list[Alternative],
        closeness: npt.NDArray[np.int64],
        policy: Policy,
        tried: int,
    ) -> str:
        if not node_ok.any():
            detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
            return f"no node with devices fits the pod ({detail})"
        if tried:
            return (
                f"{_plural(tried, 'node')} passed the screen but none satisfies every request "
                "together (constraints, capacity rounding, shared devices or firstAvailable)"
            )
        where = {1: " on one NUMA node", 2: " in one NVLink domain"}.get(policy.topology_mode, "")
        wants = []
        for alt in screened:
            mem = _requested(alt, "memory")
            cores = _requested(alt, "cores")
            what = "all matching GPUs" if alt.all_devices else _plural(alt.count)
            if alt.memory_percent:
                parts = [f"{alt.memory_percent}% of its memory"]
            else:
                parts = ["its whole memory" if mem < 0 else format_quantity(mem)]
            if cores > 0:
                parts.append(f"{cores} cores")
            each = " each" if alt.all_devices or alt.count > 1 else ""
            selected = " matching the selectors" if alt.own_selectors else ""
            wants.append(f"{what}{selected}{where} with {' and '.join(parts)} free{each}")
        masked = np.where(node_ok > 0, closeness, -1)
        best = int(np.argmax(masked))
        return (
            f"no node has {'; and '.join(wants) or 'room'}; closest: {layout.nodes[best]} "
            f"({_plural(int(closeness[best]))})"
        )


def _rank(found: tuple[tuple[Claim, tuple[DeviceResult, ...]], ...]) -> int:
    """How far down their `firstAvailable` lists a node's placement went: the sum, over the
    requests with subrequests, of the chosen subrequest's position (0: every first choice).
    kube-scheduler scores a node by the sum of (8 - position), so it prefers the lowest."""
    rank = 0
    for claim, results in found:
        names = {r.request for r in results}
        for request in claim.requests:
            if len(request.alternatives) > 1:
                rank += next(
                    (i for i, alt in enumerate(request.alternatives) if alt.name in names), 0
                )
    return rank


def _requested(alt: Alternative, name: str) -> int:
    """The amount of a capacity (bare name, any domain) an alternative names; -1 when none."""
    for key, value in alt.capacity:
        if key == name or key.endswith("/" + name):
            return value
    return -1
