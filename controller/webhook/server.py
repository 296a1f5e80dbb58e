"""The webhook's HTTPS endpoint: AdmissionReview v1 in, AdmissionReview v1 out.

Why the standard library (`http.server` + `ssl` in threads) and not a web framework: the
controller already serves its probes this way, the API server sends one small JSON POST per
admission over a kept-alive HTTP/1.1 connection, and the work per request is about 0.1 ms of pure
Python (p50 0.3 ms inside the webhook under 200 concurrent creations, bench/webhook_bench.py).
aiohttp is not a product dependency (the image drops it with the kubernetes package's asyncio
client). Each connection gets its own thread, so a slow client or a slow template create never
stalls the others. The cost, measured (`--webhook-phase-timing`, docs/webhook.md Performance):
under a burst, ~200 connection threads (most of a burst's admissions come on new connections)
take turns at the GIL, and a slow admission spends ~80 % of its time waiting for it; the
event-loop transport (`controller.webhook.aio`, `--webhook-transport asyncio`) is the answer to
that diagnosis, opt-in until the API server's own measure agrees (docs/webhook.md). Meanwhile
each answer here is one write and each request one read, since every socket call gives the GIL
away.

TLS: every accepted connection is wrapped with the context the `ContextHolder` holds *at that
moment*, and the handshake happens in the connection's thread (bounded by the timeout), so a
certificate reload (`controller.webhook.certs`) applies to new connections at once while open
ones finish undisturbed.

Limits: bodies above `MAX_BODY` (413) or without Content-Length (411) are refused before being
read; a request whose headers and body take longer than `timeout_s` is dropped, a kept-alive
connection idle for `IDLE_TIMEOUT_S` is closed. Paths:
`POST /mutate-pods`, `POST /validate`, `GET /healthz`, `GET /metrics` (the webhook's histogram).
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import trace

from controller.webhook import phases
from controller.webhook.certs import ContextHolder
from controller.webhook.metrics import WebhookMetrics
from controller.webhook.templates import WouldBlock
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
# Open connections (one thread each) beyond which new ones are closed at once: the port is
# reachable from the pod network, and a flood of idle connections must not exhaust threads.
MAX_CONNECTIONS = 1024
TRACER_NAME = "vgpu-dra.webhook"
MUTATE_PATH = "/mutate-pods"
VALIDATE_PATH = "/validate"

# review request -> (response fields without uid, short decision for logs/metrics)
Review = Callable[[JSON], tuple[JSON, str]]


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 request; answered 400."""


def parse_review(body: bytes) -> JSON:
    """The `request` of an AdmissionReview v1, checked for the fields we rely on."""
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadReview(f"body is not JSON: {exc}") from None
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


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # 200 concurrent pod creations open many connections at once

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        holder: ContextHolder,
        timeout_s: float,
    ) -> None:
        self.holder = holder
        self.timeout_s = timeout_s
        self.max_connections = MAX_CONNECTIONS
        self._open = 0
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        sock.settimeout(self.timeout_s)
        context = self.holder.current()
        if context is None:  # no certificate yet: nothing we could say
            sock.close()
            raise OSError("no serving certificate loaded yet")
        wrapped = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        wrapped.accepted_at = _clock()  # type: ignore[attr-defined]  # for --webhook-phase-timing
        return wrapped, address

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            full = self._open >= self.max_connections
            if not full:
                self._open += 1
        if full:
            log.warning(
                "webhook: %d connections open, refusing one from %s",
                self.max_connections,
                client_address,
            )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: it will not count itself out
            with self._open_lock:
                self._open -= 1
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Failed handshakes and dropped connections: a client's problem, not a traceback on stderr.
        log.debug("webhook connection from %s failed", client_address, exc_info=True)


