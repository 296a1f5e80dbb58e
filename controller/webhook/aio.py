"""The webhook's event-loop transport (`--webhook-transport asyncio`): one asyncio loop thread
serves every established connection, instead of one thread per connection
(controller.webhook.server); a second loop thread accepts connections and does their TLS
handshakes.

Why an event loop: under a burst of pod creations, most admissions come on new connections;
with a thread per connection, ~130 threads and their TLS handshakes take turns at the GIL, and a
slow admission spent ~80 % of its time waiting for it (docs/webhook.md, Performance). asyncio
(standard library, with the `ssl` module) and not a pool of threads: a fixed pool would still
hand the GIL between its threads, and would block a worker per idle kept-alive connection.

Why a second loop for the handshakes: with one loop, a burst's ~300 handshakes (OpenSSL work
driven from the loop) queued behind each other and behind the admissions, and the admissions
behind them. On their own loop thread, the handshakes' OpenSSL work (which runs without the GIL)
can use the other CPU while the serving loop answers. The handshake loop accepts, counts the
connection against the cap, wraps it with the context the `ContextHolder` holds at that moment
(so a certificate reload applies to new connections at once, and client-CA verification happens
here), and drives the handshake without blocking (many handshakes at once, each bounded by the
request timeout: a client that stalls its handshake holds no thread). An established connection
(the `ssl.SSLSocket`, non-blocking) is handed to the serving loop, which reads it into a
`StreamReader` (paused when its buffer is full, as asyncio's own protocol does) and writes to it
directly. asyncio's `start_tls` cannot be used for this: its TLS state lives in the loop that
did the handshake.

What it keeps from the threaded transport: a request's headers and body each have `timeout_s`; a
kept-alive connection may idle `IDLE_TIMEOUT_S`; bodies above `MAX_BODY` (413) or without
Content-Length (411) are refused unread; connections beyond the cap are closed at once; while
draining every answer closes its connection. The state and an admission's bookkeeping (parse,
span, review, answer, histogram, log line) are the shared base's (`endpoint.AdmissionServer`).
The review is pure CPU (about 0.2 ms) and runs on the loop, except when a mutation's claim
template must be read or created through the API (once per shape per grace/4): the ensure then
refuses to wait (`templates.non_blocking`) and the admission is redone in a small executor while
the loop serves the others. (Running every mutation in the executor was measured first: p50
8.4 ms, the hop to a thread and back waits for the GIL behind the loop.)

Supervision: the serving loop is the supervised loop `webhook`, the handshake loop
`webhook-accept`; each beats every `HEARTBEAT_S` while it turns, so a loop blocked (a review that
never returns) stalls visibly. An unexpected exception in one connection, handshake or accept
(not a client's disconnect or timeout) is logged with its traceback and counted on its loop; that
connection ends, the loops go on (the accept loop after a backoff).

Phase timing: the phases are stamped on the admission's own record (not the thread-local one,
which every connection on the loop shares), and the CPU/queue split is the serving loop thread's:
time a mutation spends in the executor counts as asleep. `tls_ms` runs from the accept (on the
handshake loop, which accepts promptly) to the handshake done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import ssl
import threading
import time
from http import HTTPStatus

from controller.webhook import phases
from controller.webhook.endpoint import (
    ACCEPT_LOOP,
    HEARTBEAT_S,
    IDLE_TIMEOUT_S,
    LOOP_DEADLINE_S,
    MAX_BODY,
    READ_BUFFER,
    AdmissionServer,
    BadReview,
    Review,
    answer,
    parse_review,
)
from controller.webhook.templates import WouldBlock, non_blocking
from dra_driver.supervision import BACKOFF_MAX_S, BACKOFF_START_S, Loop

log = logging.getLogger("vgpu-dra.webhook.aio")
# Headers of an AdmissionReview POST are a few hundred bytes; more is not an API server.
MAX_HEADERS = 64 * 1024
# Mutations that may wait for the API at once; more queue in the executor. The template ensure
# dedupes concurrent creations of one template, so a few threads cover a burst.
ENSURE_WORKERS = 8
BACKLOG = 256  # 200 concurrent pod creations open many connections at once


class _Refused(Exception):
    """The request cannot be served; answered with `status` and the connection closed."""

    def __init__(self, status: HTTPStatus, text: str) -> None:
        super().__init__(text)
        self.status = status


class AsyncWebhookServer(AdmissionServer):
    """Serves the admission endpoints on `address`: handshakes on one event-loop thread,
    established connections on another."""

    def _listen(self, address: tuple[str, int]) -> None:
        family, kind, proto, _, bound = socket.getaddrinfo(
            address[0] or None, address[1], type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self._listener = socket.socket(family, kind, proto)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(bound)
            self._listener.listen(BACKLOG)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self._accept_loop = self._supervisor.register(ACCEPT_LOOP, LOOP_DEADLINE_S)
        self._connections: set[asyncio.Task[None]] = set()  # the serving loop's
        self._handshaking: set[asyncio.Task[None]] = set()  # the handshake loop's
        self._closing = False
        self._executor = concurrent.futures.ThreadPoolExecutor(
            ENSURE_WORKERS, thread_name_prefix="webhook-ensure"
        )
        self._loop = asyncio.new_event_loop()
        self._handshakes = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=_run, args=(self._loop,), name="webhook", daemon=True
        )
        self._accept_thread = threading.Thread(
            target=_run, args=(self._handshakes,), name="webhook-accept", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()
        self._accept_thread.start()
        asyncio.run_coroutine_threadsafe(self._accept(), self._handshakes)
        self._loop.call_soon_threadsafe(_heartbeat, self._loop, self._serving_loop)
        self._handshakes.call_soon_threadsafe(_heartbeat, self._handshakes, self._accept_loop)

    def stop(self) -> None:
        # Handshakes first (no more connections to hand over), then the established ones.
        for loop, thread, shutdown in (
            (self._handshakes, self._accept_thread, self._stop_accepting),
            (self._loop, self._thread, self._stop_serving),
        ):
            if thread.is_alive():
                asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=5)
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=5)
            if not loop.is_running():
                loop.close()
        self._listener.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- the handshake loop --------------------------------------------------------------

    async def _accept(self) -> None:
        """Accept until cancelled (`stop`); an unexpected failure costs a backoff, not the loop."""
        loop = asyncio.get_running_loop()
        backoff = BACKOFF_START_S
        try:
            while True:
                try:
                    await self._accept_one(loop)
                    backoff = BACKOFF_START_S
                except Exception:
                    self._failed(self._accept_loop, "accepting a connection", "a client")
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._accept_loop.ended = True  # a stall at once
            raise

    async def _accept_one(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            sock, peer = await loop.sock_accept(self._listener)
        except OSError as exc:  # e.g. out of file descriptors: try again shortly
            log.warning("webhook: accept failed: %s", exc)
            await asyncio.sleep(0.1)
            return
        counted = False
        try:
            counted = self._connection_opened(peer)
            if not counted:
                sock.close()
                return
            task = loop.create_task(self._handshake(sock, peer))
        except BaseException:
            sock.close()
            if counted:
                self._connection_closed()
            raise
        self._handshaking.add(task)
        task.add_done_callback(self._handshaking.discard)

    async def _handshake(self, sock: socket.socket, peer: object) -> None:
        """Upgrade `sock` to TLS and hand it to the serving loop; or close it and count it out."""
        accepted = _clock()
        handed = False
        tls: ssl.SSLSocket | None = None
        try:
            context = self._holder.current()
            if context is None:  # no certificate yet: nothing we could say
                return
            tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            async with asyncio.timeout(self._timeout_s):
                while True:
                    try:
                        tls.do_handshake()
                        break
                    except ssl.SSLWantReadError:
                        await _ready(tls.fileno(), readable=True)
                    except ssl.SSLWantWriteError:
                        await _ready(tls.fileno(), readable=False)
            tls_ms = round((_clock() - accepted) * 1e3, 3) if self._phase_timing else None
            self._loop.call_soon_threadsafe(self._adopt, tls, peer, tls_ms)
            handed = True
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            log.debug("webhook handshake with %s failed: %s", peer, exc)
        except Exception:
            self._failed(self._accept_loop, "a TLS handshake", peer)
        finally:
            if not handed:
                (tls or sock).close()
                self._connection_closed()

    async def _stop_accepting(self) -> None:
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()  # the accept loop and every handshake (their sockets close)
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.gather(*pending, return_exceptions=True)

    # ---- the serving loop ----------------------------------------------------------------

    def _adopt(self, tls: ssl.SSLSocket, peer: object, tls_ms: float | None) -> None:
        """On the serving loop: serve an established connection."""
        if self._closing:
            tls.close()
            self._connection_closed()
            return
        stream = _TLSStream(self._loop, tls)
        task = self._loop.create_task(self._connection(stream, peer, tls_ms))
        self._connections.add(task)

    async def _stop_serving(self) -> None:
        self._closing = True
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _connection(self, stream: _TLSStream, peer: object, tls_ms: float | None) -> None:
        task = asyncio.current_task()
        try:
            await self._serve(stream, tls_ms)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.debug("webhook connection from %s ended: %s", peer, exc)
        except asyncio.CancelledError:
            pass
        except Exception:
            self._failed(self._serving_loop, "a connection", peer)
        finally:
            self._connection_closed()
            if task is not None:
                self._connections.discard(task)
            stream.close()  # no close_notify wait: the client may be gone

    async def _serve(self, stream: _TLSStream, tls_ms: float | None) -> None:
        reader = stream.reader
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
            in_flight = self._admission_began()
            timed = None
            if self._phase_timing:
                timed = phases.Phases(in_flight, tls_ms)
                tls_ms = None  # only the connection's first request waited for it
            try:
                keep = await self._request(line, stream, timed)
            finally:
                self._admission_ended()
            if not keep:
                return

    async def _request(self, line: bytes, stream: _TLSStream, timed: phases.Phases | None) -> bool:
        """Serve one request; whether the connection may carry another."""
        try:
            async with asyncio.timeout(self._timeout_s):
                method, path, version, headers, body = await _read_request(
                    line, stream.reader, timed
                )
        except _Refused as refused:
            await _reply(stream, refused.status, (str(refused) + "\n").encode(), "text/plain", True)
            return False
        close = (
            self._draining.is_set()
            or headers.get("connection", "").lower() == "close"
            or version != "HTTP/1.1"
        )
        if method == "GET":
            if path == "/healthz":
                await _reply(stream, HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8", close)
            elif path == "/metrics":
                exposition = self._metrics.exposition()
                await _reply(stream, HTTPStatus.OK, exposition, "text/plain; version=0.0.4", close)
            else:
                await _reply(stream, HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", close)
            return not close
        route = self._routes.get(path.split("?", 1)[0]) if method == "POST" else None
        if route is None:
            await _reply(stream, HTTPStatus.NOT_FOUND, b"no such path\n", "text/plain", True)
            return False
        return await self._admit(stream, route, body, close, timed)

    async def _admit(
        self,
        stream: _TLSStream,
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
            await _reply(stream, HTTPStatus.BAD_REQUEST, f"{exc}\n".encode(), "text/plain", True)
            self._metrics.observe(operation, "error", _clock() - started)
            return False
        if timed is not None:
            timed.mark("decode")

        def judge(inline: bool) -> tuple[dict[str, object], str] | None:
            """The review and its span; None when, inline, it would wait for the API."""
            phases.begin(timed)  # the review's own marks (translate, ensure) go to this record
            try:
                with non_blocking() if inline else contextlib.nullcontext():
                    return self._judge(operation, review, request)
            except WouldBlock:
                return None
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
        await _reply(stream, HTTPStatus.OK, payload, "application/json", close)
        elapsed = _clock() - started
        if timed is not None:
            timed.mark("write")
        self._answered(operation, request, decision, elapsed, timed)
        return not close


class _TLSStream:
    """An established TLS connection served from the loop: a `StreamReader` fed from the socket
    (this object is its transport for flow control: the reader pauses it when its buffer
    passes twice its limit and resumes it when it needs data), and whole writes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tls: ssl.SSLSocket) -> None:
        self._loop = loop
        self._tls = tls
        self._fd = tls.fileno()
        self._reading = False
        self._closed = False
        self.reader = asyncio.StreamReader(limit=MAX_HEADERS, loop=loop)
        self.reader.set_transport(self)  # type: ignore[arg-type]  # pause/resume_reading only
        self.resume_reading()
        # The client's first request often came with its last handshake message: OpenSSL holds
        # it already, and the socket will not become readable for it.
        loop.call_soon(self._readable)

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading and not self._closed:
            self._reading = True
            self._loop.add_reader(self._fd, self._readable)
            if self._tls.pending():  # decrypted already: the socket will not signal it
                self._loop.call_soon(self._readable)

    def _readable(self) -> None:
        try:
            while self._reading:  # feed_data may pause us
                data = self._tls.recv(READ_BUFFER)
                if not data:
                    self.pause_reading()
                    self.reader.feed_eof()
                    return
                self.reader.feed_data(data)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return  # a partial record: the rest comes with the next readable event
        except OSError as exc:
            self.pause_reading()
            self.reader.set_exception(exc)

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                sent = self._tls.send(view)
            except ssl.SSLWantWriteError:  # the socket's buffer is full: wait for room
                await _ready(self._fd, readable=False)
                continue
            view = view[sent:]

    def close(self) -> None:
        self.pause_reading()
        self._closed = True
        self._tls.close()


def _heartbeat(loop: asyncio.AbstractEventLoop, beats: Loop) -> None:
    """Beat `beats` now and every HEARTBEAT_S while `loop` turns (until it stops)."""
    beats.beat()
    loop.call_later(HEARTBEAT_S, _heartbeat, loop, beats)


def _run(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


async def _ready(fd: int, *, readable: bool) -> None:
    """Until `fd` is readable (or writable)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    if readable:
        loop.add_reader(fd, wake)
    else:
        loop.add_writer(fd, wake)
    try:
        await waiter
    finally:
        if readable:
            loop.remove_reader(fd)
        else:
            loop.remove_writer(fd)


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
    stream: _TLSStream,
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
    await stream.send(head.encode("latin-1") + body)  # one write: one TLS record


def _clock() -> float:
    return time.perf_counter()
