"""The webhook's HTTPS server (controller.webhook.server) with real TLS on loopback.

Proves: an AdmissionReview v1 gets an AdmissionReview v1 answer carrying the request's uid and the
review function's response, over a certificate signed by our CA for 127.0.0.1; non-reviews are
400, missing or oversized bodies 411/413 without the body being read; a review function that
raises gives allowed:false (code 500) and the connection survives; the histogram counts each
admission by operation and decision and is served on /metrics; a reloaded certificate is used
by new connections while a kept-alive connection opened before keeps working; a failed
handshake frees its place under the connection cap; a body far above the read buffer arrives
whole; each admission is one log line and one span.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import json
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controller.webhook import certs
from controller.webhook.metrics import WebhookMetrics
from controller.webhook.server import MAX_BODY, MAX_CONNECTIONS, WebhookServer
from vgpu_testbed.cluster import webhook_client
from vgpu_testbed.polling import wait_for

JSON = dict[str, Any]
NAMES = certs.Names.for_service("hook", "ns", ["127.0.0.1"])
DAY = dt.timedelta(days=1)


def review(uid: str = "u-1", **request: Any) -> bytes:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"kind": "Pod"}, "namespace": "ns", **request},
    }
    return json.dumps(body).encode()


def client_context(tmp_path: Path, *cas: bytes) -> ssl.SSLContext:
    bundle = tmp_path / f"ca-{len(list(tmp_path.iterdir()))}.pem"
    bundle.write_bytes(b"".join(cas))
    return ssl.create_default_context(cafile=str(bundle))


class Served:
    def __init__(
        self,
        holder: certs.ContextHolder,
        ca: bytes,
        timeout_s: float = 5,
        max_connections: int = MAX_CONNECTIONS,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.ca = ca
        self.holder = holder
        self.metrics = WebhookMetrics()
        self.seen: list[JSON] = []
        self.server = WebhookServer(
            ("127.0.0.1", 0),
            holder,
            mutate=self._mutate,
            validate=self._validate,
            metrics=self.metrics,
            timeout_s=timeout_s,
            max_connections=max_connections,
            tracer=tracer,
        )

    def _mutate(self, request: JSON) -> tuple[JSON, str]:
        self.seen.append(request)
        if request.get("name") == "boom":
            raise RuntimeError("a bug")
        return {"allowed": True, "warnings": ["translated"]}, "patched"

    def _validate(self, request: JSON) -> tuple[JSON, str]:
        return {"allowed": False, "status": {"code": 422, "message": "bad"}}, "denied"

    def connect(self, context: ssl.SSLContext) -> http.client.HTTPSConnection:
        host, port = self.server.address
        return http.client.HTTPSConnection(host, port, context=context, timeout=5)


def issue(ca: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
    return certs.new_serving(ca[0], ca[1], NAMES, DAY)


@contextmanager
def serving(
    timeout_s: float = 5,
    max_connections: int = MAX_CONNECTIONS,
    tracer: trace.Tracer | None = None,
) -> Iterator[Served]:
    """A started server with a fresh CA and serving certificate; stopped afterwards."""
    ca = certs.new_ca(DAY * 2)
    holder = certs.ContextHolder()
    holder.load(*issue(ca))
    s = Served(holder, ca[0], timeout_s, max_connections, tracer)
    s.server.start()
    try:
        yield s
    finally:
        s.server.stop()


@pytest.fixture
def served() -> Iterator[Served]:
    with serving() as s:
        yield s


def post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    return answer.status, answer.read()


def test_an_admission_review_is_answered_with_its_uid(served: Served, tmp_path: Path) -> None:
    conn = served.connect(client_context(tmp_path, served.ca))
    status, body = post(conn, "/mutate-pods", review("abc", operation="CREATE"))
    assert status == 200
    answer = json.loads(body)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"] == {"uid": "abc", "allowed": True, "warnings": ["translated"]}
    assert served.seen[0]["operation"] == "CREATE"
    status, body = post(conn, "/validate", review("def"))  # same kept-alive connection
    assert json.loads(body)["response"] == {
        "uid": "def",
        "allowed": False,
        "status": {"code": 422, "message": "bad"},
    }
    conn.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not JSON"),
        (b"[]", "not an AdmissionReview"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
         "only v1"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
                     "request": {}}).encode(), "without request.uid"),
    ],
)  # fmt: skip
def test_what_is_not_a_review_is_a_400(
    served: Served, tmp_path: Path, body: bytes, message: str
) -> None:
    conn = served.connect(client_context(tmp_path, served.ca))
    status, text = post(conn, "/mutate-pods", body)
    assert status == 400
    assert message in text.decode()
    assert not served.seen


def test_body_limits(served: Served, tmp_path: Path) -> None:
    context = client_context(tmp_path, served.ca)
    conn = served.connect(context)
    conn.putrequest("POST", "/mutate-pods")
    conn.putheader("Content-Length", str(MAX_BODY + 1))
    conn.endheaders()  # the body is never sent: the server answers from the header alone
    answer = conn.getresponse()
    assert answer.status == 413
    assert f"limit of {MAX_BODY}" in answer.read().decode()
    conn.close()
    conn = served.connect(context)
    conn.putrequest("POST", "/mutate-pods", skip_accept_encoding=True)
    conn.endheaders()
    answer = conn.getresponse()
    assert answer.status == 411
    conn.close()
    conn = served.connect(context)
    status, _ = post(conn, "/elsewhere", review())
    assert status == 404
    conn.close()


def test_a_failing_review_is_a_denial_and_the_connection_lives_on(
    served: Served, tmp_path: Path
) -> None:
    conn = served.connect(client_context(tmp_path, served.ca))
    status, body = post(conn, "/mutate-pods", review("x", name="boom"))
    assert status == 200
    response = json.loads(body)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "a bug" not in response["status"]["message"]  # internals stay in our log
    status, body = post(conn, "/mutate-pods", review("y", name="fine"))
    assert json.loads(body)["response"]["allowed"] is True
    conn.close()


def test_the_histogram_counts_admissions_by_decision(served: Served, tmp_path: Path) -> None:
    conn = served.connect(client_context(tmp_path, served.ca))
    for uid in ("a", "b"):
        post(conn, "/mutate-pods", review(uid))
    post(conn, "/validate", review("c"))
    post(conn, "/mutate-pods", b"{")
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    metric = "vgpu_dra_webhook_admission_duration_seconds_count"
    assert f'{metric}{{decision="patched",operation="mutate"}} 2.0' in text
    assert f'{metric}{{decision="denied",operation="validate"}} 1.0' in text
    assert f'{metric}{{decision="error",operation="mutate"}} 1.0' in text


def served_serial(conn: http.client.HTTPSConnection) -> int:
    conn.connect()
    sock = conn.sock
    assert isinstance(sock, ssl.SSLSocket)
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_reloaded_certificate_serves_new_connections_and_old_ones_continue(
    served: Served, tmp_path: Path
) -> None:
    new_ca = certs.new_ca(DAY * 2)
    both = client_context(tmp_path, served.ca, new_ca[0])
    old_conn = served.connect(both)
    old_serial = served_serial(old_conn)
    assert post(old_conn, "/mutate-pods", review("1"))[0] == 200
    cert, key = issue(new_ca)
    assert served.holder.load(cert, key)
    assert not served.holder.load(cert, key)  # the same pair again changes nothing
    new_conn = served.connect(both)
    assert served_serial(new_conn) == x509.load_pem_x509_certificate(cert).serial_number
    assert served_serial(new_conn) != old_serial
    assert post(new_conn, "/mutate-pods", review("2"))[0] == 200
    assert post(old_conn, "/mutate-pods", review("3"))[0] == 200  # kept alive across the swap
    # A client that trusts only the old CA can no longer connect anew.
    only_old = served.connect(client_context(tmp_path, served.ca))
    with pytest.raises(ssl.SSLError):
        only_old.connect()
    for conn in (old_conn, new_conn, only_old):
        conn.close()


def test_an_idle_kept_alive_connection_outlives_the_request_timeout(tmp_path: Path) -> None:
    """The API server closes idle webhook connections itself (after 90 s); were we to close
    first, it could send an admission on a connection being closed and fail it. A stalled
    request, though, is dropped after the request timeout."""
    with serving(timeout_s=0.3) as s:
        context = client_context(tmp_path, s.ca)
        conn = s.connect(context)
        assert post(conn, "/mutate-pods", review("1"))[0] == 200
        time.sleep(1.0)  # idle for three request timeouts
        assert post(conn, "/mutate-pods", review("2"))[0] == 200
        conn.close()
        stalled = s.connect(context)
        stalled.connect()
        sock = stalled.sock
        assert sock is not None
        sock.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        sock.settimeout(10)
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the server
        assert time.monotonic() - started < 5
        stalled.close()


def test_each_admission_logs_one_structured_line(
    served: Served, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vgpu-dra.webhook.server")
    conn = served.connect(client_context(tmp_path, served.ca))
    status, _ = post(conn, "/mutate-pods", review("uid-7", operation="CREATE", name="p1"))
    assert status == 200
    conn.close()
    (record,) = admission_records(caplog, 1)  # written after the answer: wait for it
    fields = record.__dict__
    assert (fields["uid"], fields["operation"], fields["kind"]) == ("uid-7", "mutate", "Pod")
    assert (fields["namespace"], fields["object"], fields["decision"]) == ("ns", "p1", "patched")
    assert fields["dry_run"] is False
    assert 0 <= fields["ms"] < 5000


def admission_records(caplog: pytest.LogCaptureFixture, count: int) -> list[logging.LogRecord]:
    """The admission log lines, once `count` are written (each follows its answer)."""

    def found() -> list[logging.LogRecord] | None:
        records = [r for r in caplog.records if r.getMessage().startswith("admission")]
        return records if len(records) >= count else None

    return wait_for(f"{count} admission log lines", found, timeout=5, interval=0.01)


def test_connections_beyond_the_limit_are_closed_at_once(tmp_path: Path) -> None:
    with serving(max_connections=2) as s:
        context = client_context(tmp_path, s.ca)
        conns = [s.connect(context) for _ in range(3)]
        try:
            for conn in conns[:2]:
                assert post(conn, "/mutate-pods", review())[0] == 200  # kept alive: two open
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                post(conns[2], "/mutate-pods", review())
            conns[0].close()

            def third_admitted() -> bool:
                conn = s.connect(context)
                try:
                    return post(conn, "/mutate-pods", review())[0] == 200
                except (ssl.SSLError, ConnectionError, OSError):
                    return False
                finally:
                    conn.close()

            deadline = time.monotonic() + 10
            while not third_admitted():  # the closed one's thread counts itself out
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            for conn in conns:
                conn.close()


def test_a_failed_handshake_frees_its_place_under_the_limit(tmp_path: Path) -> None:
    with serving(max_connections=1) as s:
        for _ in range(3):  # each would hold the only place if it were not counted out
            with socket.create_connection(s.server.address, timeout=5) as raw:
                raw.sendall(b"GET / HTTP/1.1\r\n\r\n")  # not a TLS ClientHello
                with contextlib.suppress(OSError):
                    while raw.recv(1024):  # until the server closes it
                        pass
        context = client_context(tmp_path, s.ca)
        wait_for("an admission after failed handshakes", lambda: _admitted(s, context), 10)


def _admitted(s: Served, context: ssl.SSLContext) -> bool:
    conn = s.connect(context)
    try:
        return post(conn, "/mutate-pods", review())[0] == 200
    except (ssl.SSLError, ConnectionError, OSError):
        return False
    finally:
        conn.close()


def test_a_large_review_and_the_next_on_its_connection_arrive_whole(
    served: Served, tmp_path: Path
) -> None:
    # ~1 MiB: far beyond one read of the buffer.
    padding = "x" * (1024 * 1024)
    conn = served.connect(client_context(tmp_path, served.ca))
    status, body = post(conn, "/mutate-pods", review("big", object={"padding": padding}))
    assert status == 200
    assert json.loads(body)["response"]["uid"] == "big"
    assert served.seen[-1]["object"]["padding"] == padding
    status, body = post(conn, "/mutate-pods", review("next"))
    assert (status, json.loads(body)["response"]["uid"]) == (200, "next")
    conn.close()


def test_each_admission_is_one_span_with_its_decision(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with serving(tracer=provider.get_tracer("test")) as s:
        conn = s.connect(client_context(tmp_path, s.ca))
        post(conn, "/mutate-pods", review("m-1", dryRun=True))
        post(conn, "/validate", review("v-1"))
        post(conn, "/mutate-pods", review("m-2", name="boom"))
        conn.close()
    finished = exporter.get_finished_spans()
    spans = {span.attributes["vgpu_dra.admission.uid"]: span for span in finished}
    assert sorted(spans) == ["m-1", "m-2", "v-1"]
    assert spans["m-1"].name == "admission mutate"
    assert spans["m-1"].attributes["vgpu_dra.admission.decision"] == "patched"
    assert spans["m-1"].attributes["vgpu_dra.admission.dry_run"] is True
    assert spans["m-1"].attributes["k8s.namespace.name"] == "ns"
    assert spans["v-1"].name == "admission validate"
    assert spans["v-1"].attributes["vgpu_dra.admission.decision"] == "denied"
    assert spans["m-2"].attributes["vgpu_dra.admission.decision"] == "error"


def client_certificate(ca: tuple[bytes, bytes], tmp_path: Path) -> tuple[Path, Path]:
    """A client certificate (clientAuth) signed by `ca`, as files for ssl.load_cert_chain (the
    bed's own issuer for its API server's webhook client certificate)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cert, key = webhook_client.issue_client(ca[0], ca[1], "kube-apiserver")
    cert_path, key_path = tmp_path / "client.crt", tmp_path / "client.key"
    cert_path.write_bytes(cert)
    key_path.write_bytes(key)
    return cert_path, key_path


