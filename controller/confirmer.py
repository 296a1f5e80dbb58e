"""Confirm each allocation of a device with binding conditions against all others, before binding.

Two allocators work on one cluster: kube-scheduler (default path) and this controller (policy
path). Neither sees the other's decisions in flight, so both can give the same GPU capacity away.
With `--binding-conditions` the kubelet plugin publishes every GPU with the binding condition
`vgpu.dra.dev/CapacityConfirmed` and the failure condition `vgpu.dra.dev/Overbooked`
(`dra_driver.slices`). kube-scheduler copies them into each allocation it makes and, in PreBind,
waits until the claim's `status.devices[]` has the first True (it polls every 5 s); the second
True makes it deallocate the claim and schedule the pod again.

This module is the one place that sets them. Over every allocated claim the controller knows:

- *committed*: results without our binding conditions (the controller's own allocations, which it
  decided over everything it knew; claims of devices published without conditions) or with
  CapacityConfirmed True;
- *pending*: results with the conditions and neither set yet; a claim with OVERBOOKED True is
  ignored (kube-scheduler is about to clear it).

Pending claims are taken in allocation order (`allocationTimestamp`, then uid) and each is
confirmed if all its devices still have room for it on top of what is committed and confirmed
before it (memory and cores summed against the published capacity; a device without
`allowMultipleAllocations` holds one claim), else failed as Overbooked with the numbers. So a
kube-scheduler allocation that overlaps a policy-path allocation, or another kube-scheduler
allocation confirmed earlier, never reaches a node.

Each decision is written with the claim's resourceVersion and put into the reconciler's view at
once (`Reconciler.remember`): a confirmation counts as committed from its write on. Were the
confirmer to wait for the watch to bring it back, a pass in between would still see that claim
as pending, could sort an overlapping claim seen after it ahead of it (the same whole-second
`allocationTimestamp`, a smaller uid) and confirm that one too: both bound, one refused by the
node's guard (the stale write failing the first only meets a 409).

Only the leader writes (`may_write`); only the worker thread calls in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from dra_driver import kube, slices
from dra_driver.allocator.model import ClusterModel, parse_quantity

log = logging.getLogger(__name__)

JSON = dict[str, Any]
DeviceKey = tuple[str, str, str]
CONFIRMED = slices.CONDITION_CONFIRMED
OVERBOOKED = slices.CONDITION_OVERBOOKED


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _results(claim: Mapping[str, Any]) -> list[JSON]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [dict(r) for r in (allocation.get("devices") or {}).get("results") or []]


def _device_status(claim: Mapping[str, Any], result: Mapping[str, Any]) -> JSON:
    for entry in (claim.get("status") or {}).get("devices") or []:
        if (
            entry.get("driver") == result.get("driver")
            and entry.get("pool") == result.get("pool")
            and entry.get("device") == result.get("device")
            and entry.get("shareID") == result.get("shareID")
        ):
            return dict(entry)
    return {}


def _condition_true(entry: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in entry.get("conditions") or []
    )


def state(claim: Mapping[str, Any]) -> str:
    """'committed', 'pending' or 'failed' (see the module docstring)."""
    mine = [r for r in _results(claim) if CONFIRMED in (r.get("bindingConditions") or [])]
    if any(_condition_true(_device_status(claim, r), OVERBOOKED) for r in mine):
        return "failed"
    if all(_condition_true(_device_status(claim, r), CONFIRMED) for r in mine):
        return "committed"
    return "pending"


class Confirmer:
    """Sets CapacityConfirmed / Overbooked on pending allocations (leader only)."""

    def __init__(
        self,
        client: kube.KubeClient,
        model: ClusterModel,
        claims: Mapping[tuple[str, str], JSON],
        remember: Callable[[JSON], None],
        *,
        may_write: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        self.model = model
        self.claims = claims  # the reconciler's view of every claim (its own writes included)
        # Puts each claim as written into that view (Reconciler.remember): a confirmation counts
        # as committed from the write on, not from the watch's delivery of it.
        self.remember = remember
        self.may_write = may_write
        self.dirty = False

    def on_claim(self, claim: Mapping[str, Any]) -> None:
        if _results(claim) and state(claim) == "pending":
            self.dirty = True

    def run(self) -> dict[str, int]:
        """Decide every pending claim once; returns how many were confirmed / failed."""
        done = {"confirmed": 0, "overbooked": 0}
        if not self.dirty or not self.may_write():
            return done
        self.dirty = False
        used: dict[DeviceKey, dict[str, int]] = {}
        holders: dict[DeviceKey, int] = {}
        pending: list[JSON] = []
        for claim in self.claims.values():
            if not _results(claim):
                continue
            kind = state(claim)
            if kind == "pending":
                pending.append(claim)
            elif kind == "committed":
                self._add(claim, used, holders)
        pending.sort(key=_allocation_order)
        for claim in pending:
            why = self._misfit(claim, used, holders)
            if why is None and any(self._unknown(r) for r in _results(claim)):
                self.dirty = True  # its slice is not seen yet: decide once it is
                continue
            try:
                if why is None:
                    self._add(claim, used, holders)
                    self._set(claim, CONFIRMED, "CapacityConfirmed", "no other claim overbooks")
                    done["confirmed"] += 1
                else:
                    self._set(claim, OVERBOOKED, "Overbooked", why)
                    done["overbooked"] += 1
            except (kube.Conflict, kube.NotFound):
                log.info("claim %s/%s changed before its decision was written", *_key(claim))
                self.dirty = True  # changed meanwhile: its event brings the next look
            except kube.KubeError:
                self.dirty = True  # the API failed: decide again on the worker's next pass
                raise
        return done

    # ------------------------------------------------------------ accounting

    def _unknown(self, result: Mapping[str, Any]) -> bool:
        key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
        return key not in self.model.devices

    def _amounts(self, result: Mapping[str, Any]) -> tuple[DeviceKey, dict[str, int]]:
        driver = str(result.get("driver"))
        key = (driver, str(result.get("pool")), str(result.get("device")))
        amounts = {
            (name if "/" in name else f"{driver}/{name}"): parse_quantity(str(value))
            for name, value in (result.get("consumedCapacity") or {}).items()
        }
        return key, amounts

    def _add(
        self,
        claim: Mapping[str, Any],
        used: dict[DeviceKey, dict[str, int]],
        holders: dict[DeviceKey, int],
    ) -> None:
        for result in _results(claim):
            if result.get("adminAccess"):
                continue
            key, amounts = self._amounts(result)
            have = used.setdefault(key, {})
            for name, amount in amounts.items():
                have[name] = have.get(name, 0) + amount
            holders[key] = holders.get(key, 0) + 1

    def _misfit(
        self,
        claim: Mapping[str, Any],
        used: dict[DeviceKey, dict[str, int]],
        holders: dict[DeviceKey, int],
    ) -> str | None:
        """Why the claim does not fit on top of `used` (None: it fits)."""
        extra: dict[DeviceKey, dict[str, int]] = {}
        for result in _results(claim):
            if result.get("adminAccess"):
                continue
            key, amounts = self._amounts(result)
            device = self.model.devices.get(key)
            if device is None:
                continue
            if not device.allow_multiple and (holders.get(key, 0) > 0 or key in extra):
                return f"device {'/'.join(key)} is already allocated to another claim"
            mine = extra.setdefault(key, {})
            for name, amount in amounts.items():
                mine[name] = mine.get(name, 0) + amount
                capacity = device.capacity.get(name)
                total = used.get(key, {}).get(name, 0) + mine[name]
                if capacity is not None and total > capacity.value:
                    return (
                        f"device {'/'.join(key)}: {name.rsplit('/', 1)[-1]} {total} would be "
                        f"allocated in total, capacity {capacity.value}"
                    )
        return None

    # ------------------------------------------------------------ writes

    def _set(self, claim: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        ns, name = _key(claim)
        status = dict(claim.get("status") or {})
        entries = [dict(e) for e in status.get("devices") or []]
        now = _now()
        for result in _results(claim):
            if CONFIRMED not in (result.get("bindingConditions") or []):
                continue
            current = _device_status(claim, result)
            entry = current or {
                k: result[k] for k in ("driver", "pool", "device", "shareID") if result.get(k)
            }
            conditions = [c for c in entry.get("conditions") or [] if c.get("type") != kind]
            conditions.append(
                {
                    "type": kind,
                    "status": "True",
                    "reason": reason,
                    "message": message[:1024],
                    "lastTransitionTime": now,
                }
            )
            entry["conditions"] = conditions
            if current:
                entries = [entry if _same(e, entry) else e for e in entries]
            else:
                entries.append(entry)
        status["devices"] = entries
        updated = self.client.replace(
            kube.path(
                kube.RESOURCE_API, "resourceclaims", name, namespace=ns, subresource="status"
            ),
            {**claim, "status": status},
        )
        self.remember(updated)
        log.info("claim %s/%s: %s (%s)", ns, name, reason, message)


def _key(claim: Mapping[str, Any]) -> tuple[str, str]:
    meta = claim.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _allocation_order(claim: Mapping[str, Any]) -> tuple[str, str]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    uid = str((claim.get("metadata") or {}).get("uid"))
    return str(allocation.get("allocationTimestamp") or ""), uid


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("driver", "pool", "device", "shareID"))
