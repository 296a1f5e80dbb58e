"""The Preparer's observer: one call per claim feeds metrics and Events; the pods of each claim.

Why here and not in prepare.py: prepare stays about preparing. `Preparer` reports each claim's
outcome and duration to a `PrepareObserver`; `ClaimTelemetry` turns that into histogram and
counter updates (`kubelet_plugin.metrics`) and, for failures, Kubernetes Events
(`kubelet_plugin.events`). It also learns which pods a claim is reserved for by watching the
claims prepare reads anyway (`wrap_source`), so metrics and Events can name the pod without an
extra API call.
"""

from __future__ import annotations

import threading
from typing import Any

from dra_driver import cdi
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.events import PodRef, PrepareEvents
from kubelet_plugin.metrics import PluginMetrics
from kubelet_plugin.prepare import ClaimSource, PrepareOutcome


class ClaimPods:
    """Claim UID -> the pods in its `status.reservedFor`, as last read by prepare."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[PodRef, ...]] = {}
        self._lock = threading.Lock()

    def wrap_source(self, source: ClaimSource) -> ClaimSource:
        """The same claim source, remembering each claim's pods on the way."""

        def read(ref: ClaimRef, timeout_s: float | None) -> dict[str, Any]:
            claim = source(ref, timeout_s)
            self.remember(ref.uid, claim)
            return claim

        return read

    def remember(self, uid: str, claim: dict[str, Any]) -> None:
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        pods = tuple(
            PodRef(name=str(entry.get("name", "")), uid=str(entry.get("uid", "")))
            for entry in reserved
            if isinstance(entry, dict) and entry.get("resource") == "pods" and entry.get("name")
        )
        with self._lock:
            self._pods[uid] = pods

    def forget(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def of(self, uid: str) -> tuple[PodRef, ...]:
        with self._lock:
            return self._pods.get(uid, ())

    def pod_label(self, uid: str) -> str:
        """The `pod` label of a claim's metrics: its pod when exactly one, else empty."""
        pods = self.of(uid)
        return pods[0].name if len(pods) == 1 else ""


class ClaimTelemetry:
    """`PrepareObserver` feeding metrics and Events (either may be absent)."""

    def __init__(
        self,
        *,
        metrics: PluginMetrics | None,
        events: PrepareEvents | None,
        pods: ClaimPods,
    ) -> None:
        self._metrics = metrics
        self._events = events
        self._pods = pods

    def prepared(self, ref: ClaimRef, outcome: PrepareOutcome, seconds: float) -> None:
        if self._metrics is not None:
            self._metrics.observe_prepare(seconds, outcome.reason)
        if outcome.error:
            if self._events is not None:
                pods = self._pods.of(ref.uid)
                self._events.prepare_failed(ref, outcome.reason, outcome.error, pods)
            # Only prepared claims are labelled with their pod; a failed one may never be
            # unprepared, so its entry would never be dropped otherwise.
            self._pods.forget(ref.uid)

    def unprepared(self, ref: ClaimRef, error: str, seconds: float) -> None:
        if self._metrics is not None:
            reason = (
                "" if not error else "internal" if cdi.valid_claim_uid(ref.uid) else "invalid_claim"
            )
            self._metrics.observe_unprepare(seconds, reason)
        if not error:
            self._pods.forget(ref.uid)
