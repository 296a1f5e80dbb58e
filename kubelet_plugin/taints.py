"""Device health as DRA device taints: which GPU conditions taint a device, with which effect, and
when the taint is lifted. Pure logic over plain data (time is passed in), unit-tested without NVML.

Why a separate module: the health monitor (`kubelet_plugin.gpu_watch`) only observes NVML and the
slice publisher only publishes; the decisions in between (is this XID the application's fault or
the GPU's? NoSchedule or NoExecute? is the quiet period over? did the GPU come back?) live here,
in one place, with the XID table the docs (docs/health.md) reproduce.

Conditions are keyed by GPU UUID, never by device name or NVML index, so they survive restarts and
hot-plug. `TaintState.to_json()`/`from_json()` is the persisted form (written by
`kubelet_plugin.taint_store`), so a restarted plugin keeps every taint, including the fatal ones.

How each kind of condition clears:
- `quiet`: a recoverable XID; lifted after `quiet_s` seconds without another recoverable XID;
- `readable`: the GPU fell off the bus / stopped answering NVML; lifted when it answers again;
- `pending`: a retired-page or row-remapping operation waits for a GPU reset; lifted when NVML no
  longer reports it pending;
- `reset`: a fatal fault; lifted only when the GPU leaves the node's enumeration and comes back
  (a reset or re-seat re-enumerates it), or when an operator removes the entry from the state file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import Enum
from typing import Any, NamedTuple

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"

# Taint keys, in the driver's domain (`<driver>/<key>`).
KEY_XID = "xid"  # a recoverable XID: NoSchedule, lifted after the quiet period
KEY_GPU_FAULT = "gpu-fault"  # a fatal XID: NoExecute, until the GPU is reset
KEY_UNREACHABLE = "unreachable"  # fell off the bus / NVML cannot read it: NoExecute while so
KEY_MEMORY = (
    "memory-errors"  # ECC retirement / row remapping: pending (NoSchedule), failed (NoExecute)
)

CLEARS_QUIET = "quiet"
CLEARS_READABLE = "readable"
CLEARS_PENDING = "pending"
CLEARS_RESET = "reset"
_CLEARS = (CLEARS_QUIET, CLEARS_READABLE, CLEARS_PENDING, CLEARS_RESET)

VALUE_FALLEN_OFF_BUS = "fallen-off-bus"
VALUE_UNREADABLE = "nvml-unreadable"
VALUE_RESET_PENDING = "reset-pending"
VALUE_REMAPPING_FAILED = "row-remapping-failed"

DEFAULT_QUIET_S = 300.0
XID_FALLEN_OFF_BUS = 79
STATE_VERSION = 1
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class XidClass(Enum):
    APPLICATION = "application"  # the program's fault: logged, the GPU stays untainted
    RECOVERABLE = "recoverable"  # NoSchedule until the quiet period passes
    FATAL = "fatal"  # NoExecute until the GPU is reset
    LOST = "lost"  # the GPU fell off the bus: NoExecute until it answers again


@dataclass(frozen=True, slots=True)
class XidInfo:
    xid_class: XidClass
    meaning: str


# The XID table (meanings from NVIDIA's published XID catalogue, classes are our policy). XIDs
# not listed are treated as recoverable: new GPUs add XIDs faster than tables follow, and a
# NoSchedule taint that lifts by itself is the cautious default for an unknown GPU-side error.
XID_TABLE: Mapping[int, XidInfo] = {
    13: XidInfo(
        XidClass.APPLICATION, "graphics engine exception (illegal instruction, bad address)"
    ),
    31: XidInfo(XidClass.APPLICATION, "GPU memory page fault (a program's illegal access)"),
    43: XidInfo(XidClass.APPLICATION, "GPU stopped processing (a program's channel was reset)"),
    45: XidInfo(XidClass.APPLICATION, "preemptive cleanup after a program was stopped"),
    68: XidInfo(XidClass.APPLICATION, "video decoder exception"),
    109: XidInfo(XidClass.APPLICATION, "context switch timeout"),
    32: XidInfo(XidClass.RECOVERABLE, "invalid or corrupted push buffer stream"),
    38: XidInfo(XidClass.RECOVERABLE, "driver firmware error"),
    56: XidInfo(XidClass.RECOVERABLE, "display engine error"),
    57: XidInfo(XidClass.RECOVERABLE, "error programming video memory interface"),
    61: XidInfo(XidClass.RECOVERABLE, "internal micro-controller breakpoint/warning"),
    63: XidInfo(XidClass.RECOVERABLE, "ECC page retirement or row remapping recorded"),
    69: XidInfo(XidClass.RECOVERABLE, "graphics engine class error"),
    92: XidInfo(XidClass.RECOVERABLE, "high single-bit ECC error rate"),
    94: XidInfo(XidClass.RECOVERABLE, "contained ECC error (the affected program was stopped)"),
    48: XidInfo(XidClass.FATAL, "double-bit ECC error"),
    62: XidInfo(XidClass.FATAL, "internal micro-controller halt"),
    64: XidInfo(XidClass.FATAL, "ECC page retirement or row remapping recording failure"),
    74: XidInfo(XidClass.FATAL, "NVLink error"),
    95: XidInfo(XidClass.FATAL, "uncontained ECC error"),
    119: XidInfo(XidClass.FATAL, "GSP RPC timeout"),
    120: XidInfo(XidClass.FATAL, "GSP error"),
    140: XidInfo(XidClass.FATAL, "unrecovered ECC error"),
    XID_FALLEN_OFF_BUS: XidInfo(XidClass.LOST, "GPU has fallen off the bus"),
}


def classify_xid(xid: int) -> XidInfo:
    return XID_TABLE.get(
        xid, XidInfo(XidClass.RECOVERABLE, "unlisted XID (treated as recoverable)")
    )


class _Kind(NamedTuple):
    key: str
    value: str
    effect: str
    clears: str


# The fixed kinds of condition (the XID kinds carry the XID in their value: `_xid_kind`).
_FALLEN_OFF_BUS = _Kind(KEY_UNREACHABLE, VALUE_FALLEN_OFF_BUS, NO_EXECUTE, CLEARS_READABLE)
_UNREADABLE = _Kind(KEY_UNREACHABLE, VALUE_UNREADABLE, NO_EXECUTE, CLEARS_READABLE)
_REMAPPING_FAILED = _Kind(KEY_MEMORY, VALUE_REMAPPING_FAILED, NO_EXECUTE, CLEARS_RESET)
_RESET_PENDING = _Kind(KEY_MEMORY, VALUE_RESET_PENDING, NO_SCHEDULE, CLEARS_PENDING)


def _xid_kind(xid: int, xid_class: XidClass) -> _Kind | None:
    """The condition an XID of this class raises; None for the application's own faults."""
    if xid_class is XidClass.APPLICATION:
        return None
    if xid_class is XidClass.LOST:
        return _FALLEN_OFF_BUS
    if xid_class is XidClass.FATAL:
        return _Kind(KEY_GPU_FAULT, f"xid-{xid}", NO_EXECUTE, CLEARS_RESET)
    return _Kind(KEY_XID, f"xid-{xid}", NO_SCHEDULE, CLEARS_QUIET)


