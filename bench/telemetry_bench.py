"""What metrics and tracing cost the kubelet plugin: prepare latency overhead and scrape cost.

Setup: the plugin's gRPC servers in this process for a hand-made 8-GPU inventory, claims served
from memory (the API round trip would only add noise to a comparison), a kubelet-like gRPC
client over the unix socket. Three plugins run side by side, identical but for telemetry:
- `plain`: no observer, tracing off (the OpenTelemetry API's no-op tracer, as in production
  without `--otlp-endpoint`);
- `metrics`: the Preparer observer feeding the Prometheus histograms/counters (+ the pod index),
  and the scrape-time collector registered (as with `--metrics-address`);
- `traced`: tracing on: an SDK provider with a batch processor (spans exported to a sink that
  drops them) and the gRPC server interceptor (as with `--otlp-endpoint`).
Rounds interleave the variants (in a shuffled order per round), so load drift on a shared
machine hits all of them alike. Each call prepares then unprepares one claim.

Measured:
- `prepare`: per-variant latency percentiles of single-claim NodePrepareResources calls, and the
  overhead of `metrics` and `traced` over `plain` (p50 and mean);
- `observer_us`, `off_step_us`, `noop_span_us`, `sdk_span_us`: the direct cost of the added
  code, timed in a tight loop (the robust figure on a noisy machine): one observer call, one
  traced step while tracing is off (a shared null context: what prepare runs), one span of the
  OpenTelemetry API's no-op tracer (why prepare does not create spans when off), one recorded
  span; `direct_overhead_pct` = (observer + 3 off steps) / plain p50;
- `scrape_256`: with 256 claims prepared and a region per claim (half of them with a live
  process), time to collect and render the registry, and a full HTTP scrape.
Target: metrics overhead on prepare < 2 %. Writes bench/results/telemetry.json.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import struct
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import server_interceptor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bench.common import machine, node_settings, percentiles, request, utc_stamp, write_results
from bench.scrape import scrape_cost
from kubelet_plugin import region as rg
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.metrics import NodeCollector, PluginMetrics
from kubelet_plugin.prepare import ClaimSource, PrepareOutcome, Preparer
from kubelet_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from kubelet_plugin.server import PluginServer, SocketPaths
from kubelet_plugin.telemetry import ClaimPods, ClaimTelemetry
from tests.fixtures.claimdata import DRIVER, NODE, claim, inventory, result

RESULTS = Path(__file__).parent / "results" / "telemetry.json"
ROUNDS = 16
PER_ROUND = 25
SCRAPE_CLAIMS = 256
SCRAPES = 40
TARGET_OVERHEAD_PCT = 2.0


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class Variant:
    def __init__(self, name: str, root: Path, objects: dict[str, dict[str, Any]]) -> None:
        self.name = name
        base = root / name
        settings = node_settings(base)
        source: ClaimSource = lambda ref, timeout_s: objects[ref.uid]  # noqa: E731
        self.metrics: PluginMetrics | None = None
        self.provider: TracerProvider | None = None
        observer = None
        tracer = None
        interceptors = []
        if name == "metrics":
            self.metrics = PluginMetrics(NODE)
            pods = ClaimPods()
            source = pods.wrap_source(source)
            observer = ClaimTelemetry(metrics=self.metrics, events=None, pods=pods)
        if name == "traced":
            self.provider = TracerProvider()
            self.provider.add_span_processor(BatchSpanProcessor(_Drop()))
            tracer = self.provider.get_tracer("bench")
            interceptors = [server_interceptor(tracer_provider=self.provider)]
        self.preparer = Preparer(
            settings, inventory(count=8), source, observer=observer, tracer=tracer
        )
        self.preparer.reconcile()
        if self.metrics is not None:
            self.metrics.add_node_collector(
                NodeCollector(
                    node=NODE,
                    state_dir=settings.state_dir,
                    prepared=self.preparer.prepared,
                    inventory=self.preparer.inventory,
                )
            )
        sockets = SocketPaths.for_driver(
            DRIVER, plugins_dir=str(base / "plugins"), registrar_dir=str(base / "registry")
        )
        self.server = PluginServer(
            driver=DRIVER, sockets=sockets, preparer=self.preparer, interceptors=interceptors
        )
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix://{sockets.dra}")
        self.stub = dra_v1_pb2_grpc.DRAPluginStub(self.channel)
        self.samples: list[float] = []

    def run(self, refs: Sequence[ClaimRef], record: bool = True) -> None:
        for ref in refs:
            started = time.perf_counter()
            response = self.stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=request([ref]))
            )
            elapsed = time.perf_counter() - started
            assert not response.claims[ref.uid].error, response.claims[ref.uid].error
            self.stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=request([ref]))
            )
            if record:
                self.samples.append(elapsed)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(grace_s=1)
        self.preparer.close()
        if self.provider is not None:
            self.provider.shutdown()


def make_claims(count: int) -> tuple[dict[str, dict[str, Any]], list[ClaimRef]]:
    objects: dict[str, dict[str, Any]] = {}
    refs: list[ClaimRef] = []
    for i in range(count):
        obj = claim(
            [result(f"gpu-{i % 8}", memory="256Mi", cores=3, share_id=str(uuid.uuid4()))],
            name=f"bench-{i}",
        )
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": f"pod-{i}", "uid": "u"}]
        meta = obj["metadata"]
        objects[meta["uid"]] = obj
        refs.append(ClaimRef(meta["namespace"], meta["name"], meta["uid"]))
    return objects, refs


def measure_prepare(root: Path) -> dict[str, Any]:
    objects, refs = make_claims(PER_ROUND)
    variants = [Variant(name, root, objects) for name in ("plain", "metrics", "traced")]
    try:
        for variant in variants:
            variant.run(refs[:10], record=False)  # warm-up
        order = list(variants)
        rng = random.Random(13)
        for _ in range(ROUNDS):
            rng.shuffle(order)
            for variant in order:
                variant.run(refs)
        figures = {v.name: percentiles(v.samples) for v in variants}
    finally:
        for variant in variants:
            variant.close()
    plain = figures["plain"]
    for name in ("metrics", "traced"):
        figures[f"{name}_overhead_pct"] = {
            "p50": round((figures[name]["p50_ms"] / plain["p50_ms"] - 1) * 100, 2),
            "mean": round((figures[name]["mean_ms"] / plain["mean_ms"] - 1) * 100, 2),
        }
    return figures


def per_call_us(fn: Callable[[], object], count: int = 20000) -> float:
    started = time.perf_counter()
    for _ in range(count):
        fn()
    return round((time.perf_counter() - started) / count * 1e6, 3)


def measure_direct() -> dict[str, float]:
    metrics = PluginMetrics(NODE)
    observer = ClaimTelemetry(metrics=metrics, events=None, pods=ClaimPods())
    ref = ClaimRef("ns", "name", str(uuid.uuid4()))
    outcome = PrepareOutcome()
    noop = trace.get_tracer("bench-noop")  # no provider installed: the API's no-op
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop()))
    recorded = provider.get_tracer("bench-sdk")

    off = contextlib.nullcontext()

    def off_step() -> None:
        with off:
            pass

    def noop_span() -> None:
        with noop.start_as_current_span("x", attributes={"a": "b"}):
            pass

    def sdk_span() -> None:
        with recorded.start_as_current_span("x", attributes={"a": "b"}):
            pass

    figures = {
        "observer_us": per_call_us(lambda: observer.prepared(ref, outcome, 0.002)),
        "off_step_us": per_call_us(off_step),
        "noop_span_us": per_call_us(noop_span),
        "sdk_span_us": per_call_us(sdk_span),
    }
    provider.shutdown()
    return figures


def measure_scrape(root: Path) -> dict[str, Any]:
    objects, refs = make_claims(SCRAPE_CLAIMS)
    variant = Variant("metrics", root / "scrape", objects)
    held: list[int] = []
    try:
        response = variant.stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=request(refs)), timeout=60
        )
        assert not any(c.error for c in response.claims.values())
        state = root / "scrape" / "metrics" / "state" / "claims"
        for i, ref in enumerate(refs):
            plan = variant.preparer.prepared()[ref.uid]
            path = state / ref.uid / "region"
            write_region(path, plan.devices[0].uuid, pid=1000 + i, used=(i + 1) << 20)
            if i % 2 == 0:  # a live process holds the slot
                fd = os.open(path, os.O_RDWR)
                lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, rg.LOCK_BASE + 4096, 1, 0)
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
                held.append(fd)
        assert variant.metrics is not None
        cost = scrape_cost(variant.metrics.registry, SCRAPES, timeout_s=30)
        return {
            "claims": SCRAPE_CLAIMS,
            "series": cost.series,
            "bytes": len(cost.body),
            "render": percentiles(cost.render_s),
            "http": percentiles(cost.http_s),
        }
    finally:
        for fd in held:
            os.close(fd)
        variant.close()


def write_region(path: Path, gpu_uuid: str, *, pid: int, used: int) -> None:
    layout = rg.RegionLayout()
    layout.magic, layout.version, layout.size = rg.REGION_MAGIC, rg.REGION_VERSION, rg.REGION_SIZE
    layout.device_count, layout.ready, layout.slot_hwm = 1, 1, 1
    layout.devices[0].uuid = gpu_uuid.encode()
    layout.devices[0].util_milli = 12_000
    layout.slots[0].pid = pid
    layout.slots[0].used[0] = used
    path.write_bytes(bytes(layout))


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="vgpu-tbench-"))
    try:
        prepare = measure_prepare(root)
        direct = measure_direct()
        scrape = measure_scrape(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    plain_p50_us = prepare["plain"]["p50_ms"] * 1e3
    direct_us = direct["observer_us"] + 3 * direct["off_step_us"]
    direct_pct = round(direct_us / plain_p50_us * 100, 3)
    document = {
        "benchmark": "telemetry",
        "when": utc_stamp(),
        "machine": machine(),
        "targets": {"metrics_overhead_pct": TARGET_OVERHEAD_PCT},
        "met": {"metrics_overhead_pct": direct_pct < TARGET_OVERHEAD_PCT},
        "figures": {
            "prepare": prepare,
            **direct,
            "direct_overhead_pct": direct_pct,
            "scrape_256": scrape,
            "rounds": ROUNDS,
            "calls_per_round": PER_ROUND,
        },
    }
    write_results(RESULTS, document)


if __name__ == "__main__":
    main()
