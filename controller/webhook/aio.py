"""The webhook's event-loop transport (`--webhook-transport asyncio`): one asyncio loop thread
serves every connection, instead of one thread per connection (controller.webhook.server).

Why: under a burst of pod creations, most admissions come on new connections; with a thread per
connection, ~130 threads and their TLS handshakes take turns at the GIL, and a slow admission
spent ~80 % of its time waiting for it (docs/webhook.md, Performance). One loop thread has no
one to wait for but the handshakes it interleaves itself. asyncio (standard library, with the
`ssl` module) and not a pool of threads: a fixed pool would still hand the GIL between its
threads, and would block a worker per idle kept-alive connection.

What it keeps from the threaded transport: each new connection is upgraded to TLS with the
context the `ContextHolder` holds at that moment (`StreamWriter.start_tls`), so a certificate
reload applies to new connections at once and client-CA verification happens at the handshake;
the handshake, the request's headers and its body each have `timeout_s`; a kept-alive connection
may idle `IDLE_TIMEOUT_S`; bodies above `MAX_BODY` (413) or without Content-Length (411) are
refused unread; connections beyond the cap are closed at once; while draining every answer
closes its connection. The admission itself reuses the threaded server's pieces (parse, span,
review, answer, histogram, log line). The review is pure CPU (about 0.2 ms) and runs on the
loop, except when a mutation's claim template must be read or created through the API (once
per shape per grace/4): the ensure then refuses to wait (`templates.non_blocking`) and the
admission is redone in a small executor while the loop serves the others. (Running every
mutation in the executor was measured first: p50 8.4 ms, the hop to a thread and back waits
for the GIL behind the loop.)

Phase timing: the phases are stamped on the admission's own record (not the thread-local one,
which every connection on the loop shares), and the CPU/queue split is the loop thread's: time
a mutation spends in the executor counts as asleep.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import ssl
import threading
import time
from http import HTTPStatus

from opentelemetry import trace

from controller.webhook import phases
from controller.webhook.certs import ContextHolder
from controller.webhook.metrics import WebhookMetrics
from controller.webhook.server import (
    DEFAULT_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_BODY,
    MAX_CONNECTIONS,
    MUTATE_PATH,
    TRACER_NAME,
    VALIDATE_PATH,
    BadReview,
    Review,
    WebhookServer,
    admission_span,
    answer,
    parse_review,
)
from controller.webhook.templates import WouldBlock, non_blocking
from dra_driver.tracing import installed_tracer

log = logging.getLogger("vgpu-dra.webhook.aio")
# Headers of an AdmissionReview POST are a few hundred bytes; more is not an API server.
MAX_HEADERS = 64 * 1024
# Mutations that may wait for the API at once; more queue in the executor. The template ensure
# dedupes concurrent creations of one template, so a few threads cover a burst.
ENSURE_WORKERS = 8


class _Refused(Exception):
    """The request cannot be served; answered with `status` and the connection closed."""

    def __init__(self, status: HTTPStatus, text: str) -> None:
        super().__init__(text)
        self.status = status


class AsyncWebhookServer:
    """Serves the admission endpoints on `address` from one event-loop thread; the same
    interface as `WebhookServer`."""

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
        self._tracer = tracer if tracer is not None else installed_tracer(TRACER_NAME)
        self._routes = {MUTATE_PATH: ("mutate", mutate), VALIDATE_PATH: ("validate", validate)}
        self._holder = holder
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._phase_timing = phase_timing
        self._draining = False
        self._open = 0
        self._in_flight = 0
        self._connections: set[asyncio.Task[None]] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            ENSURE_WORKERS, thread_name_prefix="webhook-ensure"
        )
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(
                self._connection, address[0], address[1], backlog=256, limit=MAX_HEADERS
            )
        )
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def drain(self) -> None:
        """Keep serving, but close each connection after its next answer (as `WebhookServer`)."""
        self._draining = True

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._executor.shutdown(wait=False, cancel_futures=True)
        if not self._loop.is_running():
            self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def _shutdown(self) -> None:
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        if self._open >= self._max_connections:
            log.warning(
                "webhook: %d connections open, refusing one from %s", self._max_connections, peer
            )
            writer.transport.abort()
            return
        self._open += 1
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (ssl.SSLError, ConnectionError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.debug("webhook connection from %s ended: %s", peer, exc)
        except asyncio.CancelledError:
            pass
        finally:
            self._open -= 1
            self._connections.discard(task)
            writer.transport.abort()  # no close_notify wait: the client may be gone

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = _clock()
        context = self._holder.current()
        if context is None:  # no certificate yet: nothing we could say
            return
        await writer.start_tls(context, ssl_handshake_timeout=self._timeout_s)
        tls_ms: float | None = round((_clock() - accepted) * 1e3, 3) if self._phase_timing else None
        while True:
            # Waiting for the next request: the kept-alive idle allowance. asyncio.timeout, not
            # wait_for: no task of its own, so no extra turn of the loop per request.
            try:
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    line = await reader.readline()
            except TimeoutError:
                return
            if not line:
                return
            timed = None
            if self._phase_timing:
                timed = phases.Phases(self._in_flight + 1, tls_ms)
                tls_ms = None  # only the connection's first request waited for it
            self._in_flight += 1
            try:
                keep = await self._request(line, reader, writer, timed)
            finally:
                self._in_flight -= 1
            if not keep:
                return

    async def _request(
        self,
        line: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        timed: phases.Phases | None,
    ) -> bool:
        """Serve one request; whether the connection may carry another."""
        try:
            async with asyncio.timeout(self._timeout_s):
                method, path, version, headers, body = await _read_request(line, reader, timed)
        except _Refused as refused:
            await _reply(writer, refused.status, (str(refused) + "\n").encode(), "text/plain", True)
            return False
        close = (
            self._draining
            or headers.get("connection", "").lower() == "close"
            or version != "HTTP/1.1"
        )
        if method == "GET":
            if path == "/healthz":
                await _reply(writer, HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8", close)
            elif path == "/metrics":
                exposition = self._metrics.exposition()
                await _reply(writer, HTTPStatus.OK, exposition, "text/plain; version=0.0.4", close)
            else:
                await _reply(writer, HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", close)
            return not close
        route = self._routes.get(path.split("?", 1)[0]) if method == "POST" else None
        if route is None:
            await _reply(writer, HTTPStatus.NOT_FOUND, b"no such path\n", "text/plain", True)
            return False
        return await self._admit(writer, route, body, close, timed)

    async def _admit(
        self,
        writer: asyncio.StreamWriter,
        route: tuple[str, Review],
        body: bytes,
        close: bool,
        timed: phases.Phases | None,
    ) -> bool:
        """Answer one admission; whether the connection may carry another."""
        operation, review = route
        started = _clock()
        try:
            request = parse_review(body)
        except BadReview as exc:
            await _reply(writer, HTTPStatus.BAD_REQUEST, f"{exc}\n".encode(), "text/plain", True)
            self._metrics.observe(operation, "error", _clock() - started)
            return False
        if timed is not None:
            timed.mark("decode")
        kind = (request.get("kind") or {}).get("kind", "")

        def judge(inline: bool) -> tuple[dict[str, object], str] | None:
            """The review and its span; None when, inline, it would wait for the API."""
            phases.begin(timed)  # the review's own marks (translate, ensure) go to this record
            try:
                with (
                    admission_span(self._tracer, operation, request) as current,
                    non_blocking() if inline else contextlib.nullcontext(),
                ):
                    try:
                        response, decision = WebhookServer.review_safely(operation, review, request)
                    except WouldBlock:
                        if current is not None:
                            current.set_attribute("vgpu_dra.admission.deferred", True)
                        return None
                    if current is not None:
                        current.set_attribute("vgpu_dra.admission.decision", decision)
                return response, decision
            finally:
                phases.begin(None)

        # Pure CPU (about 0.2 ms) on the loop; only an admission whose template must be read or
        # created through the API goes to the executor (once per shape per grace/4), redone
        # there from the start.
        judged = judge(True)
        if judged is None:
            judged = await self._loop.run_in_executor(self._executor, judge, False)
            assert judged is not None
        response, decision = judged
        if timed is not None:
            timed.mark("review")
        payload = answer(request["uid"], response)
        if timed is not None:
            timed.mark("encode")
        await _reply(writer, HTTPStatus.OK, payload, "application/json", close)
        elapsed = _clock() - started
        if timed is not None:
            timed.mark("write")
        self._metrics.observe(operation, decision, elapsed)
        timing = timed.fields() if timed is not None else {}
        WebhookServer.log_admission(operation, kind, request, decision, elapsed, timing=timing)
        return not close


async def _read_request(
    line: bytes, reader: asyncio.StreamReader, timed: phases.Phases | None
) -> tuple[str, str, str, dict[str, str], bytes]:
    """(method, path, version, headers with lower-case names, body) of the request whose first
    line is `line`; _Refused for what cannot be served."""
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(HTTPStatus.BAD_REQUEST, "malformed request line")
    method, path, version = parts
    headers: dict[str, str] = {}
    size = 0
    while True:
        try:
            raw = await reader.readline()
        except ValueError:  # one line beyond the reader's limit
            raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "header too large") from None
        size += len(raw)
        if size > MAX_HEADERS:
            raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "headers too large")
        if not raw.endswith(b"\n"):
            raise asyncio.IncompleteReadError(raw, None)
        text = raw.decode("latin-1").strip()
        if not text:
            break
        name, sep, value = text.partition(":")
        if not sep:
            raise _Refused(HTTPStatus.BAD_REQUEST, f"malformed header {text[:40]!r}")
        headers[name.strip().lower()] = value.strip()
    if timed is not None:
        timed.mark("headers")
    if method != "POST":
        return method, path, version, headers, b""
    length_text = headers.get("content-length")
    if length_text is None or not length_text.isdigit():
        raise _Refused(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
    length = int(length_text)
    if length > MAX_BODY:
        raise _Refused(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"body of {length} bytes exceeds the limit of {MAX_BODY}",
        )
    body = await reader.readexactly(length)
    if timed is not None:
        timed.mark("body")
    return method, path, version, headers, body


async def _reply(
    writer: asyncio.StreamWriter,
    status: HTTPStatus,
    body: bytes,
    content_type: str,
    close: bool,
) -> None:
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
    )
    writer.write(head.encode("latin-1") + body)  # one write: one TLS record
    with contextlib.suppress(ConnectionError):
        await writer.drain()


def _clock() -> float:
    return time.perf_counter()