@dataclass(frozen=True, slots=True)
class Condition:
    """One reason to taint one GPU. `since` is when it started (the taint's timeAdded)."""

    uuid: str
    key: str
    value: str
    effect: str
    clears: str
    since: float  # unix seconds
    last_seen: float
    message: str = ""


@dataclass(frozen=True, slots=True)
class Change:
    """A condition that appeared (`added`) or was lifted; for logs and the health stream."""

    condition: Condition
    added: bool


class TaintState:
    """Every active condition of this node's GPUs. Not thread-safe: one owner (the monitor)."""

    def __init__(self, *, quiet_s: float = DEFAULT_QUIET_S) -> None:
        if not quiet_s > 0:
            raise ValueError(f"quiet period must be > 0 seconds, got {quiet_s!r}")
        self.quiet_s = quiet_s
        self._conditions: dict[tuple[str, str], Condition] = {}
        self._absent: set[str] = set()  # GPUs that left the enumeration (for the reset rule)

    # ---- observations ------------------------------------------------------------------------

    def on_xid(self, uuid: str, xid: int, now: float) -> list[Change]:
        info = classify_xid(xid)
        kind = _xid_kind(xid, info.xid_class)
        if kind is None:
            return []
        return self._set(uuid, kind, now, f"XID {xid}: {info.meaning}")

    def on_probe(self, uuid: str, *, lost: bool, error: str, now: float) -> list[Change]:
        """Result of asking NVML about the GPU: `lost` (GPU_IS_LOST), another `error`, or fine."""
        if lost:
            return self._set(uuid, _FALLEN_OFF_BUS, now, f"NVML reports the GPU lost: {error}")
        if error:
            return self._set(uuid, _UNREADABLE, now, f"NVML cannot read the GPU: {error}")
        return self._clear(uuid, lambda c: c.clears == CLEARS_READABLE)

    def on_memory(self, uuid: str, *, pending: bool, failed: bool, now: float) -> list[Change]:
        """Retired pages / row remapping: `pending` a reset, or remapping `failed`."""
        if failed:
            message = "row remapping failed: memory errors can no longer be repaired"
            return self._set(uuid, _REMAPPING_FAILED, now, message)
        if pending:
            message = "retired pages or remapped rows wait for a GPU reset"
            return self._set(uuid, _RESET_PENDING, now, message)
        return self._clear(uuid, lambda c: c.key == KEY_MEMORY and c.clears == CLEARS_PENDING)

    def on_enumeration(self, present: Iterable[str], removed: Iterable[str]) -> list[Change]:
        """A fresh enumeration: `present` GPUs answered, `removed` ones are gone from it.

        A removed GPU is not a sick one: its `readable` condition goes (it is unpublished). A GPU
        seen again after being removed was re-enumerated (reset, re-seated): its `reset`
        conditions are lifted too.
        """
        changes: list[Change] = []
        for uuid in removed:
            self._absent.add(uuid)
            changes += self._clear(uuid, lambda c: c.clears == CLEARS_READABLE)
        for uuid in present:
            if uuid in self._absent:
                self._absent.discard(uuid)
                changes += self._clear(uuid, lambda c: c.clears == CLEARS_RESET)
        return changes

    def expire(self, now: float) -> list[Change]:
        """Lift recoverable-XID conditions whose quiet period has passed."""
        changes: list[Change] = []
        for key, cond in list(self._conditions.items()):
            if cond.clears == CLEARS_QUIET and now - cond.last_seen >= self.quiet_s:
                del self._conditions[key]
                changes.append(Change(cond, added=False))
        return changes

    # ---- views -------------------------------------------------------------------------------

    def conditions(self, uuid: str | None = None) -> list[Condition]:
        return sorted(
            (c for c in self._conditions.values() if uuid is None or c.uuid == uuid),
            key=lambda c: (c.uuid, c.key),
        )

    def has(self, uuid: str, key: str) -> bool:
        return (uuid, key) in self._conditions

    def taints(self, driver: str) -> dict[str, list[dict[str, Any]]]:
        """GPU UUID -> its DRA device taints (`key`, `value`, `effect`, `timeAdded`)."""
        result: dict[str, list[dict[str, Any]]] = {}
        for cond in self.conditions():
            result.setdefault(cond.uuid, []).append(device_taint(driver, cond))
        return result

    # ---- persistence -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "conditions": [
                {
                    "uuid": c.uuid,
                    "key": c.key,
                    "value": c.value,
                    "effect": c.effect,
                    "clears": c.clears,
                    "since": c.since,
                    "lastSeen": c.last_seen,
                    "message": c.message,
                }
                for c in self.conditions()
            ],
            "absent": sorted(self._absent),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, quiet_s: float = DEFAULT_QUIET_S) -> TaintState:
        """Inverse of `to_json`; ValueError names what is wrong."""
        if doc.get("version") != STATE_VERSION:
            raise ValueError(
                f"unsupported version {doc.get('version')!r} (expected {STATE_VERSION})"
            )
        state = cls(quiet_s=quiet_s)
        for position, entry in enumerate(doc.get("conditions") or []):
            try:
                cond = Condition(
                    uuid=str(entry["uuid"]),
                    key=str(entry["key"]),
                    value=str(entry["value"]),
                    effect=str(entry["effect"]),
                    clears=str(entry["clears"]),
                    since=float(entry["since"]),
                    last_seen=float(entry["lastSeen"]),
                    message=str(entry.get("message") or ""),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"condition {position}: {exc!r}") from exc
            if cond.effect not in (NO_SCHEDULE, NO_EXECUTE) or cond.clears not in _CLEARS:
                raise ValueError(f"condition {position}: bad effect or clears in {entry!r}")
            state._conditions[(cond.uuid, cond.key)] = cond
        state._absent = {str(u) for u in doc.get("absent") or []}
        return state

    # ---- internals ---------------------------------------------------------------------------

    def _set(self, uuid: str, kind: _Kind, now: float, message: str) -> list[Change]:
        key, value, effect, clears = kind
        known = self._conditions.get((uuid, key))
        if known is not None and known.value == value and known.effect == effect:
            self._conditions[(uuid, key)] = replace(known, last_seen=now)
            return []
        since = known.since if known is not None and known.effect == effect else now
        cond = Condition(uuid, key, value, effect, clears, since, now, message)
        self._conditions[(uuid, key)] = cond
        return [Change(cond, added=True)]

    def _clear(self, uuid: str, which: Callable[[Condition], bool]) -> list[Change]:
        changes = []
        for key, cond in list(self._conditions.items()):
            if cond.uuid == uuid and which(cond):
                del self._conditions[key]
                changes.append(Change(cond, added=False))
        return changes


def device_taint(driver: str, cond: Condition) -> dict[str, Any]:
    """The DRA `DeviceTaint` of a condition (the key in the driver's domain)."""
    value = cond.value if _LABEL_VALUE.match(cond.value) else "invalid"
    return {
        "key": f"{driver}/{cond.key}",
        "value": value,
        "effect": cond.effect,
        "timeAdded": rfc3339(cond.since),
    }


def rfc3339(unix_s: float) -> str:
    return datetime.fromtimestamp(int(unix_s), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
