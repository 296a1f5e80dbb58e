"""Recover pods whose claims failed to prepare on their node: the Rescheduling part of issue 10.

A claim can be allocated and still fail on the node: two allocators booked the same capacity
(the prepare-time guard refuses the later claim), the GPU was lost after the allocation, or the
node cannot enforce caps. The kubelet then retries the prepare forever and the pod never starts.
This module moves such a pod off the node, for both paths (default and policy):

- **Trigger**: a Warning Event on a pod whose reason says a prepare failed for good
  (`TRIGGER_REASONS`: the kubelet's `FailedPrepareDynamicResources`, our kubelet plugin's
  `PrepareOverbooked` / `PrepareFailed` / `PrepareHookUnusable`). Nothing is polled: the
  controller watches Events of that type (field selector `involvedObject.kind=Pod,type=Warning`).
- **Grace**: the pod is looked at `grace_s` after the first such Event (a claim unprepared
  meanwhile may free the capacity; the kubelet's own retries may succeed). It is recovered only
  if then it is still bound, not terminating, no container ever started, and at least one of its
  claims is allocated to one of `drivers`.
- **Recovery**: a pod with a controlling owner (ReplicaSet, Job, StatefulSet...) is evicted (the
  Eviction API: a graceful delete that honours PodDisruptionBudgets, with its uid as
  precondition) and each claim reserved for it alone is deallocated, so the owner's new pod is
  allocated afresh, elsewhere if the node cannot take it. A bare pod is never deleted:
  it gets one Warning Event `PrepareFailedNotRescheduled` saying what to do.
- **Rate**: at most `per_minute` recoveries a minute (token bucket), so a broken node or a bad
  rollout cannot make the controller delete pods in bulk; a pod over the budget waits its turn.
- **Leader only**: `may_write()` gates every action (the worker calls `run` on every replica).

Only the controller's worker thread calls into this class.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from dra_driver import kube
from dra_driver.events import ObjectRef, record_warning

log = logging.getLogger(__name__)

JSON = dict[str, Any]
TRIGGER_REASONS = frozenset(
    {"FailedPrepareDynamicResources", "PrepareOverbooked", "PrepareFailed", "PrepareHookUnusable"}
)

COMPONENT = "vgpu-dra-controller"
NOT_RESCHEDULED = "PrepareFailedNotRescheduled"
RESCHEDULED = "PrepareFailedRescheduled"
DEFAULT_GRACE_S = 30.0
DEFAULT_PER_MINUTE = 10.0


class RescheduleObserver(Protocol):
    """Told about every recovery (metrics); `outcome` is "evicted" or "reported"."""

    def rescheduled(self, outcome: str) -> None: ...


@dataclass(slots=True)
class _Candidate:
    namespace: str
    name: str
    uid: str
    reason: str
    message: str


def _meta(obj: Mapping[str, Any]) -> JSON:
    return dict(obj.get("metadata") or {})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def never_started(pod: Mapping[str, Any]) -> bool:
    """True while none of the pod's containers ever ran (init containers included)."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return False
    for key in ("initContainerStatuses", "containerStatuses"):
        for entry in status.get(key) or []:
            state, last = entry.get("state") or {}, entry.get("lastState") or {}
            if "running" in state or "terminated" in state or "terminated" in last:
                return False
            if entry.get("restartCount") or entry.get("started"):
                return False
    return True


def controller_owner(pod: Mapping[str, Any]) -> JSON | None:
    for ref in _meta(pod).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


