"""What the webhook's two transports share: the AdmissionReview wire format, the limits, and the
`AdmissionServer` base that owns a server's state and an admission's bookkeeping.

A transport (`server.WebhookServer`: a thread per connection; `aio.AsyncWebhookServer`: event
loops) adds only how connections are accepted, upgraded to TLS, read and written. Everything
else is here, once: the routes, the certificate holder, the request timeout and connection cap,
the tracer, the histogram, drain, the open-connection and in-flight counts (locked: each
transport touches them from more than one thread), the review with its error answer and span,
and the per-admission log line.

Supervision (`dra_driver.supervision`): each transport registers its long-lived loops with the
`supervisor` it is given (`SERVE_LOOP`, and the event-loop transport's `ACCEPT_LOOP`), beats
them while they turn, and counts there every unexpected exception a connection meets (logged
with its traceback; the connection ends, the loop goes on). A loop that stops turning for
`LOOP_DEADLINE_S` is stalled: the controller's probes, or the child's watchdog, see it.
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from controller.webhook import phases
from controller.webhook.certs import ContextHolder
from controller.webhook.metrics import WebhookMetrics
from controller.webhook.templates import WouldBlock
from dra_driver import kube
from dra_driver.supervision import Loop, Supervisor
from dra_driver.tracing import installed_tracer

log = logging.getLogger("vgpu-dra.webhook.server")

JSON = dict[str, Any]
# Two objects (object and oldObject) of at most ~1.5 MiB each (etcd's request limit), plus slack.
MAX_BODY = 4 * 1024 * 1024
READ_BUFFER = 64 * 1024
DEFAULT_TIMEOUT_S = 10.0
# A kept-alive connection may idle this long. Longer than the API server's own idle timeout for
# webhook connections (90 s): the client must be the one to close an idle connection, or it may
# send a request on a connection we are closing ("server closed idle connection": a failed
# admission, since POSTs are not retried).
IDLE_TIMEOUT_S = 120.0
# Open connections beyond which new ones are closed at once: the port is reachable from the pod
# network, and a flood of idle connections must not exhaust threads or memory.
MAX_CONNECTIONS = 1024
TRACER_NAME = "vgpu-dra.webhook"
SERVE_LOOP = "webhook"  # the thread or event loop that accepts (threads) or serves (asyncio)
ACCEPT_LOOP = "webhook-accept"  # the event-loop transport's accepts and handshakes
HEARTBEAT_S = 1.0  # how often a turning loop beats (at most; the threaded one every 0.5 s)
# A loop that has not turned for this long is stalled: far beyond any admission (whose API
# server waits 10 s at most), a loop blocked this long answers nothing.
LOOP_DEADLINE_S = 60.0
MUTATE_PATH = "/mutate-pods"
VALIDATE_PATH = "/validate"

# review request -> (response fields without uid, short decision for logs/metrics)
Review = Callable[[JSON], tuple[JSON, str]]


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 request; answered 400."""


def parse_review(body: bytes) -> JSON:
    """The `request` of an AdmissionReview v1, checked for the fields we rely on.

    JSON nested deeper than the decoder can take (only a free-form field can be: a claim's
    opaque config) is read with its deep parts cut (`kube.decode_json(prune=True)`: each becomes
    `kube.PRUNED`), so the review still has its uid and object, and the validation refuses the
    config it cannot read by name ("nested too deeply") instead of the API server meeting a 400.
    """
    try:
        review = kube.decode_json(body, prune=True)
    except (ValueError, RecursionError) as exc:
        raise BadReview(f"body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise BadReview("body is not an AdmissionReview")
    if review.get("apiVersion") != "admission.k8s.io/v1":
        raise BadReview(f"AdmissionReview apiVersion {review.get('apiVersion')!r}: only v1")
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise BadReview("AdmissionReview without request.uid")
    return request


def answer(uid: str, response: JSON) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": uid, **response},
        },
        separators=(",", ":"),
    ).encode()


def admission_span(
    tracer: trace.Tracer | None, operation: str, request: JSON
) -> contextlib.AbstractContextManager[Any]:
    """The admission's tracing span (a null context while tracing is off)."""
    if tracer is None:
        return contextlib.nullcontext()
    kind = (request.get("kind") or {}).get("kind", "")
    return tracer.start_as_current_span(
        f"admission {operation}",
        attributes={
            "vgpu_dra.admission.uid": str(request["uid"]),
            "vgpu_dra.admission.kind": kind,
            "k8s.namespace.name": str(request.get("namespace") or ""),
            "vgpu_dra.admission.dry_run": bool(request.get("dryRun")),
        },
    )


