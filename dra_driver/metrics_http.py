"""Serving a Prometheus registry over HTTP (`/metrics`) for every vgpu-dra process.

Why a shared module: the kubelet plugin now and the controller later expose metrics the same
way: `--metrics-address host:port` (empty = off), served by prometheus-client's own threaded
HTTP server from a daemon thread, on a registry of the component's own (never the process-wide
default one, so tests can run several components in one interpreter).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


def parse_address(text: str) -> tuple[str, int]:
    """`host:port` -> (host, port); ValueError names what is wrong. Port 0 picks a free port.

    Every listening flag of both processes (metrics, probes, the webhook) reads its address here.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected host:port (e.g. 127.0.0.1:8080), got {text!r}")
    return host.strip("[]"), int(port_text)


@dataclass
class MetricsServer:
    """A running `/metrics` endpoint; `stop()` closes its socket."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/metrics"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(address: str, registry: CollectorRegistry) -> MetricsServer:
    """Serve `registry` on `address` (host:port) until `stop()`; OSError if it cannot bind."""
    host, port = parse_address(address)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread)
