"""The one shape of the Warning Events vgpu-dra records (core/v1 Event), for every component.

Why one module: the kubelet plugin (prepare failures, memory enforcement) and the controller
(placement refusals, rescheduling) all tell users about an object through Events that
`kubectl describe` shows. One builder keeps their fields, the API server's message limit and the
naming alike; `record_warning` is the one place where a failed write is logged and swallowed
(an Event is advice: losing one must never fail the work it describes).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from dra_driver import kube

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024  # what the API server accepts in Event.message
JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (its `involvedObject`)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    @classmethod
    def pod(cls, namespace: str, name: str, uid: str) -> ObjectRef:
        return cls("v1", "Pod", namespace, name, uid)

    @classmethod
    def claim(cls, namespace: str, name: str, uid: str) -> ObjectRef:
        return cls(kube.RESOURCE_API, "ResourceClaim", namespace, name, uid)


def warning_event(
    ref: ObjectRef, reason: str, message: str, *, component: str, host: str | None = None
) -> JSON:
    """A new Warning Event (count 1, stamped now) about `ref`; `host` names the reporting node.

    The name is the object's plus a random suffix, as the client-go recorder names them, so the
    caller knows it (to patch `count` of a repeated Event) without a generateName round trip.
    """
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    source = {"component": component} if host is None else {"component": component, "host": host}
    event: JSON = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.name}.{secrets.token_hex(8)}", "namespace": ref.namespace},
        "involvedObject": {
            "apiVersion": ref.api_version,
            "kind": ref.kind,
            "namespace": ref.namespace,
            "name": ref.name,
            "uid": ref.uid,
        },
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": "Warning",
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": source,
        "reportingComponent": component,
    }
    if host is not None:
        event["reportingInstance"] = host
    return event


def record_warning(
    client: kube.KubeClient,
    ref: ObjectRef,
    reason: str,
    message: str,
    *,
    component: str,
    host: str | None = None,
) -> str | None:
    """Create a Warning Event about `ref`; its name, or None (after logging why) when the API
    refused or could not be reached."""
    event = warning_event(ref, reason, message, component=component, host=host)
    try:
        client.create(kube.path("v1", "events", namespace=ref.namespace), event)
    except kube.KubeError as exc:
        log.warning(
            "cannot record event %s on %s %s/%s: %s",
            reason,
            ref.kind,
            ref.namespace,
            ref.name,
            exc,
        )
        return None
    return str(event["metadata"]["name"])
