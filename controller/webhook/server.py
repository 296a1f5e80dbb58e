"""The webhook's HTTPS server: AdmissionReview v1 in, AdmissionReview v1 out, a thread per
connection, in the controller's process.

Why the standard library (`http.server` + `ssl` in threads): the API server sends one small JSON
POST per admission over a kept-alive HTTP/1.1 connection, and the work per request is about
0.3 ms of pure Python. Why this and no other way (docs/webhook.md, Performance): measured
against a Go webhook that does nothing, under 200 concurrent pod creations through the real API
server, the API server and its clients cannot tell this server from that floor, nor from the
event-loop and child-process designs it replaced; nothing else is simpler. Each connection gets
its own thread, so a slow client or a slow template create never stalls the others; each answer
is one write and each request one read (every socket call gives the GIL away).

TLS: every accepted connection is wrapped with the context the `ContextHolder` holds *at that
moment*, and the handshake happens in the connection's thread (bounded by the timeout), so a
certificate reload (`controller.webhook.certs`) applies to new connections at once while open
ones finish undisturbed.

Limits: bodies above `MAX_BODY` (413) or without Content-Length (411) are refused before being
read; a request whose headers and body take longer than `timeout_s` is dropped, a kept-alive
connection idle for `IDLE_TIMEOUT_S` is closed; at most `max_connections` are open at once.
Paths: `POST /mutate-pods`, `POST /validate`, `GET /healthz`, `GET /metrics` (the webhook's
histogram). A review that raises is answered `allowed: false` (code 500) naming the admission's
uid; every admission is one log line, one histogram observation and (with tracing) one span.

Supervision (`dra_driver.supervision`): the accepting thread is the loop `webhook` of the
supervisor given (it beats every turn of `serve_forever`, at least every 0.5 s). An unexpected
exception while accepting one connection or serving it (not a client's disconnect or timeout)
is logged with its traceback and counted; that connection ends, the server goes on; should
`serve_forever` itself raise, it is entered again after a backoff.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import trace

from controller.webhook.certs import ContextHolder
from controller.webhook.metrics import WebhookMetrics
from dra_driver import kube
from dra_driver.supervision import BACKOFF_MAX_S, BACKOFF_START_S, Supervisor
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
LOOP = "webhook"
# A loop that has not turned for this long is stalled: far beyond any admission (whose API
# server waits 10 s at most).
LOOP_DEADLINE_S = 60.0
POLL_S = 0.5  # serve_forever's poll: the loop beats at least this often
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


def review_safely(operation: str, review: Review, request: JSON) -> tuple[JSON, str]:
    """The review's answer; a bug of ours is `allowed: false` (code 500: under `failurePolicy:
    Fail` what the API server would answer for a failed webhook) naming the uid, its traceback
    in the log only."""
    try:
        return review(request)
    except Exception:
        log.exception("webhook %s failed for uid %s", operation, request["uid"])
        message = (
            f"vgpu-dra webhook: internal error while reviewing this object (admission uid "
            f"{request['uid']}; the traceback is in the webhook's log)"
        )
        return {"allowed": False, "status": {"code": 500, "message": message}}, "error"


def log_admission(operation: str, request: JSON, decision: str, elapsed: float) -> None:
    """The admission's one log line: what, who, the decision and the time; never its content."""
    kind = (request.get("kind") or {}).get("kind", "")
    name = request.get("name") or (request.get("object") or {}).get("metadata", {}).get(
        "generateName", ""
    )
    namespace = request.get("namespace") or ""
    log.info(
        "admission %s %s %s/%s: %s in %.2f ms",
        operation,
        kind,
        namespace,
        name,
        decision,
        elapsed * 1000,
        extra={
            "uid": request["uid"],
            "operation": operation,
            "kind": kind,
            "namespace": namespace,
            "object": name,
            "decision": decision,
            "dry_run": bool(request.get("dryRun")),
            "ms": round(elapsed * 1000, 3),
        },
    )


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # 200 concurrent pod creations open many connections at once

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        owner: WebhookServer,
    ) -> None:
        self.owner = owner
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        try:
            sock.settimeout(self.owner._timeout_s)
            context = self.owner._holder.current()
            if context is None:  # no certificate yet: nothing we could say
                raise OSError("no serving certificate loaded yet")
            return context.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            ), address
        except OSError:
            sock.close()
            raise  # serve_forever drops this connection and goes on
        except Exception as exc:
            sock.close()
            self.owner._failed("accepting a connection", address)
            raise OSError(f"connection from {address} dropped") from exc  # as above

    def service_actions(self) -> None:
        # Each turn of serve_forever (a connection accepted, or its poll): progress.
        self.owner._loop.beat()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.owner._connection_opened(client_address):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: it will not count itself out
            self.owner._connection_closed()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.owner._connection_closed()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Failed handshakes and dropped connections: a client's problem, not a traceback on stderr.
        # Anything else is ours: its traceback and a count (the server goes on).
        error = sys.exc_info()[1]
        if error is None or isinstance(error, OSError | TimeoutError):  # ssl.SSLError included
            log.debug("webhook connection from %s failed", client_address, exc_info=True)
            return
        self.owner._failed("a connection", client_address)


class WebhookServer:
    """Serves the admission endpoints on `address` over TLS with the context `holder` has when
    each connection is accepted, from daemon threads (one per connection), from `start` until
    `stop`."""

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
        supervisor: Supervisor | None = None,
    ) -> None:
        # None while tracing is off: no span is created at all (dra_driver.tracing).
        self._tracer = tracer if tracer is not None else installed_tracer(TRACER_NAME)
        self._routes = {MUTATE_PATH: ("mutate", mutate), VALIDATE_PATH: ("validate", validate)}
        self._holder = holder
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._draining = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._open = 0
        self._loop = (supervisor or Supervisor()).register(LOOP, LOOP_DEADLINE_S)
        self._httpd = _TLSServer(address, self._handler_class(), self)
        self._thread = threading.Thread(target=self._serve, name=LOOP, daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) actually bound (port 0 asks for a free one)."""
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def serving(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def drain(self) -> None:
        """Keep serving, but close each connection after its next answer: on the way out, the
        API server's kept-alive connections move to another replica one request at a time
        instead of failing when the process exits."""
        self._draining.set()

    def _serve(self) -> None:
        """`serve_forever` until `stop`, entered again after a backoff should it raise."""
        backoff = BACKOFF_START_S
        try:
            while not self._stopping.is_set():
                try:
                    self._httpd.serve_forever(poll_interval=POLL_S)
                    return  # shut down
                except Exception:
                    if self._stopping.is_set():
                        return
                    self._failed("serving", "every client")
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
        finally:
            self._loop.ended = not self._stopping.is_set()

    def _connection_opened(self, peer: object) -> bool:
        """Count a new connection in; False (and a warning) when the cap is reached: the
        caller closes it at once."""
        with self._lock:
            full = self._open >= self._max_connections
            if not full:
                self._open += 1
        if full:
            log.warning(
                "webhook: %d connections open, refusing one from %s", self._max_connections, peer
            )
        return not full

    def _connection_closed(self) -> None:
        with self._lock:
            self._open -= 1

    def _failed(self, what: str, peer: object) -> None:
        """An unexpected exception (being handled) ended one connection's `what`: logged with its
        traceback and counted as a failure of the loop, which goes on."""
        self._loop.beat(failed=True)
        log.exception(
            "webhook: %s with %s failed unexpectedly (%d so far); the server goes on",
            what,
            peer,
            self._loop.failures,
        )

    def _admit(
        self, handler: BaseHTTPRequestHandler, route: tuple[str, Review], body: bytes
    ) -> None:
        operation, review = route
        started = time.perf_counter()
        try:
            request = parse_review(body)
        except BadReview as exc:
            handler._refuse(HTTPStatus.BAD_REQUEST, str(exc))  # type: ignore[attr-defined]
            self._metrics.observe(operation, "error", time.perf_counter() - started)
            return
        with self._span(operation, request) as span:
            response, decision = review_safely(operation, review, request)
            if span is not None:
                span.set_attribute("vgpu_dra.admission.decision", decision)
        handler._reply(  # type: ignore[attr-defined]
            HTTPStatus.OK,
            answer(request["uid"], response),
            "application/json",
            self._draining.is_set(),
        )
        elapsed = time.perf_counter() - started
        self._metrics.observe(operation, decision, elapsed)  # after the answer: off its path
        log_admission(operation, request, decision, elapsed)

    def _span(self, operation: str, request: JSON) -> contextlib.AbstractContextManager[Any]:
        """The admission's tracing span (a null context while tracing is off)."""
        if self._tracer is None:
            return contextlib.nullcontext()
        return self._tracer.start_as_current_span(
            f"admission {operation}",
            attributes={
                "vgpu_dra.admission.uid": str(request["uid"]),
                "vgpu_dra.admission.kind": str((request.get("kind") or {}).get("kind", "")),
                "k8s.namespace.name": str(request.get("namespace") or ""),
                "vgpu_dra.admission.dry_run": bool(request.get("dryRun")),
            },
        )

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the API server reuses connections
            # A whole AdmissionReview (a pod is a few KiB) in one read: each read of the socket
            # gives the GIL away, and getting it back is where a burst's admissions wait.
            rbufsize = READ_BUFFER

            def setup(self) -> None:
                super().setup()
                if isinstance(self.connection, ssl.SSLSocket):
                    self.connection.do_handshake()  # in this thread, bounded by the timeout

            def handle_one_request(self) -> None:
                self.connection.settimeout(IDLE_TIMEOUT_S)  # waiting for the next request
                super().handle_one_request()

            def parse_request(self) -> bool:
                # A request began: its headers and body must arrive within the timeout.
                self.connection.settimeout(server._timeout_s)
                return super().parse_request()

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
                server._admit(self, route, self.rfile.read(length))

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
