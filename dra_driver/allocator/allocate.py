"""Place a pod's claims: the best (node, devices, consumed capacity, shareIDs) or a reason.

One decision, in three steps, all over the incrementally maintained `ClusterModel`:

1. Node fit (cached per pod shape and model epoch): selector, affinity, taints, unschedulable,
   cpu/memory.
2. The scan (`kernel.scan`, or its Cython twin `_fastkernel.scan` when built): for every node,
   every request with one alternative is screened on free memory/cores, selectability (CEL,
   include/exclude, device taints; cached per device generation) and topology, and the node gets
   its policy key. Only this step touches nodes x devices.
3. The exact search, on the best-keyed node only (then the next, if it fails): capacity
   requestPolicy rounding, several requests and claims sharing devices, firstAvailable in order,
   matchAttribute/distinctAttribute, All mode, topology groups first (smallest NVLink domain that
   fits), devices ordered by the device policy. It is plain Python shared by both paths, so the
   two paths differ only in step 2 and give identical answers
   (tests/unit/dra_driver/allocator/test_kernel_twins.py).

Refusals explain themselves with the closest node ("no node has 2 GPUs in one NVLink domain with
20Gi and 30 cores free each; closest: node-3 (1 GPU)").
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dra_driver.allocator import kernel as py_kernel
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
    from dra_driver.allocator import _fastkernel

    FAST_KERNEL: Callable[..., None] | None = _fastkernel.scan
except ImportError:  # extension not built: the reference kernel serves, only slower
    FAST_KERNEL = None

JSON = dict[str, Any]
SEARCH_BUDGET = 20_000  # device choices tried per node before the node counts as not fitting


class Unschedulable(Exception):
    """No placement exists; `str()` is a reason a user understands."""


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """One allocated device of one request, as it will appear in the claim's allocation."""

    request: str
    driver: str
    pool: str
    device: str
    consumed: tuple[tuple[str, int], ...]  # qualified capacity name -> amount
    share_id: str | None
    admin: bool
    tolerations: tuple[JSON, ...] = ()

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


@dataclass(frozen=True, slots=True)
class Placement:
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


def _share_id(claim_uid: str, request: str, device: Device, index: int) -> str:
    """Deterministic per (claim, request, device, position): both paths produce the same IDs."""
    digest = hashlib.sha256(f"{claim_uid}/{request}/{'/'.join(device.key)}/{index}".encode())
    return str(uuid.UUID(bytes=digest.digest()[:16], version=4))


def _plural(n: int, word: str = "GPU") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class _Budget(Exception):
    pass


@dataclass(slots=True)
class _Search:
    """Mutable state of the exact search on one node."""

    extra: dict[tuple[str, str, str], dict[str, int]]
    taken: dict[tuple[str, str, str], int]
    values: dict[tuple[int, int], Any]  # (claim index, constraint index) -> matched value
    seen: dict[tuple[int, int], list[Any]]  # distinct values in use
    steps: int


