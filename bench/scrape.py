"""What a Prometheus scrape of a registry costs, measured the same way by every metrics bench
(controller_metrics, telemetry): collecting and rendering it in-process (`generate_latest`, what
the HTTP handler does) and a whole GET /metrics through the product's server on loopback."""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest

from dra_driver.metrics_http import serve_metrics


@dataclass(frozen=True, slots=True)
class ScrapeCost:
    body: bytes  # one rendering, for its size and series count
    render_s: list[float]
    http_s: list[float]

    @property
    def series(self) -> int:
        """Samples in the exposition (its non-comment lines)."""
        return sum(
            1 for line in self.body.decode().splitlines() if line and not line.startswith("#")
        )


def scrape_cost(registry: CollectorRegistry, rounds: int, timeout_s: float) -> ScrapeCost:
    """`rounds` timed renders, then `rounds` timed HTTP scrapes (each with `timeout_s`)."""
    renders: list[float] = []
    body = b""
    for _ in range(rounds):
        started = time.perf_counter()
        body = generate_latest(registry)
        renders.append(time.perf_counter() - started)
    server = serve_metrics("127.0.0.1:0", registry)
    scrapes: list[float] = []
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            with urllib.request.urlopen(server.url, timeout=timeout_s) as answer:
                answer.read()
            scrapes.append(time.perf_counter() - started)
    finally:
        server.stop()
    return ScrapeCost(body, renders, scrapes)