class AdmissionServer(abc.ABC):
    """Serves the admission endpoints on `address` over TLS with the context `holder` has when
    each connection is accepted. A subclass binds in `_listen` (the constructor's last step) and
    serves from `start` until `stop`."""

    def __init__(
        self,
        address: tuple[str, int],
        holder: ContextHolder,
        *,
        mutate: Review,
        validate: Review,
        metrics: WebhookMetrics,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        tracer: trace.Tracer | None = None,
        phase_timing: bool = False,
        supervisor: Supervisor | None = None,
    ) -> None:
        # None while tracing is off: no span is created at all (dra_driver.tracing).
        self._tracer = tracer if tracer is not None else installed_tracer(TRACER_NAME)
        self._routes = {MUTATE_PATH: ("mutate", mutate), VALIDATE_PATH: ("validate", validate)}
        self._holder = holder
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._phase_timing = phase_timing
        self._draining = threading.Event()
        self._counts_lock = threading.Lock()
        self._open = 0
        self._in_flight = 0
        self._supervisor = supervisor or Supervisor()
        self._serving_loop = self._supervisor.register(SERVE_LOOP, LOOP_DEADLINE_S)
        self._listen(address)

    @abc.abstractmethod
    def _listen(self, address: tuple[str, int]) -> None:
        """Bind `address` (serving starts with `start`)."""

    @property
    @abc.abstractmethod
    def address(self) -> tuple[str, int]:
        """The (host, port) actually bound (port 0 asks for a free one)."""

    @abc.abstractmethod
    def start(self) -> None:
        """Begin serving (from threads of the server's own)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop accepting and end every connection."""

    def drain(self) -> None:
        """Keep serving, but close each connection after its next answer: on the way out, the
        API server's kept-alive connections move to another replica one request at a time
        instead of failing when the process exits."""
        self._draining.set()

    def _connection_opened(self, peer: object) -> bool:
        """Count a new connection in; False (and a warning) when the cap is reached: the
        caller closes it at once."""
        with self._counts_lock:
            full = self._open >= self._max_connections
            if not full:
                self._open += 1
        if full:
            log.warning(
                "webhook: %d connections open, refusing one from %s", self._max_connections, peer
            )
        return not full

    def _connection_closed(self) -> None:
        with self._counts_lock:
            self._open -= 1

    def _failed(self, loop: Loop, what: str, peer: object) -> None:
        """An unexpected exception (being handled) ended one connection's `what`: logged with its
        traceback and counted as a failure of `loop`, which goes on."""
        loop.beat(failed=True)
        log.exception(
            "webhook: %s with %s failed unexpectedly (%d so far); the server goes on",
            what,
            peer,
            loop.failures,
        )

    def _admission_began(self) -> int:
        """Count an admission in; the number in flight, this one included."""
        with self._counts_lock:
            self._in_flight += 1
            return self._in_flight

    def _admission_ended(self) -> None:
        with self._counts_lock:
            self._in_flight -= 1

    def _judge(self, operation: str, review: Review, request: JSON) -> tuple[JSON, str]:
        """The review inside the admission's span; WouldBlock passes through (the span is
        marked deferred)."""
        with admission_span(self._tracer, operation, request) as current:
            try:
                response, decision = self.review_safely(operation, review, request)
            except WouldBlock:
                if current is not None:
                    current.set_attribute("vgpu_dra.admission.deferred", True)
                raise
            if current is not None:
                current.set_attribute("vgpu_dra.admission.decision", decision)
        return response, decision

    def _answered(
        self,
        operation: str,
        request: JSON,
        decision: str,
        elapsed: float,
        timed: phases.Phases | None,
    ) -> None:
        """After the answer is written: the histogram and the log line."""
        self._metrics.observe(operation, decision, elapsed)
        timing = timed.fields() if timed is not None else {}
        kind = (request.get("kind") or {}).get("kind", "")
        self.log_admission(operation, kind, request, decision, elapsed, timing=timing)

    @staticmethod
    def review_safely(operation: str, review: Review, request: JSON) -> tuple[JSON, str]:
        try:
            return review(request)
        except WouldBlock:  # not an error: the event-loop transport retries off the loop
            raise
        except Exception:
            # A bug of ours must not crash the connection; the API server applies the
            # failurePolicy to the error answer.
            log.exception("webhook %s failed for uid %s", operation, request["uid"])
            message = (
                f"vgpu-dra webhook: internal error while reviewing this object (admission uid "
                f"{request['uid']}; the traceback is in the webhook's log)"
            )
            return {"allowed": False, "status": {"code": 500, "message": message}}, "error"

    @staticmethod
    def log_admission(
        operation: str,
        kind: str,
        request: JSON,
        decision: str,
        elapsed: float,
        *,
        timing: dict[str, float | int],
    ) -> None:
        name = request.get("name") or (request.get("object") or {}).get("metadata", {}).get(
            "generateName", ""
        )
        log.info(
            "admission %s %s %s/%s: %s in %.2f ms",
            operation,
            kind,
            request.get("namespace") or "",
            name,
            decision,
            elapsed * 1000,
            extra={
                "uid": request["uid"],
                "operation": operation,
                "kind": kind,
                "namespace": request.get("namespace") or "",
                "object": name,
                "decision": decision,
                "dry_run": bool(request.get("dryRun")),
                "ms": round(elapsed * 1000, 3),
                **timing,
            },
        )
