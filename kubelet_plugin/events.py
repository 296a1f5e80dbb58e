"""Kubernetes Events for claims that fail to prepare, on the ResourceClaim and its Pods.

Why: the kubelet reports a prepare error on the pod only as a terse
`FailedPrepareDynamicResources`; a user running `kubectl describe resourceclaim` or
`kubectl describe pod` should read what is wrong in plain words and what to do about it. The
text is the error prepare returned (it names the claim, the device and the limit) plus advice;
the pods are the claim's `status.reservedFor` entries.

Posting never slows prepare down: events go through a bounded queue to one background thread
(`kubelet_plugin.background`, the supervised loop `prepare-events`) that writes them with the
node's own credentials (`dra_driver.kube`; the Node authorizer lets a node create and patch
Events). The kubelet retries a failed prepare every few seconds, so a
repeated failure (same object, reason and message) is folded into one Event whose `count` and
`lastTimestamp` are patched at most every `repeat_interval_s`, as the kubelet's own recorder
does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dra_driver import kube
from dra_driver.events import MAX_MESSAGE, ObjectRef, warning_event
from dra_driver.supervision import Supervisor
from kubelet_plugin.background import Background
from kubelet_plugin.claims import ClaimRef

log = logging.getLogger(__name__)

COMPONENT = "vgpu-dra-kubelet-plugin"
REASONS = {
    "overbooked": "PrepareOverbooked",
    "invalid_claim": "PrepareFailed",
    "api_error": "PrepareApiError",
    "hook_library": "PrepareHookUnusable",
    "node_io": "PrepareNodeError",
    "internal": "PrepareInternalError",
}
ADVICE = {
    "overbooked": "the GPU's memory or cores are already given to other claims on this node; "
    "the claim stays pending until capacity is free or it is allocated elsewhere",
    "invalid_claim": "fix the claim (or its DeviceClass) and recreate it",
    "api_error": "the node could not read the claim from the API server; it retries",
    "hook_library": "the node's vgpu-dra hook library is missing or unusable, so no caps could "
    "be enforced; the node's administrator must reinstall it",
    "node_io": "the node could not write the claim's files (disk full or read-only?); it retries",
    "internal": "a bug or a node problem: the node's kubelet-plugin log has the details",
}


@dataclass(frozen=True, slots=True)
class PodRef:
    name: str
    uid: str


@dataclass(slots=True)
class _Posted:
    name: str
    count: int
    pending: int  # occurrences not yet patched into `count`
    patched_at: float


class PrepareEvents:
    """Queue prepare failures; one daemon thread writes them as Events."""

    def __init__(
        self,
        client: kube.KubeClient,
        *,
        node: str,
        repeat_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_queued: int = 1000,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._client = client
        self._node = node
        self._interval = repeat_interval_s
        self._clock = clock
        self._posted: dict[tuple[str, str, str], _Posted] = {}
        self._work: Background[tuple[ObjectRef, str, str]] = Background(
            self._write_logged, name="prepare-events", max_queued=max_queued, supervisor=supervisor
        )

    def prepare_failed(
        self, ref: ClaimRef, reason: str, error: str, pods: Sequence[PodRef] = ()
    ) -> None:
        """Record that `ref` failed to prepare (non-blocking; dropped if the queue is full)."""
        event_reason = REASONS.get(reason, "PrepareFailed")
        advice = ADVICE.get(reason, "")
        claim_text = f"{self._node}: {error}" + (f" ({advice})" if advice else "")
        targets = [
            (
                ObjectRef.claim(ref.namespace, ref.name, ref.uid),
                f"cannot prepare this claim on node {claim_text}",
            )
        ]
        targets += [
            (
                ObjectRef.pod(ref.namespace, pod.name, pod.uid),
                f"cannot prepare ResourceClaim {ref.name} on node {claim_text}",
            )
            for pod in pods
        ]
        for target, message in targets:
            if not self._work.submit((target, event_reason, message[:MAX_MESSAGE])):
                log.debug("event queue full; dropping event for %s", target.name)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued event was written (tests, shutdown)."""
        self._work.flush(timeout_s)

    def close(self) -> None:
        self._work.close()

    def _write_logged(self, item: tuple[ObjectRef, str, str]) -> None:
        try:
            self._write(*item)
        except kube.KubeError as exc:
            log.warning("could not write an Event: %s", exc)

    def _write(self, target: ObjectRef, reason: str, message: str) -> None:
        key = (target.uid, reason, message)
        now = self._clock()
        posted = self._posted.get(key)
        events = kube.path("v1", "events", namespace=target.namespace)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if posted is not None:
            posted.pending += 1
            if now - posted.patched_at < self._interval:
                return
            count = posted.count + posted.pending
            try:
                self._client.merge_patch(
                    f"{events}/{posted.name}", {"count": count, "lastTimestamp": stamp}
                )
                posted.count, posted.pending, posted.patched_at = count, 0, now
                return
            except kube.NotFound:  # expired (events live an hour): start a new one
                del self._posted[key]
        event = warning_event(target, reason, message, component=COMPONENT, host=self._node)
        self._client.create(events, event)
        name = str(event["metadata"]["name"])
        self._posted[key] = _Posted(name=name, count=1, pending=0, patched_at=now)
        if len(self._posted) > 4096:  # bound the memory of a long-running plugin
            oldest = min(self._posted, key=lambda k: self._posted[k].patched_at)
            del self._posted[oldest]
