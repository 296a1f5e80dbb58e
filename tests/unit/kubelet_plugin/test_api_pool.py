"""The kubelet plugin's API connections (issue 32): the client keeps one connection per claim GET
that can be in flight, so a 256-claim call on 16 workers never makes urllib3 discard one
("Connection pool is full, discarding connection") and open the next with a new handshake.

What this proves:
1. `api_connections` covers the Preparer's workers, the DRA server's threads and the
   background callers.
2. With the pool sized so, as many concurrent GETs as that against a loopback API server log no
   discarded connection and reuse their connections; the client's default pool (5 per CPU)
   does discard them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from dra_driver import kube
from kubelet_plugin.main import BACKGROUND_API_CALLERS, api_connections
from kubelet_plugin.server import DRA_WORKERS

POOL_FULL = "Connection pool is full"


class Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server
    connections: ClassVar[set[int]] = set()

    def do_GET(self) -> None:
        Slow.connections.add(id(self.connection))
        time.sleep(0.05)  # every caller holds its connection at the same time
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def client_for(url: str, tmp_path: Path) -> kube.KubeClient:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: u, user: {token: not-a-secret}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    return kube.KubeClient.from_kubeconfig(str(kubeconfig))


def concurrent_gets(client: kube.KubeClient, callers: int, rounds: int = 2) -> None:
    barrier = threading.Barrier(callers)

    def call() -> None:
        for _ in range(rounds):
            barrier.wait(timeout=30)
            client.get("/api/v1/namespaces/default", timeout_s=10)

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)


def test_the_pool_covers_every_caller_that_can_wait_at_once() -> None:
    assert api_connections(16) == 16 + DRA_WORKERS + BACKGROUND_API_CALLERS
    assert api_connections(256) > 256


def test_a_sized_pool_keeps_every_connection_of_a_wide_call(
    api_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    callers = api_connections(16)
    sized = client_for(api_server, tmp_path)
    sized.size_pool(callers)
    Slow.connections.clear()
    with caplog.at_level(logging.WARNING, logger="urllib3"):
        concurrent_gets(sized, callers)
    sized.close()
    assert POOL_FULL not in caplog.text
    assert len(Slow.connections) == callers  # the second round reused the first's

    caplog.clear()
    default = client_for(api_server, tmp_path)  # 5 per CPU: fewer than the callers here
    if default.api_client.configuration.connection_pool_maxsize >= callers:
        pytest.skip("this machine's default pool already covers the callers")
    with caplog.at_level(logging.WARNING, logger="urllib3"):
        concurrent_gets(default, callers)
    default.close()
    assert POOL_FULL in caplog.text