def test_with_a_client_ca_only_clients_with_its_certificate_get_through(tmp_path: Path) -> None:
    """--webhook-client-ca: the API server's client certificate is required at the handshake."""
    client_ca, stranger_ca = certs.new_ca(DAY), certs.new_ca(DAY)
    ca = certs.new_ca(DAY * 2)
    holder = certs.ContextHolder(client_ca[0])
    holder.load(*issue(ca))
    s = Served(holder, ca[0])
    s.server.start()
    try:
        trusted = client_context(tmp_path, ca[0])
        trusted.load_cert_chain(*client_certificate(client_ca, tmp_path / "good"))
        conn = s.connect(trusted)
        assert post(conn, "/mutate-pods", review("ok"))[0] == 200
        conn.close()
        for name, cert in (("none", None), ("stranger", stranger_ca)):
            context = client_context(tmp_path, ca[0])
            if cert is not None:
                context.load_cert_chain(*client_certificate(cert, tmp_path / name))
            conn = s.connect(context)
            # TLS 1.3: the refusal arrives as an alert when the client first reads.
            with pytest.raises((ssl.SSLError, ConnectionError)):
                post(conn, "/mutate-pods", review(name))
            conn.close()
        assert [r["uid"] for r in s.seen] == ["ok"]
    finally:
        s.server.stop()


