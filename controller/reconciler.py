"""The policy path: place gated pods with the allocator, write their claims, lift the gate.

A pod opts in with the scheduling gate `vgpu.dra.dev/policy` (kube-scheduler ignores a gated pod).
For each such pod whose claims all exist (named claims, or the claims generated from templates as
listed in `status.resourceClaimStatuses`), one decision:

1. policies: the pod's `vgpu.dra.dev/*` annotations over the cluster defaults (controller flags);
2. `Allocator.place` over the model the informers keep current;
3. each claim's `status.allocation` and `status.reservedFor` (the pod) are written with the
   resourceVersion read (409 Conflict: read again and retry while the claim is still free);
4. the gate is removed (other gates kept), so kube-scheduler binds the pod to the node the
   allocations select. No condition is written on success (one API write per pod saved), only
   over a refusal reported before; a restarted controller recognises its pods by the hold.

A pod that cannot be placed gets a Warning Event and the pod condition `vgpu.dra.dev/Placement`
(False, reason, the allocator's message); it is tried again only when slices, nodes, claims or the
pod change, never in a loop. A claim deleted or taken mid-placement undoes the claims already
written for the pod. On a restart, a gated pod whose claims are all allocated for it just gets its
gate removed; one with only some of them (crash between writes) has those released and is placed
again, so a crash at any point converges.

Claims get kube-scheduler's finalizer before their allocation, so the resourceclaim controller
deallocates them after their last pod, as it does for kube-scheduler's own.

After the gate is lifted the pod is followed until kube-scheduler binds it, and its claims carry
a second consumer (the placement hold) so kube-scheduler never deallocates them itself: if
kube-scheduler refuses the chosen node (PodScheduled False/Unschedulable), the claims are placed
again without that node (`replace_pod`; docs/scheduling.md has the mechanism and its race
window); once the pod is bound (or gone, or handed over) the hold is dropped.

Layout: this module holds the controller's picture of the cluster and the decisions over it;
every API write goes through `controller.writes` (the one place effects are made, each with its
conflict retries), what a hold is through `controller.holds`, and the questions asked of pods
and claims through `controller.objects`.

Every decision is reported to an optional `ReconcileObserver` (metrics) with one of `OUTCOMES`.

Only one thread (the controller's worker) calls into this class; informers only enqueue.
Decisions are made one after another on that thread; with `write_concurrency` > 1 the writes of
a placed pod (claims, gate) run on a small thread pool so that the API round trips of
different pods overlap. A decided placement is reserved in the model before its writes start
(the next decision cannot reuse its capacity) and put back to what the cache holds if they fail;
a pod sharing a claim with a write in flight waits for it. The writes touch the reconciler's
state only under `_lock`, which the worker holds while it decides; failures are handled on the
worker thread exactly as in the serial path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import trace

from controller import holds, objects
from controller.objects import GATE, claim_names, is_gated
from controller.writes import CONDITION, FINALIZER, Retry, Writes
from dra_driver import kube
from dra_driver.allocator import request
from dra_driver.allocator.allocate import Allocator, Placement, Unschedulable
from dra_driver.allocator.model import ClusterModel, pod_requests
from dra_driver.allocator.quantity import QuantityError
from dra_driver.allocator.request import (
    ALIASES,
    Claim,
    Policy,
    RequestError,
    canonical_annotations,
    parse_claim,
)
from dra_driver.tracing import installed_tracer

log = logging.getLogger(__name__)

__all__ = [  # what the webhook, the metrics and the tests read from here
    "CONDITION",
    "FINALIZER",
    "GATE",
    "OUTCOMES",
    "POLICY_ANNOTATIONS",
    "Defaults",
    "Reconciler",
    "Retry",
    "claim_names",
    "is_gated",
]

JSON = dict[str, Any]
TRACER_NAME = "vgpu-dra.controller"
# Written by the controller into PodScheduled after placing a refused pod again, so that
# kube-scheduler's next refusal changes the condition (and so the pod) again.
REPLACED_REASON = "VgpuDraReplaced"
API_RETRY_START_S = 1.0
API_RETRY_MAX_S = 60.0


@dataclass(frozen=True, slots=True)
class Defaults:
    """Cluster default policies (controller flags): canonical annotation name -> value."""

    annotations: Mapping[str, str]

    def policy_for(self, pod: Mapping[str, Any]) -> Policy:
        given = dict(objects.meta(pod).get("annotations") or {})
        for name, value in canonical_annotations(self.annotations).items():
            if name not in given and ALIASES.get(name) not in given:  # the pod's own wins
                given[name] = value
        return Policy.from_annotations(given)


class ReconcileObserver(Protocol):
    """Told about every decision (metrics); must not raise. `outcome` is one of OUTCOMES."""

    def decided(self, outcome: str, seconds: float) -> None: ...


# What `ReconcileObserver.decided` reports: placed (claims written, gate lifted), refused (no
# placement, Event + condition), invalid (a bad claim or annotation), retry (inputs changed under
# the decision), api_error, replaced (kube-scheduler refused the node; placed again elsewhere),
# handed_over (refused and no other node: left to kube-scheduler's own allocation),
# internal_error (the decision raised what nothing foresaw: Event, and the pod waits for a change).
OUTCOMES = (
    "placed",
    "refused",
    "invalid",
    "retry",
    "api_error",
    "replaced",
    "handed_over",
    "internal_error",
)
# How much of an unexpected exception's text goes into a pod's Event and condition.
ERROR_TEXT_MAX = 300


@dataclass(slots=True)
class Placed:
    """A pod we placed whose gate is lifted, until kube-scheduler binds it (or it goes).

    `excluded` are the nodes kube-scheduler refused for it (kept for the pod's lifetime in this
    process only). `restored`: taken from its claims' hold entries after a restart. A
    refusal counts when the pod's PodScheduled is False/Unschedulable in a version newer than
    `version` (resourceVersions compared as the integers etcd makes them)."""

    key: tuple[str, str]
    node: str
    excluded: set[str]
    restored: bool = False
    version: int = 0  # the pod's resourceVersion after our last placement: older events are old


@dataclass(frozen=True, slots=True)
class _Plan:
    """A decided placement whose writes are still to be made."""

    pod: JSON
    claims: list[JSON]
    parsed: list[Claim]
    placement: Placement


@dataclass(frozen=True, slots=True)
class _InFlight:
    key: tuple[str, str]
    plan: _Plan
    span: trace.Span | None
    started: float


def _using(span: trace.Span | None) -> AbstractContextManager[Any]:
    return nullcontext() if span is None else trace.use_span(span, end_on_exit=False)


class Reconciler:
    """State mirrored from the informers plus the placement of gated pods."""

    def __init__(
        self,
        client: kube.KubeClient,
        defaults: Defaults,
        *,
        may_write: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
        observer: ReconcileObserver | None = None,
        tracer: trace.Tracer | None = None,
        write_concurrency: int = 1,
    ) -> None:
        if write_concurrency < 1:
            raise ValueError(f"write_concurrency must be at least 1, not {write_concurrency}")
        self.client = client
        self.writes = Writes(client, self.remember)  # every API write of a decision
        # Guards the state below while pod writes run on the pool (the worker holds it while
        # it decides; a write takes it only to record what it wrote).
        self._lock = threading.RLock()
        self._concurrency = write_concurrency
        self._pool: ThreadPoolExecutor | None = None  # during a batch only (no thread outlives it)
        self._inflight: dict[Future[str], _InFlight] = {}
        # None while tracing is off: no span is created at all (dra_driver.tracing).
        self._tracer = tracer if tracer is not None else installed_tracer(TRACER_NAME)
        self.defaults = defaults
        self.may_write = may_write
        # Called once per pod decided: the worker's beat during a long batch.
        self.progress: Callable[[], None] = lambda: None
        self.model = ClusterModel()
        self.allocator = Allocator(self.model)
        self.pods: dict[tuple[str, str], JSON] = {}
        self.claims: dict[tuple[str, str], JSON] = {}
        self.classes: dict[str, JSON] = {}
        self.dirty: set[tuple[str, str]] = set()  # gated pods to (re)consider
        self.waiting: set[tuple[str, str]] = set()  # gated pods refused: retried on changes
        # claim uid -> resourceVersion of our last write of it: informer events older than that
        # are stale (the cache already holds what we wrote) and are skipped
        self._written: dict[str, int] = {}
        self._reported: dict[str, str] = {}  # pod uid -> last refusal reported
        self._api_retry: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (due, delay)
        self._clock = clock
        self.observer = observer
        # Re-placement (kube-scheduler refused the node we chose), by pod uid.
        self.placed: dict[str, Placed] = {}
        self.ungated: dict[str, JSON] = {}  # the latest object of each pod in `placed`
        self.refused: set[str] = set()  # pod uids to place again
        self._replace_retry: dict[str, float] = {}  # pod uid -> when (after an API failure)
        self.held: set[tuple[str, str]] = set()  # claims carrying our hold entry
        # Ungated, unbound pods with claims that are not in `placed`: after a restart, the ones
        # whose claims carry our hold are followed again as soon as those claims are seen.
        self.unbound: dict[str, JSON] = {}
        self.handed_over: set[str] = set()  # pod uids left to kube-scheduler, until bound or gone

    # ------------------------------------------------------------ events

    def on_event(self, kind: str, op: str, obj: JSON) -> None:
        key = objects.nsname(obj)
        if kind == "DeviceClass":
            if op == "delete":
                self.classes.pop(key[1], None)
            else:
                self.classes[key[1]] = obj
            self._retry_waiting()
            return
        if kind == "Pod":
            if op == "delete" or not is_gated(obj):
                self.pods.pop(key, None)
                self.dirty.discard(key)
                self.waiting.discard(key)
                self._reported.pop(str(objects.meta(obj).get("uid")), None)
            else:
                self.pods[key] = obj
                self.dirty.add(key)
            self._track_placed(op, obj)
        elif kind == "ResourceClaim":
            uid = str(objects.meta(obj).get("uid"))
            allocated = bool((obj.get("status") or {}).get("allocation"))
            old = self.claims.get(key)
            if op == "delete":
                self.claims.pop(key, None)
                self._written.pop(uid, None)
            else:
                if uid in self._written and objects.version(obj) < self._written[uid]:
                    # An event older than our own write: keep what we wrote until it arrives.
                    return
                self._written.pop(uid, None)
                self.claims[key] = obj
            if op != "delete" and holds.held(obj):
                self.held.add(key)
                self._follow_held(obj)
            else:
                self.held.discard(key)
            if old is not None and objects.allocated(old) and not allocated:
                # kube-scheduler deallocates a claim of a pod it cannot schedule (its DRA
                # PostFilter): if we placed that pod, the node we chose was refused. This is the
                # trigger, not the pod's PodScheduled=False condition: that one arrives after
                # the deallocation, does not name the node, and keeps its time from the
                # SchedulingGated state, so it cannot tell a refusal answered already from a
                # new one.
                for consumer in (old.get("status") or {}).get("reservedFor") or []:
                    if str(consumer.get("uid")) in self.placed:
                        self.refused.add(str(consumer.get("uid")))
            self.dirty.update(p for p in self.pods if p[0] == key[0])
            self._retry_waiting()
        else:
            self._retry_waiting()
        if op == "delete":
            self.model.delete(kind, obj)
        else:
            self.model.apply(kind, obj)

    def remember(self, claim: JSON) -> None:
        """Take a claim as this process just wrote it (the API's answer) into the view and the
        model at once. Until the watch delivers that version, events older than it are skipped
        (`on_event`): without this a decision made in the meantime would not see the write (the
        confirmer would take a claim it confirmed for pending and confirm an overlapping one
        before it). Every writer of claims reports here (placements, releases, holds,
        confirmations); callable from the write pool."""
        with self._lock:
            self._written[str(objects.meta(claim).get("uid"))] = objects.version(claim)
            self.claims[objects.nsname(claim)] = claim
            self.model.apply("ResourceClaim", claim)

    def _track_placed(self, op: str, pod: JSON) -> None:
        """Follow a pod we placed from the lifting of its gate until kube-scheduler binds it."""
        uid = str(objects.meta(pod).get("uid"))
        if op != "delete" and is_gated(pod):
            return  # older than the lifting of the gate (a gate never comes back)
        if op == "delete" or (pod.get("spec") or {}).get("nodeName"):
            self.placed.pop(uid, None)
            self.ungated.pop(uid, None)
            self.refused.discard(uid)
            self.unbound.pop(uid, None)
            self.handed_over.discard(uid)
            return
        record = self.placed.get(uid)
        if record is None:
            if uid in self.handed_over:
                return  # its claims may still carry the hold until `_release_holds` runs
            record = self._placed_from_hold(pod)  # placed before a restart
            if record is None:
                # Not ours (default path, a gate someone else lifted), or its claims are not
                # listed yet: the claim's event looks here again (`_follow_held`).
                if (pod.get("spec") or {}).get("resourceClaims"):
                    self.unbound[uid] = pod
                return
            self.unbound.pop(uid, None)
            self.placed[uid] = record
            # Refused while no controller ran (or before this one saw it): place it again.
            if objects.refused_by_scheduler(pod):
                self.refused.add(uid)
        elif objects.refused_by_scheduler(pod):
            newer = objects.version(pod) > record.version
            log.debug(
                "pod %s/%s: PodScheduled Unschedulable at version %d (placed at %d)%s",
                *record.key,
                objects.version(pod),
                record.version,
                "" if newer else ": seen",
            )
            if newer:
                self.refused.add(uid)
        self.ungated[uid] = pod

    def _placed_from_hold(self, pod: Mapping[str, Any]) -> Placed | None:
        """The record of a pod placed before this process started: one of its claims carries our
        hold for it (written with the allocation, so there is no window after the gate's
        lifting in which a restart loses the pod)."""
        ns = objects.nsname(pod)[0]
        uid = str(objects.meta(pod).get("uid"))
        for name in claim_names(pod) or []:
            claim = self.claims.get((ns, name))
            if claim is not None and holds.holds_for(claim, uid):
                return Placed(objects.nsname(pod), objects.node_of(claim), set(), restored=True)
        return None

    def _follow_held(self, claim: Mapping[str, Any]) -> None:
        """A claim with our hold arrived after its (ungated, unbound) pod: follow the pod."""
        for ref in (claim.get("status") or {}).get("reservedFor") or []:
            uid = holds.pod_uid(ref)
            if holds.is_hold(ref) and uid in self.unbound and uid not in self.placed:
                self._track_placed("apply", self.unbound[uid])

    def _retry_waiting(self) -> None:
        self.dirty |= self.waiting
        self.waiting.clear()

    def resync_claims(self) -> None:
        """Read every claim again (a quorum read) before allocating as a new leader: whatever the
        previous leader wrote before its lease ran out is then in the model."""
        for obj in self.client.list(kube.path(kube.RESOURCE_API, "resourceclaims")):
            self._written.pop(str(objects.meta(obj).get("uid")), None)
            self.on_event("ResourceClaim", "apply", obj)

    # ------------------------------------------------------------ decisions

    def reconcile(self) -> None:
        """Consider every dirty gated pod once (name order, for reproducible placements)."""
        now = self._clock()
        for key, (due, _) in list(self._api_retry.items()):
            if due <= now:
                self.dirty.add(key)
        for uid, due in list(self._replace_retry.items()):
            if due <= now:
                del self._replace_retry[uid]
                self.refused.add(uid)
        if self.held and self.may_write():
            self._release_holds()
        while (self.dirty or self.refused) and self.may_write():
            # Re-placements first: kube-scheduler retries such a pod after its backoff (1 s and
            # up), and the new allocation must be written before it does (docs/scheduling.md).
            for uid in sorted(self.refused):
                if not self.may_write():
                    return
                self.refused.discard(uid)
                self._replace_uid(uid)
            batch = sorted(self.dirty)
            self.dirty.clear()
            if self._concurrency > 1:
                self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="pod-write")
            try:
                for i, key in enumerate(batch):
                    if not self.may_write():
                        self.dirty.update(batch[i:])
                        return
                    self._reconcile_key(key)
            finally:
                self._settle(everything=True)  # nothing in flight outside a batch
                if self._pool is not None:
                    self._pool.shutdown()
                    self._pool = None

    def _reconcile_key(self, key: tuple[str, str]) -> None:
        self.progress()  # a long batch is progress, pod by pod (the worker's stall detection)
        pod = self.pods.get(key)
        if pod is None:
            self._api_retry.pop(key, None)
            return
        if self._inflight and self._shares_claims(pod):
            self._settle(everything=True)  # decide over the written state, as serially
        started = self._clock()
        span = (
            self._tracer.start_span(
                "place pod", attributes={"k8s.namespace.name": key[0], "k8s.pod.name": key[1]}
            )
            if self._tracer is not None
            else None
        )
        with self._lock, _using(span):
            decided = self._guarded(key, lambda: self._plan(pod))
        if isinstance(decided, _Plan):
            plan = decided
            if self._pool is not None:
                self._reserve(plan)
                while len(self._inflight) >= self._concurrency:
                    self._settle(everything=False)
                future = self._pool.submit(self._execute_traced, plan, span)
                self._inflight[future] = _InFlight(key, plan, span, started)
                return
            with _using(span):
                decided = self._guarded(key, lambda: self._execute(plan))
        assert not isinstance(decided, _Plan)
        self._finish(decided, span, started)

    def _finish(self, outcome: str | None, span: trace.Span | None, started: float) -> None:
        if span is not None:
            span.set_attribute("vgpu_dra.outcome", outcome or "waiting")
            span.end()
        self._observe(outcome, started)

    def _shares_claims(self, pod: JSON) -> bool:
        ns = objects.nsname(pod)[0]
        mine = {(ns, n) for n in claim_names(pod) or []}
        return any(
            objects.nsname(c) in mine
            for flight in self._inflight.values()
            for c in flight.plan.claims
        )

    def _reserve(self, plan: _Plan) -> None:
        """Count a decided placement in the model before it is written (the next decision must
        not reuse its capacity); `_unreserve` puts back what the cache holds."""
        with self._lock:
            for claim, spec in zip(plan.claims, plan.parsed, strict=True):
                status = {
                    **(claim.get("status") or {}),
                    "allocation": plan.placement.allocation(spec.uid),
                }
                self.model.apply("ResourceClaim", {**claim, "status": status})

    def _unreserve(self, plan: _Plan) -> None:
        with self._lock:
            for claim in plan.claims:
                self.model.apply("ResourceClaim", self.claims.get(objects.nsname(claim), claim))

    def _execute_traced(self, plan: _Plan, span: trace.Span | None) -> str:
        """A pool thread: one pod's writes."""
        with _using(span):
            return self._execute(plan)

    def _settle(self, *, everything: bool) -> None:
        """Take the results of finished writes (all of them with `everything`) on this thread."""
        if not self._inflight:
            return
        done, _ = wait(
            list(self._inflight), return_when=ALL_COMPLETED if everything else FIRST_COMPLETED
        )
        for future in sorted(done, key=lambda f: self._inflight[f].key):
            flight = self._inflight.pop(future)
            if future.exception() is not None:
                self._unreserve(flight.plan)
            outcome = self._guarded(flight.key, future.result)
            assert not isinstance(outcome, _Plan)
            self._finish(outcome, flight.span, flight.started)

    def _guarded(
        self, key: tuple[str, str], step: Callable[[], str | _Plan | None]
    ) -> str | _Plan | None:
        """Run one step of a decision; a failure is answered as the serial path always did."""
        outcome: str | _Plan | None
        try:
            outcome = step()
        except Retry as exc:
            # The change behind it (claim deleted/taken, leadership) arrives as an event and
            # brings the pod back; retrying at once could loop on a stale cache.
            log.info("pod %s/%s: %s; deciding again on the next change", key[0], key[1], exc)
            self.waiting.add(key)
            outcome = "retry"
        except kube.KubeError as exc:
            # The API failed (unreachable, 5xx, refused): no event may follow, so try again
            # after a backoff that doubles up to API_RETRY_MAX_S.
            _, delay = self._api_retry.get(key, (0.0, API_RETRY_START_S / 2))
            delay = min(delay * 2, API_RETRY_MAX_S)
            self._api_retry[key] = (self._clock() + delay, delay)
            log.warning("pod %s/%s: %s; retrying in %.0fs", key[0], key[1], exc, delay)
            outcome = "api_error"
        except Exception as exc:
            # What nothing above foresaw (a bug, an object no parser expected): this pod waits
            # for its next change with a Warning Event that says so, and the worker goes on with
            # the next pod. Before, one such pod ended the worker and placement for everyone.
            log.exception("pod %s/%s: the decision failed unexpectedly", key[0], key[1])
            self._api_retry.pop(key, None)
            self.waiting.add(key)
            pod = self.pods.get(key)
            if pod is not None:
                text = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_MAX]
                try:
                    self._refuse(
                        pod,
                        "InternalError",
                        f"the allocation controller could not decide for this pod ({text}); "
                        "it decides again when the pod or its claims change",
                    )
                except Exception:  # reporting must not fail the worker either
                    log.exception("pod %s/%s: cannot report the failure", key[0], key[1])
            outcome = "internal_error"
        else:
            if not isinstance(outcome, _Plan):  # the backoff stays until the writes succeed
                self._api_retry.pop(key, None)
        return outcome

    def _observe(self, outcome: str | None, started: float) -> None:
        if outcome is not None and self.observer is not None:
            self.observer.decided(outcome, self._clock() - started)

    def reconcile_pod(self, pod: JSON) -> str | None:
        """One decision for a gated pod; returns its outcome (OUTCOMES) or None (waiting)."""
        decided = self._plan(pod)
        return self._execute(decided) if isinstance(decided, _Plan) else decided

    def _execute(self, plan: _Plan) -> str:
        """The writes of a decided placement: every claim, then the gate and the condition."""
        self._write(plan.pod, plan.claims, plan.parsed, plan.placement)
        self._lift_gate(plan.pod, plan.placement.node)
        return "placed"

    def _plan(self, pod: JSON) -> str | _Plan | None:
        """Decide for a gated pod: an outcome reached without claim writes, or the placement
        whose writes `_execute` makes."""
        if str(objects.meta(pod).get("uid")) in self.placed:
            # We lifted its gate (a gate never comes back): this is the gated object from before,
            # still cached until the informer delivers the lifting; lifting again would only
            # repeat the gate and condition writes.
            return None
        ns = objects.nsname(pod)[0]
        names = claim_names(pod)
        if names is None:
            return None  # a template's claim is not created yet: its event brings the pod back
        claims = []
        for claim_name in names:
            claim = self.claims.get((ns, claim_name))
            if claim is None:
                return None  # not created yet (or deleted): its event brings the pod back
            claims.append(claim)
        pod_uid = str(objects.meta(pod).get("uid"))
        mine = [c for c in claims if objects.allocated_for(c, pod_uid)]
        others = [
            c for c in claims if objects.allocated(c) and not objects.allocated_for(c, pod_uid)
        ]
        if others:
            names_taken = ", ".join(objects.nsname(c)[1] for c in others)
            self._refuse(
                pod,
                "ClaimAllocatedElsewhere",
                f"claims {names_taken} are already allocated for other consumers; the policy "
                "path places only unallocated claims",
            )
            return "refused"
        if not claims:  # nothing to allocate: the default scheduler can place it
            self._lift_gate(pod, None)
            return "placed"
        if len(mine) == len(claims):
            self._lift_gate(pod, objects.node_of(mine[0]))
            return "placed"
        if mine:  # a crash between writes: release, then place all together
            for claim in mine:
                self.writes.release(claim)
            claims = [self.claims.get(objects.nsname(c), c) for c in claims]  # as released
        try:
            policy = self.defaults.policy_for(pod)
            parsed = [parse_claim(c, self.classes) for c in claims]
            placement = self.allocator.place(pod, parsed, policy, pod_requests(pod))
        except (RequestError, QuantityError, Unschedulable) as exc:
            # QuantityError: a container's cpu or memory request out of the model's range.
            invalid = not isinstance(exc, Unschedulable)
            self._refuse(pod, "InvalidRequest" if invalid else "Unschedulable", str(exc))
            return "invalid" if invalid else "refused"
        return _Plan(pod, claims, parsed, placement)

    # ------------------------------------------------------------ re-placement

    def _replace_uid(self, uid: str) -> None:
        record, pod = self.placed.get(uid), self.ungated.get(uid)
        if record is None or pod is None:
            return
        started = self._clock()
        try:
            outcome = self.replace_pod(record, pod)
        except Retry as exc:
            # Someone else (kube-scheduler's own allocation, a user) changed a claim: the pod
            # is on the default path from here.
            log.info("pod %s/%s: %s; left to kube-scheduler", *record.key, exc)
            self._forget(uid)
            outcome = "handed_over"
        except kube.KubeError as exc:
            log.warning("pod %s/%s: re-placement failed: %s; retrying", *record.key, exc)
            self._replace_retry[uid] = self._clock() + API_RETRY_START_S
            outcome = "api_error"
        self._observe(outcome, started)

    def replace_pod(self, record: Placed, pod: JSON) -> str | None:
        """kube-scheduler refused the node we chose for `pod`: place its claims again without
        that node (nor any it refused before), releasing and rewriting each claim back to back.

        A gate cannot be put back on a pod, so the new allocation is the only lever; between a
        claim's release and its new allocation kube-scheduler, woken by the release, could
        allocate it itself (then the pod is left to it: `Retry` in `_replace_uid`).
        """
        uid = str(objects.meta(pod).get("uid"))
        ns = record.key[0]
        names = claim_names(pod) or []
        claims = [self.claims.get((ns, n)) for n in names]
        if not names or any(c is None for c in claims):
            return None  # a claim is gone or not seen yet: its event brings the pod back
        present = [c for c in claims if c is not None]
        foreign = [c for c in present if objects.allocated(c) and objects.node_of(c) != record.node]
        if foreign:
            log.info(
                "pod %s/%s: claim %s allocated on %s by someone else; left to kube-scheduler",
                *record.key,
                objects.nsname(foreign[0])[1],
                objects.node_of(foreign[0]),
            )
            self._forget(uid)
            return "handed_over"
        refused_node = record.node
        record.excluded.add(refused_node)
        excluded = ", ".join(sorted(record.excluded))
        try:
            policy = self.defaults.policy_for(pod)
            parsed = [parse_claim(c, self.classes) for c in present]
            placement = self.allocator.place(
                objects.excluding(pod, record.excluded), parsed, policy, pod_requests(pod)
            )
        except (RequestError, Unschedulable) as exc:
            message = (
                f"kube-scheduler refused node {excluded} and no other node fits ({exc}); "
                "the pod is left to kube-scheduler's own allocation"
            )
            self._forget(uid)
            self._refuse(pod, "Unschedulable", message, retry=False)
            return "handed_over"
        self._write(pod, present, parsed, placement, release_first=True)
        record.node = placement.node
        log.info(
            "pod %s/%s: kube-scheduler refused node %s; placed again on %s",
            *record.key,
            refused_node,
            placement.node,
        )
        message = f"devices allocated on node {placement.node} (kube-scheduler refused {excluded})"
        now = objects.now()
        try:
            patched = self.writes.set_conditions(
                record.key,
                [
                    {
                        "type": CONDITION,
                        "status": "True",
                        "reason": "Replaced",
                        "message": message,
                        "lastTransitionTime": now,
                    },
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": REPLACED_REASON,
                        "message": message,
                        "lastTransitionTime": now,
                    },
                ],
            )
            record.version = max(record.version, objects.version(patched))
        except kube.KubeError as exc:
            # Without the reset a second refusal may go unnoticed (the pod would stay pending
            # with its claims on the new node): log it, the placement itself stands.
            log.warning("pod %s/%s: cannot update its conditions: %s", *record.key, exc)
        return "replaced"

    def _forget(self, uid: str) -> None:
        self.handed_over.add(uid)
        self.placed.pop(uid, None)
        self.ungated.pop(uid, None)
        self.refused.discard(uid)
        self._replace_retry.pop(uid, None)

    def _write(
        self,
        pod: JSON,
        claims: list[JSON],
        parsed: list[Claim],
        placement: Placement,
        *,
        release_first: bool = False,
    ) -> None:
        """Write every claim's allocation; `release_first` clears one still allocated (for this
        pod, on a refused node) just before its new allocation is written."""
        ns, name = objects.nsname(pod)
        pod_uid = str(objects.meta(pod).get("uid"))
        reserved = [{"resource": "pods", "name": name, "uid": pod_uid}, holds.entry(name, pod_uid)]
        written: list[JSON] = []
        try:
            for claim, spec in zip(claims, parsed, strict=True):
                allocation = placement.allocation(spec.uid)
                allocation["allocationTimestamp"] = objects.now()
                free = claim
                if release_first and objects.allocated_for(claim, pod_uid):
                    free = self.writes.release(claim)
                written.append(self.writes.allocate(free, allocation, reserved, self.may_write))
        except BaseException:
            for done in written:
                self.writes.release(done)
            raise
        log.info(
            "pod %s/%s: %d claim(s) allocated on node %s", ns, name, len(written), placement.node
        )

    def _lift_gate(self, pod: JSON, node: str | None) -> None:
        ns, name = objects.nsname(pod)
        lifted = self.writes.lift_gate(pod)
        if lifted is None:
            return  # the pod is gone
        uid = str(objects.meta(pod).get("uid"))
        if node is not None:
            # Followed from now on: kube-scheduler may refuse the node before the informer
            # delivers the pod without its gate.
            with self._lock:
                self.placed[uid] = Placed((ns, name), node, set(), version=objects.version(lifted))
                self.ungated[uid] = lifted
        with self._lock:
            refused_before = self._reported.pop(uid, None) is not None
        # A success writes no condition (one API write less per pod; the claims' hold entries
        # are what a restarted controller follows): only a refusal reported earlier, by this
        # process or a previous one, is replaced so that it does not outlive the placement.
        if refused_before or objects.condition(pod, CONDITION).get("status") == "False":
            if node is None:
                self.writes.set_condition(pod, "True", "NoClaims", "the pod has no resource claims")
            else:
                self.writes.set_condition(pod, "True", "Placed", f"{PLACED_ON}{node}")

    def drop_all_holds(self) -> None:
        """On a graceful stop of the leader: drop every hold, so that no claim depends on a
        controller that may never come back (an uninstall). Pods still between their gate's
        lifting and their binding lose the protection described in docs/scheduling.md."""
        self.placed.clear()
        self.ungated.clear()
        self.refused.clear()
        self._release_holds()

    def _release_holds(self) -> None:
        """Drop our hold from every claim whose pod we no longer follow (bound, gone, handed over
        to kube-scheduler), so that the resourceclaim controller can deallocate it after the pod
        as it does any claim. Runs over a complete picture only (the worker reconciles once every
        informer has listed), so a pod not listed yet is never taken for a gone one."""
        for key in sorted(self.held):
            claim = self.claims.get(key)
            if claim is None:
                self.held.discard(key)
                continue
            kept = holds.kept(claim, self.placed)
            if kept is None:
                continue
            if self.writes.set_reserved(claim, kept) is None:
                continue  # changed meanwhile (its event brings it back here) or failed (logged)
            self.held.discard(key)
            log.info("claim %s/%s: placement hold dropped", *key)

    # ------------------------------------------------------------ reporting

    def _refuse(self, pod: JSON, reason: str, message: str, *, retry: bool = True) -> None:
        ns, name = objects.nsname(pod)
        if retry:
            self.waiting.add((ns, name))
        uid = str(objects.meta(pod).get("uid"))
        if self._reported.get(uid) == message:
            return  # said already; a changed reason is reported again
        self._reported[uid] = message
        log.info("pod %s/%s not placed: %s", ns, name, message)
        # The Event first: whoever sees the condition finds the Event already there.
        self.writes.event(pod, reason, message)
        self.writes.set_condition(pod, "False", reason, message)


PLACED_ON = "devices allocated on node "


# Controller flag -> the annotation whose cluster default it sets.
POLICY_ANNOTATIONS = {
    "node_policy": request.NODE_POLICY,
    "device_policy": request.DEVICE_POLICY,
    "topology": request.TOPOLOGY,
}
