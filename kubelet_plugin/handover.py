"""Rolling updates: a new plugin instance serves the kubelet before it owns the node's state.

During a DaemonSet surge rollout two plugin pods run on a node. The kubelet (1.33+) keeps both
registered when their registration sockets and DRA endpoints differ, and sends each call to the
most recently registered instance that is connected. The DaemonSet controller deletes the old pod
only once the new one is Ready. So the new instance must register (and be Ready) while the old
one still owns the checkpoint, and must not touch that state until the old one is gone: the node
lock (`kubelet_plugin.statelock`) decides who owns it.

Until it holds the lock the new instance is a pass-through: each prepare or unprepare the
kubelet sends it is forwarded to the lock holder's DRA socket (the holder writes it into the lock
file), so the old instance keeps serving with its own state. Once the lock is taken and the
checkpoint loaded, `serve_locally` switches every later call to this instance's own Preparer. A
call that reaches neither (the holder has just closed its socket, this instance is still
loading) waits for the switch within the kubelet's deadline instead of failing; prepare and
unprepare are idempotent, so a forwarded call cut off by the holder's exit is safely redone
locally. The device-health stream (NodeWatchResources) is forwarded the same way while the holder
serves it, so the kubelet keeps seeing the holder's view (a device it marked unhealthy stays so);
when that stream ends the kubelet opens a new one (every 5 s), answered by whoever owns the node
then. Used by `kubelet_plugin.server` (one servicer per DRA API version) and
`kubelet_plugin.main`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import grpc

from kubelet_plugin.dra_service import NO_DEADLINE_S, DraServicer
from kubelet_plugin.health import HealthServicer
from kubelet_plugin.prepare import Preparer

log = logging.getLogger(__name__)

# How long a call may wait for this instance to take over when the kubelet set no deadline.
DEFAULT_WAIT_S = 60.0
FORWARD_RETRY_S = 0.2  # pause before asking the holder again after it refused a connection


class Handover:
    """Where this instance's DRA calls go: the lock holder, then (after the switch) itself."""

    def __init__(self, own_endpoint: str, holder_endpoint: Callable[[], str | None]) -> None:
        self._own = own_endpoint
        self._holder_endpoint = holder_endpoint
        self._preparer: Preparer | None = None
        self._failure = ""
        self._switched = threading.Event()
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    @property
    def local(self) -> bool:
        return self._preparer is not None

    def serve_locally(self, preparer: Preparer) -> None:
        """This instance owns the node's state now: stop forwarding."""
        self._preparer = preparer
        self._switched.set()
        self._close_channels()
        log.info("serving DRA calls with this instance's own state")

    def fail(self, reason: str) -> None:
        """This instance will never take over (e.g. the lock wait timed out): calls fail."""
        self._failure = reason
        self._switched.set()
        self._close_channels()

    def servicer(self, messages: ModuleType, stubs: ModuleType, version: str) -> HandoverServicer:
        return HandoverServicer(self, messages, stubs, version)

    def health_servicer(self, local: HealthServicer, stubs: ModuleType) -> HandoverHealthServicer:
        return HandoverHealthServicer(self, local, stubs)

    # --- used by HandoverServicer ------------------------------------------------------------

    def preparer(self) -> Preparer | None:
        return self._preparer

    def failure(self) -> str:
        return self._failure

    def wait_switched(self, timeout: float) -> bool:
        return self._switched.wait(timeout)

    def holder(self) -> str | None:
        """The lock holder's DRA endpoint, unless it is this instance's own."""
        endpoint = self._holder_endpoint()
        return endpoint if endpoint and endpoint != self._own else None

    def channel(self, endpoint: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(endpoint)
            if channel is None:
                channel = grpc.insecure_channel(f"unix://{endpoint}")
                self._channels[endpoint] = channel
            return channel

    def _close_channels(self) -> None:
        with self._lock:
            channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.close()


class HandoverServicer:
    """NodePrepareResources / NodeUnprepareResources of one API version, routed by a Handover."""

    def __init__(
        self, handover: Handover, messages: ModuleType, stubs: ModuleType, version: str
    ) -> None:
        self._handover = handover
        self._pb = messages
        self._stubs = stubs
        self._version = version
        self._local: DraServicer | None = None

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._route("NodePrepareResources", request, context)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._route("NodeUnprepareResources", request, context)

    def _route(self, method: str, request: Any, context: Any) -> Any:
        deadline = time.monotonic() + _budget(context)
        told = False
        while True:
            local = self._local_servicer()
            if local is not None:
                return getattr(local, method)(request, context)
            failure = self._handover.failure()
            if failure:
                context.abort(grpc.StatusCode.UNAVAILABLE, failure)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "this plugin instance is still taking over the node from the previous one",
                )
            endpoint = self._handover.holder()
            if endpoint is None:
                self._handover.wait_switched(remaining)
                continue
            try:
                stub = self._stubs.DRAPluginStub(self._handover.channel(endpoint))
                response = getattr(stub, method)(request, timeout=remaining)
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
                # UNAVAILABLE: the holder is gone. CANCELLED while our own caller still waits:
                # the holder's server stopped with the call in flight (its SIGTERM grace ran
                # out). Either way the holder is going away.
                if code not in _HOLDER_LEAVING or not context.is_active():
                    context.abort(code, f"previous plugin instance: {_details(exc)}")
                # Take the call once we own the state; prepare and unprepare are idempotent,
                # so a half-done one is redone.
                if not told:
                    log.info(
                        "%s %s: lock holder at %s unavailable; waiting to serve it here",
                        self._version,
                        method,
                        endpoint,
                    )
                    told = True
                self._handover.wait_switched(min(FORWARD_RETRY_S, remaining))
                continue
            log.debug("%s %s forwarded to the lock holder at %s", self._version, method, endpoint)
            return response

    def _local_servicer(self) -> DraServicer | None:
        if self._local is None:
            preparer = self._handover.preparer()
            if preparer is not None:
                self._local = DraServicer(preparer, self._pb, version=self._version)
        return self._local


_HOLDER_LEAVING = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


def _budget(context: Any) -> float:
    """What is left of the kubelet's deadline (gRPC reports none as ~292 years)."""
    remaining = context.time_remaining()
    if remaining is None or remaining > NO_DEADLINE_S:
        return DEFAULT_WAIT_S
    return float(remaining)


def _details(exc: grpc.RpcError) -> str:
    return exc.details() if isinstance(exc, grpc.Call) else str(exc)


class HandoverHealthServicer:
    """NodeWatchResources of one API version: the holder's stream while it owns the node."""

    def __init__(self, handover: Handover, local: HealthServicer, stubs: ModuleType) -> None:
        self._handover = handover
        self._local = local
        self._stubs = stubs

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        endpoint = None if self._handover.local else self._handover.holder()
        if endpoint is None:
            yield from self._local.NodeWatchResources(request, context)
            return
        stub = self._stubs.DRAResourceHealthStub(self._handover.channel(endpoint))
        call = stub.NodeWatchResources(request)
        context.add_callback(call.cancel)  # the kubelet went away: so does the upstream call
        try:
            yield from call
        except grpc.RpcError as exc:
            log.info("health stream from the lock holder at %s ended: %s", endpoint, _details(exc))
        # Ended (the holder is exiting, or we took over and closed the channel): the kubelet
        # opens a new stream, answered by whoever owns the node then.