def test_an_unusable_client_ca_is_a_cert_error() -> None:
    holder = certs.ContextHolder(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
    with pytest.raises(certs.CertError, match="the webhook's client CA is unusable"):
        holder.load(*issue(certs.new_ca(DAY)))


def test_while_draining_each_answer_closes_its_connection(served: Served, tmp_path: Path) -> None:
    """On the way out (SIGTERM), kept-alive connections are closed one answer at a time, so the
    API server opens its next one to another replica instead of meeting a dead socket."""
    context = client_context(tmp_path, served.ca)
    conn = served.connect(context)
    assert post(conn, "/mutate-pods", review("before"))[0] == 200
    served.server.drain()
    conn.request("POST", "/mutate-pods", body=review("during"))
    answer = conn.getresponse()
    assert (answer.status, answer.getheader("Connection")) == (200, "close")
    answer.read()
    assert conn.sock is None  # http.client closed it as told
    fresh = served.connect(context)  # new connections are still answered while draining
    assert post(fresh, "/mutate-pods", review("new"))[0] == 200
    assert [r["uid"] for r in served.seen] == ["before", "during", "new"]


def test_a_client_that_stalls_in_the_handshake_or_the_body_is_dropped(tmp_path: Path) -> None:
    """A hostile client holding connections open without finishing them (no handshake, or a body
    shorter than announced) loses them after the request timeout."""
    import socket

    with serving(timeout_s=0.3) as s:
        host, port = s.server.address
        with socket.create_connection((host, port), timeout=10) as raw:  # never says hello
            started = time.monotonic()
            assert raw.recv(1) == b""
            assert time.monotonic() - started < 5
        conn = s.connect(client_context(tmp_path, s.ca))
        conn.connect()
        sock = conn.sock
        assert sock is not None
        sock.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        sock.settimeout(10)
        started = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - started < 5
        conn.close()