class Rescheduler:
    """Candidates from Events, recovered after a grace time, at a bounded rate."""

    def __init__(
        self,
        client: kube.KubeClient,
        drivers: Collection[str],
        *,
        grace_s: float = DEFAULT_GRACE_S,
        per_minute: float = DEFAULT_PER_MINUTE,
        may_write: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
        observer: RescheduleObserver | None = None,
    ) -> None:
        if per_minute <= 0:
            raise ValueError(f"per_minute must be > 0, got {per_minute}")
        self.client = client
        self.drivers = frozenset(drivers)
        self.grace_s = grace_s
        self.per_minute = per_minute
        self.may_write = may_write
        self.observer = observer
        self._clock = clock
        self._due: list[tuple[float, str]] = []  # heap of (when, pod uid)
        self._candidates: dict[str, _Candidate] = {}
        self._done: dict[str, float] = {}  # pod uid -> when handled (not looked at again)
        self._tokens = 1.0
        self._refilled = clock()

    # ------------------------------------------------------------ events

    def on_event(self, op: str, event: Mapping[str, Any]) -> None:
        """A Warning Event about a pod (from the Events informer)."""
        if op == "delete" or event.get("reason") not in TRIGGER_REASONS:
            return
        target = event.get("involvedObject") or {}
        uid = str(target.get("uid") or "")
        if target.get("kind") != "Pod" or not uid:
            return
        if uid in self._candidates or uid in self._done:
            return
        self._candidates[uid] = _Candidate(
            namespace=str(target.get("namespace") or ""),
            name=str(target.get("name") or ""),
            uid=uid,
            reason=str(event.get("reason")),
            message=str(event.get("message") or ""),
        )
        heapq.heappush(self._due, (self._clock() + self.grace_s, uid))

    # ------------------------------------------------------------ work

    def next_due(self) -> float | None:
        return self._due[0][0] if self._due else None

    def run(self) -> None:
        """Handle every candidate whose grace time is over (leader only, within the rate)."""
        now = self._clock()
        self._forget_old(now)
        while self._due and self._due[0][0] <= now and self.may_write():
            _, uid = heapq.heappop(self._due)
            candidate = self._candidates.get(uid)
            if candidate is None:
                continue
            if not self._take_token(now):
                # Over budget: this pod waits until a token is due, the rest behind it.
                heapq.heappush(self._due, (now + 60.0 / self.per_minute, uid))
                return
            try:
                self._handle(candidate)
            except kube.KubeError as exc:
                log.warning("pod %s/%s: recovery failed: %s; retrying", candidate.namespace,
                            candidate.name, exc)  # fmt: skip
                heapq.heappush(self._due, (now + self.grace_s, uid))
                continue
            del self._candidates[uid]
            self._done[uid] = now

    def _take_token(self, now: float) -> bool:
        self._tokens = min(
            self.per_minute, self._tokens + (now - self._refilled) * self.per_minute / 60.0
        )
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _forget_old(self, now: float) -> None:
        """Handled pods are remembered an hour (Events live that long), then forgotten."""
        if len(self._done) > 1024:
            self._done = {u: t for u, t in self._done.items() if now - t < 3600}

    def _handle(self, c: _Candidate) -> None:
        pod_path = kube.path("v1", "pods", c.name, namespace=c.namespace)
        try:
            pod = self.client.get(pod_path)
        except kube.NotFound:
            return
        if str(_meta(pod).get("uid")) != c.uid or _meta(pod).get("deletionTimestamp"):
            return  # gone, or already replaced by a pod of the same name
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or not never_started(pod):
            log.info("pod %s/%s recovered by itself (%s)", c.namespace, c.name, c.reason)
            return
        claims = self._our_claims(pod)
        if not claims:
            return  # not our driver's claims: another driver's business
        names = ", ".join(_meta(claim).get("name", "") for claim in claims)
        owner = controller_owner(pod)
        if owner is None:
            self._event(
                pod,
                NOT_RESCHEDULED,
                f"claims {names} cannot be prepared on node {node} ({c.reason}: "
                f"{c.message[:400]}); the pod has no controller to create it again: delete it "
                "and create it again, and its claims are allocated anew",
            )
            log.info("pod %s/%s: prepare failed on %s; bare pod, reported", c.namespace, c.name,
                     node)  # fmt: skip
            self._observed("reported")
            return
        # The Eviction API: a graceful delete that honours PodDisruptionBudgets (429 while a
        # budget forbids it: retried after the grace time), with the uid as precondition.
        self.client.create(
            kube.path("v1", "pods", c.name, namespace=c.namespace, subresource="eviction"),
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": c.name, "namespace": c.namespace},
                "deleteOptions": {"preconditions": {"uid": c.uid}},
            },
        )
        for claim in claims:
            self._deallocate(claim, c.uid)
        self._event(
            pod,
            RESCHEDULED,
            f"claims {names} cannot be prepared on node {node} ({c.reason}); the pod was "
            f"evicted so that its {owner.get('kind')} {owner.get('name')} creates it again, and "
            "its claims were deallocated",
        )
        log.info("pod %s/%s: prepare failed on %s; evicted for %s %s to recreate", c.namespace,
                 c.name, node, owner.get("kind"), owner.get("name"))  # fmt: skip
        self._observed("evicted")

    def _observed(self, outcome: str) -> None:
        if self.observer is not None:
            self.observer.rescheduled(outcome)

    def _our_claims(self, pod: Mapping[str, Any]) -> list[JSON]:
        """The pod's claims that are allocated to one of our drivers."""
        ns = str(_meta(pod).get("namespace") or "")
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        found = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = entry.get("resourceClaimName") or statuses.get(entry.get("name"))
            if not name:
                continue
            try:
                claim = self.client.get(
                    kube.path(kube.RESOURCE_API, "resourceclaims", str(name), namespace=ns)
                )
            except kube.NotFound:
                continue
            allocation = (claim.get("status") or {}).get("allocation") or {}
            results = (allocation.get("devices") or {}).get("results") or []
            if any(r.get("driver") in self.drivers for r in results):
                found.append(claim)
        return found

    def _deallocate(self, claim: JSON, pod_uid: str) -> None:
        """Clear the allocation of a claim reserved for this pod alone (a shared claim is left to
        the resourceclaim controller once its other consumers are gone)."""
        meta = _meta(claim)
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        # Other pods use it (the policy path's placement hold on a pod's claims is no user).
        if any(r.get("resource") == "pods" and str(r.get("uid")) != pod_uid for r in reserved):
            return
        status = dict(claim.get("status") or {})
        for key in ("allocation", "reservedFor", "devices"):
            status.pop(key, None)
        path = kube.path(
            kube.RESOURCE_API,
            "resourceclaims",
            str(meta.get("name")),
            namespace=str(meta.get("namespace")),
            subresource="status",
        )
        try:
            self.client.replace(path, {**claim, "status": status})
        except (kube.NotFound, kube.Conflict) as exc:
            # Changed meanwhile (e.g. the resourceclaim controller released it first).
            log.info("claim %s/%s not deallocated: %s", meta.get("namespace"), meta.get("name"),
                     exc)  # fmt: skip

    def _event(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        meta = _meta(pod)
        ref = ObjectRef.pod(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))
        record_warning(self.client, ref, reason, message, component=COMPONENT)
