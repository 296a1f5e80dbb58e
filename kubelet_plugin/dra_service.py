"""gRPC adapters for the kubelet's DRA node service, API versions v1 and v1beta1.

Thin on purpose: translate protobuf messages to `ClaimRef`s, call `Preparer`, translate outcomes
back. The two versions share one wire shape (v1 adds `share_id`), so one adapter class serves both,
parameterised by the generated message module. Registered on the DRA socket by
`kubelet_plugin.server`.
"""

from __future__ import annotations

import logging
import time
from types import ModuleType
from typing import Any

from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.prepare import Preparer

log = logging.getLogger(__name__)


class DraServicer:
    """NodePrepareResources / NodeUnprepareResources for one API version's messages."""

    def __init__(self, preparer: Preparer, messages: ModuleType, *, version: str) -> None:
        self._preparer = preparer
        self._pb = messages
        self._version = version
        self._has_share_id = "share_id" in messages.Device.DESCRIPTOR.fields_by_name

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        refs = _refs(request)
        started = time.perf_counter()
        # The API calls of this prepare must end before the kubelet gives up on the call.
        outcomes = self._preparer.prepare(refs, time_remaining_s=_remaining(context))
        response = self._pb.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for device in outcome.devices:
                message = entry.devices.add(
                    request_names=list(device.request_names),
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=list(device.cdi_ids),
                )
                if self._has_share_id and device.share_id:
                    message.share_id = device.share_id
        log.debug(
            "%s NodePrepareResources: %d claims in %.1f ms",
            self._version,
            len(refs),
            (time.perf_counter() - started) * 1e3,
        )
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        errors = self._preparer.unprepare(_refs(request))
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


# gRPC reports a call without a deadline as ~292 years remaining (or None); treat as no deadline.
NO_DEADLINE_S = 1e6


def _remaining(context: Any) -> float | None:
    remaining = context.time_remaining()
    if remaining is None or remaining > NO_DEADLINE_S:
        return None
    return float(remaining)


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]