class Allocator:
    """Decisions over one `ClusterModel`; `fast=False` forces the pure-Python reference scan."""

    def __init__(self, model: ClusterModel, *, fast: bool | None = None) -> None:
        if fast and FAST_KERNEL is None:
            raise RuntimeError("the Cython kernel is not built (make native)")
        self.model = model
        self.scan: Callable[..., None] = (
            FAST_KERNEL if (fast is not False and FAST_KERNEL is not None) else py_kernel.scan
        )
        self._masks: dict[tuple[Any, ...], npt.NDArray[np.int8]] = {}
        self._mask_drivers: dict[tuple[Any, ...], set[str]] = {}
        self._mask_epoch = -1
        self._cel: dict[tuple[str, tuple[str, str, str]], tuple[int, bool | str]] = {}
        self._amounts: dict[tuple[Any, ...], tuple[int, tuple[tuple[str, int], ...] | None]] = {}
        self._static: dict[str, tuple[int, npt.NDArray[np.int8], dict[str, int]]] = {}

    # ------------------------------------------------------------ selection

    def _selectable(self, alt: Alternative, policy: Policy, device: Device) -> bool:
        if blocking_taint(device.taints, alt.tolerations) is not None:
            return False
        if not policy.admits(device.product, device.uuid):
            return False
        for selector in alt.selectors:  # class first; stop at the first False, like the API
            cache_key = (selector.source, device.key)
            hit = self._cel.get(cache_key)
            if hit is None or hit[0] != device.generation:
                try:
                    value: bool | str = selector.matches(device.view)
                except CelError as exc:
                    value = str(exc)
                hit = (device.generation, value)
                self._cel[cache_key] = hit
            if isinstance(hit[1], str):
                raise Unschedulable(f"device {'/'.join(device.key)}: {hit[1]}")
            if not hit[1]:
                return False
        return True

    def _mask(self, layout: Layout, alt: Alternative, policy: Policy) -> npt.NDArray[np.int8]:
        if self._mask_epoch != layout.epoch:
            self._masks.clear()
            self._mask_drivers.clear()
            self._static.clear()
            # Forget CEL results of devices that are gone (the cache is keyed by device).
            devices = self.model.devices
            self._cel = {k: v for k, v in self._cel.items() if k[1] in devices}
            self._amounts = {k: v for k, v in self._amounts.items() if k[1] in devices}
            self._mask_epoch = layout.epoch
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
            self._mask_drivers[key] = {
                d.key[0] for d, m in zip(layout.devices, mask, strict=True) if m
            }
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
            if kind and drivers == {domain}:
                return kind
        return 0

    # ------------------------------------------------------------ node fit

    def _node_ok(
        self, layout: Layout, pod: Mapping[str, Any], cpu: int, mem: int
    ) -> tuple[npt.NDArray[np.int8], dict[str, int]]:
        spec = pod.get("spec") or {}
        shape = json.dumps(
            [spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")],
            sort_keys=True,
        )
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
        ok, reasons = cached[1], dict(cached[2])
        if cpu or mem:
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
        """The best placement of all `claims` together, or Unschedulable with the reason."""
        layout = self.model.layout()
        if not layout.nodes:
            raise Unschedulable("no node publishes devices (no complete ResourceSlice pool)")
        node_ok, reasons = self._node_ok(layout, pod, *pod_resources)
        flat = [(ci, req) for ci, claim in enumerate(claims) for req in claim.requests]
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
        n_dev = len(layout.devices)
        masks = np.zeros((len(screened), n_dev), dtype=np.int8)
        for row, alt in enumerate(screened):
            masks[row] = self._mask(layout, alt, policy)
        req_mem = np.asarray([_requested(a, "memory") for a in screened], dtype=np.int64)
        req_cores = np.asarray([_requested(a, "cores") for a in screened], dtype=np.int64)
        req_count = np.asarray([-1 if a.all_devices else a.count for a in screened], np.int64)
        keys = np.empty(len(layout.nodes), dtype=np.float64)
        closeness = np.empty(len(layout.nodes), dtype=np.int64)
        self.scan(
            layout.node_start,
            layout.node_end,
            node_ok,
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
            req_cores,
            req_count,
            req_group,
            policy.topology_mode,
            int(policy.strict),
            int(policy.node == "binpack"),
            keys,
            closeness,
        )
        tried = 0
        while True:
            best = int(np.argmax(keys))
            if keys[best] < 0:
                break
            tried += 1
            found = self._search_node(layout, best, claims, flat, policy)
            if found is not None:
                return Placement(layout.nodes[best], float(keys[best]), found)
            keys[best] = -1.0
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

    def commit(self, placement: Placement) -> None:
        """Count the placement's consumption in the model until the claims' updates arrive."""
        for claim, results in placement.results:
            self.model.assume(
                claim.uid,
                [
                    Consumption(
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
        claims: Sequence[Claim],
        flat: list[tuple[int, Request]],
        policy: Policy,
    ) -> tuple[tuple[Claim, tuple[DeviceResult, ...]], ...] | None:
        start, end = int(layout.node_start[node]), int(layout.node_end[node])
        state = _Search({}, {}, {}, {}, 0)
        chosen: list[tuple[Alternative, list[tuple[Device, tuple[tuple[str, int], ...]]]]] = []

        def solve(i: int) -> bool:
            if i == len(flat):
                return True
            ci, request = flat[i]
            claim = claims[ci]
            applicable = [
                (k, c)
                for k, c in enumerate(claim.constraints)
                if not c.requests or request.name in c.requests
            ]
            for alt in request.alternatives:
                mask = self._mask(layout, alt, policy)
                rows = [d for d in range(start, end) if mask[d]]
                if alt.all_devices and not rows:
                    continue
                cands = []
                for d in rows:
                    device = layout.devices[d]
                    consumed = self._consume(alt, device, state)
                    if consumed is not None:
                        cands.append((d, device, consumed))
                need = len(rows) if alt.all_devices else alt.count
                if len(cands) < need:
                    continue
                cands.sort(key=lambda c: self._device_order(layout, c[0], c[1], state, policy))
                for phase in self._phases(layout, cands, need, policy):
                    if self._pick(
                        cands=phase,
                        need=need,
                        ci=ci,
                        constraints=applicable,
                        alt=alt,
                        state=state,
                        chosen=chosen,
                        solve=solve,
                        i=i,
                    ):
                        return True
            return False

        try:
            if not solve(0):
                return None
        except _Budget:
            return None
        out: dict[int, list[DeviceResult]] = {}
        for (ci, _), (alt, picks) in zip(flat, chosen, strict=True):
            for position, (device, consumed) in enumerate(picks):
                share = (
                    _share_id(claims[ci].uid, alt.name, device, position)
                    if device.allow_multiple and not alt.admin
                    else None
                )
                out.setdefault(ci, []).append(
                    DeviceResult(
                        alt.name,
                        device.key[0],
                        device.key[1],
                        device.key[2],
                        consumed,
                        share,
                        alt.admin,
                        alt.tolerations,
                    )
                )
        return tuple((claim, tuple(out.get(ci, []))) for ci, claim in enumerate(claims))

    def _consume(
        self, alt: Alternative, device: Device, state: _Search
    ) -> tuple[tuple[str, int], ...] | None:
        """What `alt` would consume of `device` now, or None when it does not fit."""
        if alt.admin:
            return () if requested_amounts(alt.capacity, device) is not None else None
        if not device.allow_multiple:
            requested = requested_amounts(alt.capacity, device)
            if requested is None:
                return None
            if self.model.allocations.get(device.key, 0) > 0 or state.taken.get(device.key):
                return None
            if any(device.capacity[n].value < v for n, v in requested.items()):
                return None
            return ()
        if self.model.is_held(device.key):
            return None
        # The amounts depend only on the request and the published device: cached per generation.
        cache_key = (alt.capacity, device.key)
        hit = self._amounts.get(cache_key)
        if hit is None or hit[0] != device.generation:
            hit = (device.generation, consumption(alt.capacity, device))
            self._amounts[cache_key] = hit
        amounts = hit[1]
        if amounts is None:
            return None
        used = self.model.device_used(device.key)
        extra = state.extra.get(device.key, {})
        for name, amount in amounts:
            if used.get(name, 0) + extra.get(name, 0) + amount > device.capacity[name].value:
                return None
        return amounts

    def _device_order(
        self, layout: Layout, row: int, device: Device, state: _Search, policy: Policy
    ) -> tuple[float, int]:
        extra = state.extra.get(device.key, {})
        driver = device.key[0]
        frac = 0.0
        total_mem = int(layout.mem_total[row])
        total_cores = int(layout.cores_total[row])
        if total_mem > 0:
            used = int(layout.mem_used[row]) + extra.get(f"{driver}/memory", 0)
            frac += 0.5 * (float(used) / float(total_mem))
        if total_cores > 0:
            used = int(layout.cores_used[row]) + extra.get(f"{driver}/cores", 0)
            frac += 0.5 * (float(used) / float(total_cores))
        return (-frac if policy.device == "binpack" else frac, row)

    @staticmethod
    def _phases(
        layout: Layout, cands: list[tuple[int, Device, Any]], need: int, policy: Policy
    ) -> list[list[tuple[int, Device, Any]]]:
        """Candidate lists to try in order: topology groups first, then (best effort) all."""
        mode = policy.topology_mode
        if not mode:
            return [cands]
        groups: dict[int, list[tuple[int, Device, Any]]] = {}
        for cand in cands:
            group = cand[1].numa if mode == 1 else cand[1].link
            if group >= 0:
                groups.setdefault(group, []).append(cand)
        fitting = [(g, members) for g, members in groups.items() if len(members) >= need]
        if mode == 2:  # the smallest NVLink domain that fits, so big islands stay whole
            fitting.sort(key=lambda gm: (int(layout.link_size[gm[1][0][0]]), gm[0]))
        else:
            fitting.sort(key=lambda gm: (-len(gm[1]), gm[0]))
        phases = [members for _, members in fitting]
        if not policy.strict:
            phases.append(cands)
        return phases

    def _pick(
        self,
        *,
        cands: list[tuple[int, Device, Any]],
        need: int,
        ci: int,
        constraints: list[tuple[int, Constraint]],
        alt: Alternative,
        state: _Search,
        chosen: list[Any],
        solve: Callable[[int], bool],
        i: int,
    ) -> bool:
        """Choose `need` distinct devices from `cands` in order, honouring the constraints."""
        picks: list[tuple[Device, tuple[tuple[str, int], ...]]] = []

        def step(pos: int) -> bool:
            if len(picks) == need:
                chosen.append((alt, list(picks)))
                if solve(i + 1):
                    return True
                chosen.pop()
                return False
            for j in range(pos, len(cands) - (need - len(picks)) + 1):
                state.steps += 1
                if state.steps > SEARCH_BUDGET:
                    raise _Budget
                _, device, consumed = cands[j]
                undo = self._enter(device, consumed, ci, constraints, state)
                if undo is None:
                    continue
                picks.append((device, consumed))
                if step(j + 1):
                    return True
                picks.pop()
                undo()
            return False

        return step(0)

    @staticmethod
    def _enter(
        device: Device,
        consumed: tuple[tuple[str, int], ...],
        ci: int,
        constraints: list[tuple[int, Constraint]],
        state: _Search,
    ) -> Callable[[], None] | None:
        """Tentatively take `device`; None if a constraint forbids it, else the undo."""
        set_match: list[tuple[int, int]] = []
        add_distinct: list[tuple[int, int]] = []
        for k, constraint in constraints:
            value = device.attribute(constraint.attribute)
            if value is None:
                return None  # a device without the attribute never satisfies a constraint
            slot = (ci, k)
            if constraint.distinct:
                if value in state.seen.get(slot, []):
                    return None
                add_distinct.append(slot)
            elif slot in state.values:
                if state.values[slot] != value:
                    return None
            else:
                set_match.append(slot)
        for slot in set_match:
            state.values[slot] = device.attribute(constraints_attr(constraints, slot))
        for slot in add_distinct:
            state.seen.setdefault(slot, []).append(
                device.attribute(constraints_attr(constraints, slot))
            )
        extra = state.extra.setdefault(device.key, {})
        for name, amount in consumed:
            extra[name] = extra.get(name, 0) + amount
        state.taken[device.key] = state.taken.get(device.key, 0) + 1

        def undo() -> None:
            for slot in set_match:
                del state.values[slot]
            for slot in add_distinct:
                state.seen[slot].pop()
            for name, amount in consumed:
                extra[name] -= amount
            state.taken[device.key] -= 1

        return undo

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


def constraints_attr(constraints: list[tuple[int, Constraint]], slot: tuple[int, int]) -> str:
    for k, constraint in constraints:
        if k == slot[1]:
            return constraint.attribute
    raise KeyError(slot)


def _requested(alt: Alternative, name: str) -> int:
    """The amount of a capacity (bare name, any domain) an alternative names; -1 when none."""
    for key, value in alt.capacity:
        if key == name or key.endswith("/" + name):
            return value
    return -1
