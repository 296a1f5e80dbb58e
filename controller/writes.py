"""Every API write of the policy path, in one place: claims allocated and released, gates
lifted, conditions, Events and placement holds dropped.

Why apart from the reconciler: the reconciler decides over its picture of the cluster (pure
planning and its own state); what reaches the API goes through here, each write with the same
rules: a stale resourceVersion (409) is answered by reading the object again and retrying a few
times; an object that vanished is the caller's `Retry` (or, for a release, nothing left to
undo); every claim this process writes is handed to `remember` at once, so the next decision
sees the write before the watch delivers it. Writes run on the worker thread or the reconciler's
write pool; this class keeps no state of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from controller.objects import GATE, allocated, meta, now, nsname
from dra_driver import kube, names
from dra_driver.events import ObjectRef, record_warning

log = logging.getLogger(__name__)

JSON = dict[str, Any]
CONDITION = names.PLACEMENT_CONDITION
COMPONENT = "vgpu-dra-controller"
# kube-scheduler's claim finalizer: with it the resourceclaim controller clears a claim's
# allocation once its last consumer is gone (without it a named claim stays allocated forever)
# and a claim in use cannot vanish. The scheduler adds it before it allocates; so do we.
FINALIZER = "resource.kubernetes.io/delete-protection"
CONFLICT_RETRIES = 5


class Retry(Exception):
    """The decision's inputs changed under it (a claim taken or deleted): decide again later."""


def _claim_path(ns: str, name: str, subresource: str | None = None) -> str:
    return kube.path(
        kube.RESOURCE_API, "resourceclaims", name, namespace=ns, subresource=subresource
    )


class Writes:
    """The policy path's API writes; `remember(claim)` is told every claim written."""

    def __init__(self, client: kube.KubeClient, remember: Callable[[JSON], None]) -> None:
        self.client = client
        self._remember = remember

    # ------------------------------------------------------------ claims

    def allocate(
        self,
        claim: JSON,
        allocation: JSON,
        reserved: list[JSON],
        may_write: Callable[[], bool],
    ) -> JSON:
        """Write `allocation` and `reserved` into an unallocated claim (adding kube-scheduler's
        finalizer first); Retry when it was allocated by someone else, deleted, leadership was
        lost or it kept changing."""
        ns, name = nsname(claim)
        current = claim
        for _ in range(CONFLICT_RETRIES):
            if allocated(current):
                raise Retry(f"claim {ns}/{name} was allocated by someone else")
            if not may_write():
                raise Retry("lost leadership")
            status = dict(current.get("status") or {})
            status["allocation"] = allocation
            status["reservedFor"] = list(reserved)
            try:
                if FINALIZER not in (meta(current).get("finalizers") or []):
                    current = self._add_finalizer(current)
                updated = self.client.replace(
                    _claim_path(ns, name, "status"), {**current, "status": status}
                )
            except kube.NotFound:
                raise Retry(f"claim {ns}/{name} was deleted") from None
            except kube.Conflict:
                try:
                    current = self.client.get(_claim_path(ns, name))
                except kube.NotFound:
                    raise Retry(f"claim {ns}/{name} was deleted") from None
                continue
            self._remember(updated)
            return updated
        raise Retry(f"claim {ns}/{name} kept changing ({CONFLICT_RETRIES} conflicts)")

    def _add_finalizer(self, claim: JSON) -> JSON:
        """Add kube-scheduler's finalizer (a plain update: finalizers are metadata); the status
        update that follows carries the version this returns."""
        ns, name = nsname(claim)
        m = meta(claim)
        m["finalizers"] = [*(m.get("finalizers") or []), FINALIZER]
        return self.client.replace(_claim_path(ns, name), {**claim, "metadata": m})

    def release(self, claim: JSON) -> JSON:
        """Clear a claim's allocation and reservation (missing claim: nothing to undo); returns
        the claim as released."""
        ns, name = nsname(claim)
        current = claim
        for _ in range(CONFLICT_RETRIES):
            status = dict(current.get("status") or {})
            status.pop("allocation", None)
            status.pop("reservedFor", None)
            try:
                updated = self.client.replace(
                    _claim_path(ns, name, "status"), {**current, "status": status}
                )
            except kube.NotFound:
                return current
            except kube.Conflict:
                try:
                    current = self.client.get(_claim_path(ns, name))
                except kube.NotFound:
                    return current
                continue
            self._remember(updated)
            log.info("claim %s/%s released", ns, name)
            return updated
        raise Retry(f"claim {ns}/{name} kept changing while being released")

    def set_reserved(self, claim: JSON, reserved: list[JSON]) -> JSON | None:
        """Replace the claim's reservations (dropping placement holds); None when the claim
        changed or went meanwhile (its event brings it back) or the API failed (logged)."""
        ns, name = nsname(claim)
        status = {**(claim.get("status") or {}), "reservedFor": reserved}
        try:
            updated = self.client.replace(
                _claim_path(ns, name, "status"), {**claim, "status": status}
            )
        except (kube.Conflict, kube.NotFound):
            return None
        except kube.KubeError as exc:
            log.warning("claim %s/%s: cannot drop the placement hold: %s", ns, name, exc)
            return None
        self._remember(updated)
        return updated

    # ------------------------------------------------------------ pods

    def lift_gate(self, pod: JSON) -> JSON | None:
        """Remove our scheduling gate (other gates stay); the pod as lifted, or None when it is
        gone. Retry when it kept changing."""
        ns, name = nsname(pod)
        pod_path = kube.path("v1", "pods", name, namespace=ns)
        current = pod
        for _ in range(CONFLICT_RETRIES):
            gates = (current.get("spec") or {}).get("schedulingGates") or []
            kept = [g for g in gates if g.get("name") != GATE]
            try:
                return self.client.merge_patch(
                    pod_path,
                    {
                        "metadata": {"resourceVersion": meta(current).get("resourceVersion")},
                        "spec": {"schedulingGates": kept or None},
                    },
                )
            except kube.NotFound:
                return None
            except kube.Conflict:
                current = self.client.get(pod_path)
        raise Retry(f"pod {ns}/{name} kept changing while its gate was removed")

    def set_conditions(self, key: tuple[str, str], conditions: list[Mapping[str, Any]]) -> JSON:
        """Patch the pod's conditions (merged by type); KubeError to the caller."""
        ns, name = key
        return self.client.strategic_patch(
            kube.path("v1", "pods", name, namespace=ns, subresource="status"),
            {"status": {"conditions": list(conditions)}},
        )

    def set_condition(self, pod: JSON, status: str, reason: str, message: str) -> None:
        """Our Placement condition on the pod; a failure is logged (the decision stands)."""
        condition = {
            "type": CONDITION,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now(),
        }
        try:
            self.set_conditions(nsname(pod), [condition])
        except kube.KubeError as exc:
            ns, name = nsname(pod)
            log.warning("pod %s/%s: cannot set condition %s: %s", ns, name, CONDITION, exc)

    def event(self, pod: JSON, reason: str, message: str) -> None:
        ns, name = nsname(pod)
        ref = ObjectRef.pod(ns, name, str(meta(pod).get("uid")))
        record_warning(self.client, ref, reason, message, component=COMPONENT)
