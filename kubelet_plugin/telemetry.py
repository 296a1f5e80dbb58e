"""The Preparer's observer: one call per claim feeds metrics and Events; the pods of each claim.

Why here and not in prepare.py: prepare stays about preparing. `Preparer` reports each claim's
outcome and duration to a `PrepareObserver`; `ClaimTelemetry` turns that into histogram and
counter updates (`kubelet_plugin.metrics`) and, for failures, Kubernetes Events
(`kubelet_plugin.events`). It also learns which pods a claim is reserved for by watching the
claims prepare reads anyway (`wrap_source`), so metrics and Events can name the pod without an
extra API call.

The containers of that pod which use the claim (the metrics' `container` label) are not in the
claim: with a `pod_reader`, `ClaimPods` reads the pod once per prepared claim from a background
thread (the supervised loop `claim-containers`; never on the prepare path; through a bounded
queue, dropped when full) and matches `spec.resourceClaims` (or
`status.resourceClaimStatuses` for claims made from a template) and each container's
`resources.claims`. A pod that cannot be read (no right to, gone, API down)
leaves the label empty: the label is "where known".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from dra_driver import cdi, kube
from dra_driver.supervision import Supervisor
from kubelet_plugin.background import Background
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.events import PodRef, PrepareEvents
from kubelet_plugin.metrics import PluginMetrics
from kubelet_plugin.prepare import ClaimSource, PrepareOutcome

log = logging.getLogger(__name__)

PodReader = Callable[[str, str], dict[str, Any]]  # (namespace, name) -> the Pod object
MAX_RESERVED = 256  # the API's bound on a claim's status.reservedFor


def containers_using(pod: Mapping[str, Any], claim_name: str) -> list[str]:
    """Names of the pod's containers (init containers included) that use ResourceClaim
    `claim_name`, in the pod's order."""
    spec = pod.get("spec") or {}
    generated = {
        str(entry.get("name")): entry.get("resourceClaimName")
        for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    pod_claims = {
        str(entry.get("name"))
        for entry in spec.get("resourceClaims") or []
        if (entry.get("resourceClaimName") or generated.get(str(entry.get("name")))) == claim_name
    }
    found: list[str] = []
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        uses = (container.get("resources") or {}).get("claims") or []
        if any(str(use.get("name")) in pod_claims for use in uses):
            found.append(str(container.get("name")))
    return found


class ClaimPods:
    """Claim UID -> the pods in its `status.reservedFor`, as last read by prepare, and (with a
    `pod_reader`) the containers of its pod that use it."""

    def __init__(
        self,
        pod_reader: PodReader | None = None,
        *,
        max_queued: int = 1000,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._pods: dict[str, tuple[PodRef, ...]] = {}
        self._containers: dict[str, str] = {}
        self._lock = threading.Lock()
        self._reader = pod_reader
        self._lookups: Background[tuple[str, str, str, PodRef]] = Background(
            lambda item: self._look_up(*item),
            name="claim-containers",
            max_queued=max_queued,
            supervisor=supervisor,
        )

    def wrap_source(self, source: ClaimSource) -> ClaimSource:
        """The same claim source, remembering each claim's pods on the way."""

        def read(ref: ClaimRef, timeout_s: float | None) -> dict[str, Any]:
            claim = source(ref, timeout_s)
            self.remember(ref.uid, claim)
            return claim

        return read

    def remember(self, uid: str, claim: dict[str, Any]) -> None:
        # Read before the claim is parsed: a claim of the wrong shape leaves no pods here (and
        # fails in `kubelet_plugin.claims` with a message), never an exception of this reader.
        status = claim.get("status")
        reserved = status.get("reservedFor") if isinstance(status, dict) else None
        pods = tuple(
            PodRef(name=str(entry.get("name", "")), uid=str(entry.get("uid", "")))
            for entry in (reserved if isinstance(reserved, list) else [])[:MAX_RESERVED]
            if isinstance(entry, dict) and entry.get("resource") == "pods" and entry.get("name")
        )
        with self._lock:
            self._pods[uid] = pods
            known = uid in self._containers
        if self._reader is None or known or len(pods) != 1:
            return
        meta = claim.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        lookup = (uid, str(meta.get("namespace", "")), str(meta.get("name", "")), pods[0])
        if not self._lookups.submit(lookup):
            log.debug("container lookups full or closed; claim %s stays without a container", uid)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)
            self._containers.pop(uid, None)

    def container_label(self, uid: str) -> str:
        """The `container` label of a claim's metrics: the containers of its one pod that use
        it (comma-separated), empty while unknown."""
        with self._lock:
            return self._containers.get(uid, "")

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued pod lookup is done (tests, shutdown)."""
        self._lookups.flush(timeout_s)

    def close(self) -> None:
        self._lookups.close()

    def _look_up(self, uid: str, namespace: str, claim_name: str, ref: PodRef) -> None:
        assert self._reader is not None
        try:
            pod = self._reader(namespace, ref.name)
        except kube.KubeError as exc:
            log.debug("cannot read pod %s/%s for claim %s: %s", namespace, ref.name, uid, exc)
            return
        if str((pod.get("metadata") or {}).get("uid", "")) != ref.uid:
            return  # a pod of the same name, not the claim's
        label = ",".join(containers_using(pod, claim_name))
        with self._lock:
            if self._pods.get(uid) == (ref,):  # still prepared for that pod
                self._containers[uid] = label

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
