"""The webhook's threaded transport (`--webhook-transport threads`, the default): AdmissionReview
v1 in, AdmissionReview v1 out, a thread per connection. What both transports share (state,
limits, an admission's review, span, histogram and log line) is `endpoint.AdmissionServer`.

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
that diagnosis, opt-in until the API server's own measure says it is better (docs/webhook.md,
where a no-op Go webhook shows what that measure can resolve on the bench machine). Meanwhile
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

Supervision: the accepting thread is the loop `webhook` (it beats every turn of
`serve_forever`, at least every 0.5 s). An unexpected exception while accepting one connection
or serving it (not a client's disconnect or timeout) is logged with its traceback and counted;
that connection ends, the server goes on; should `serve_forever` itself raise, it is entered
again after a backoff.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controller.webhook import phases
from controller.webhook.endpoint import (
    HEARTBEAT_S,
    IDLE_TIMEOUT_S,
    MAX_BODY,
    READ_BUFFER,
    AdmissionServer,
    BadReview,
    Review,
    answer,
    parse_review,
)
from dra_driver.supervision import BACKOFF_MAX_S, BACKOFF_START_S

log = logging.getLogger("vgpu-dra.webhook.server")


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
            wrapped = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except OSError:
            sock.close()
            raise  # serve_forever drops this connection and goes on
        except Exception as exc:
            sock.close()
            self.owner._failed(self.owner._serving_loop, "accepting a connection", address)
            raise OSError(f"connection from {address} dropped") from exc  # as above
        wrapped.accepted_at = _clock()  # type: ignore[attr-defined]  # for --webhook-phase-timing
        return wrapped, address

    def service_actions(self) -> None:
        # Each turn of serve_forever (a connection accepted, or its 0.5 s poll): progress.
        self.owner._serving_loop.beat()

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
        self.owner._failed(self.owner._serving_loop, "a connection", client_address)


class WebhookServer(AdmissionServer):
    """Serves the admission endpoints on `address` from daemon threads, one per connection."""

    def _listen(self, address: tuple[str, int]) -> None:
        self._httpd = _TLSServer(address, self._handler_class(), self)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="webhook", daemon=True)

    def _serve(self) -> None:
        """`serve_forever` until `stop`, entered again after a backoff should it raise."""
        backoff = BACKOFF_START_S
        try:
            while not self._stopping.is_set():
                try:
                    self._httpd.serve_forever(poll_interval=HEARTBEAT_S / 2)
                    return  # shut down
                except Exception:
                    if self._stopping.is_set():
                        return
                    self._failed(self._serving_loop, "serving", "every client")
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
        finally:
            self._serving_loop.end(stopped=self._stopping.is_set())

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
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

    def _admission_ended(self) -> None:
        super()._admission_ended()
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
        response, decision = self._judge(operation, review, request)
        phases.mark("review")
        payload = answer(request["uid"], response)
        phases.mark("encode")
        handler._reply(  # type: ignore[attr-defined]
            HTTPStatus.OK, payload, "application/json", self._draining.is_set()
        )
        elapsed = _clock() - started
        phases.mark("write")
        self._answered(operation, request, decision, elapsed, phases.current())


def _clock() -> float:
    return time.perf_counter()