class WebhookServer:
    """Serves the admission endpoints on `address` from daemon threads."""

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
    ) -> None:
        # None while tracing is off: no span is created at all (dra_driver.tracing).
        self._tracer = tracer if tracer is not None else installed_tracer(TRACER_NAME)
        self._routes = {MUTATE_PATH: ("mutate", mutate), VALIDATE_PATH: ("validate", validate)}
        self._timeout_s = timeout_s
        self._metrics = metrics
        self._draining = threading.Event()
        self._phase_timing = phase_timing
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._httpd = _TLSServer(address, self._handler_class(), holder, timeout_s)
        self._httpd.max_connections = max_connections
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="webhook", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def drain(self) -> None:
        """Keep serving, but close each connection after its next answer: on the way out, the
        API server's kept-alive connections move to another replica one request at a time
        instead of failing when the process exits."""
        self._draining.set()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the API server reuses connections
            # A whole AdmissionReview (a pod is a few KiB) in one read: each read of the socket
            # gives the GIL away, and getting it back is where a burst's admissions wait.
            rbufsize = READ_BUFFER

            def setup(self) -> None:
                super().setup()
                conn = self.connection
                self._tls_ms: float | None = None
                if isinstance(conn, ssl.SSLSocket):
                    conn.do_handshake()  # in this thread, bounded by the socket timeout
                    accepted = getattr(conn, "accepted_at", None)
                    if server._phase_timing and accepted is not None:
                        self._tls_ms = round((_clock() - accepted) * 1e3, 3)

            def handle_one_request(self) -> None:
                self.connection.settimeout(IDLE_TIMEOUT_S)  # waiting for the next request
                try:
                    super().handle_one_request()
                finally:
                    if phases.current() is not None:
                        server._admission_ended()

            def parse_request(self) -> bool:
                # A request began: its headers and body must arrive within the timeout.
                self.connection.settimeout(server._timeout_s)
                if server._phase_timing:
                    phases.begin(phases.Phases(server._admission_began(), self._tls_ms))
                    self._tls_ms = None  # only the connection's first request waited for it
                parsed = super().parse_request()
                phases.mark("headers")
                return parsed

            def handle(self) -> None:
                try:
                    super().handle()
                except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
                    log.debug("webhook connection from %s ended: %s", self.client_address, exc)

            def finish(self) -> None:
                with contextlib.suppress(ssl.SSLError, OSError):
                    super().finish()

            def do_GET(self) -> None:
                if self.path == "/healthz":
                    self._reply(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
                elif self.path == "/metrics":
                    self._reply(
                        HTTPStatus.OK, server._metrics.exposition(), "text/plain; version=0.0.4"
                    )
                else:
                    self._reply(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

            def do_POST(self) -> None:
                route = server._routes.get(self.path.split("?", 1)[0])
                if route is None:
                    self._refuse(HTTPStatus.NOT_FOUND, "no such path")
                    return
                length_text = self.headers.get("Content-Length")
                if length_text is None or not length_text.isdigit():
                    self._refuse(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
                    return
                length = int(length_text)
                if length > MAX_BODY:
                    self._refuse(
                        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"body of {length} bytes exceeds the limit of {MAX_BODY}",
                    )
                    return
                body = self.rfile.read(length)
                phases.mark("body")
                server._admit(self, route, body)

            def _refuse(self, status: HTTPStatus, text: str) -> None:
                # The body may be unread: the connection cannot carry another request.
                self._reply(status, (text + "\n").encode(), "text/plain; charset=utf-8", True)

            def _reply(
                self, status: HTTPStatus, body: bytes, content_type: str, close: bool = False
            ) -> None:
                self.send_response(status)
                if close:
                    self.send_header("Connection", "close")  # also sets close_connection
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                buffered = getattr(self, "_headers_buffer", None)
                if buffered is None:  # an HTTP/0.9 request: no headers to send
                    self.wfile.write(body)
                    return
                # Headers and body in one write (one TLS record, one give-away of the GIL).
                buffered += (b"\r\n", body)
                self.flush_headers()

            def log_message(self, format: str, *args: object) -> None:
                if log.isEnabledFor(logging.DEBUG):  # formatted only if it is written
                    log.debug("webhook http %s", format % args)

        return Handler

    def _admission_began(self) -> int:
        with self._in_flight_lock:
            self._in_flight += 1
            return self._in_flight

    def _admission_ended(self) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1
        phases.begin(None)

    def _admit(
        self, handler: BaseHTTPRequestHandler, route: tuple[str, Review], body: bytes
    ) -> None:
        operation, review = route
        started = _clock()
        try:
            request = parse_review(body)
        except BadReview as exc:
            handler._refuse(HTTPStatus.BAD_REQUEST, str(exc))  # type: ignore[attr-defined]
            self._metrics.observe(operation, "error", _clock() - started)
            return
        phases.mark("decode")
        kind = (request.get("kind") or {}).get("kind", "")
        span = admission_span(self._tracer, operation, request)
        with span as current:
            response, decision = self.review_safely(operation, review, request)
            if current is not None:
                current.set_attribute("vgpu_dra.admission.decision", decision)
        phases.mark("review")
        payload = answer(request["uid"], response)
        phases.mark("encode")
        handler._reply(  # type: ignore[attr-defined]
            HTTPStatus.OK, payload, "application/json", self._draining.is_set()
        )
        elapsed = _clock() - started
        phases.mark("write")
        self._metrics.observe(operation, decision, elapsed)
        timed = phases.current()
        timing = timed.fields() if timed is not None else {}
        self.log_admission(operation, kind, request, decision, elapsed, timing=timing)

    @staticmethod
    def review_safely(operation: str, review: Review, request: JSON) -> tuple[JSON, str]:
        try:
            return review(request)
        except WouldBlock:  # not an error: the event-loop transport retries off the loop
            raise
        except Exception:
            # A bug of ours must not crash the connection thread; the API server applies the
            # failurePolicy to the error answer.
            log.exception("webhook %s failed for uid %s", operation, request["uid"])
            response = {
                "allowed": False,
                "status": {"code": 500, "message": "vgpu-dra webhook internal error (see its log)"},
            }
            return response, "error"

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


def admission_span(
    tracer: trace.Tracer | None, operation: str, request: JSON
) -> contextlib.AbstractContextManager[Any]:
    """The admission's tracing span (a null context while tracing is off); both transports."""
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


def _clock() -> float:
    return time.perf_counter()
