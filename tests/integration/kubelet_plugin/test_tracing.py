"""Traces of prepare and unprepare, collected with OpenTelemetry's in-memory exporter.

The plugin's gRPC server runs with the OpenTelemetry server interceptor (as `--otlp-endpoint`
turns on) and a Preparer tracing to the same provider; claims come from memory (the subject here
is the span tree, not the API server). A kubelet-like client calls NodePrepareResources over the
unix socket.

What this proves: one prepare call yields the gRPC server span, one `prepare claim` span per
claim as its child (also for claims prepared on the worker pool of a batch), and the steps
(`read ResourceClaim`, `write claim files`, `write checkpoint`) as children of their claim's
span; claim UID, namespace, name, devices and outcome are attributes; a failed claim's span has
an error status with the user's message. Also: with no provider installed (tracing off), the
Preparer's spans are non-recording.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import server_interceptor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kubelet_plugin.claims import ClaimError, ClaimRef
from kubelet_plugin.prepare import Preparer
from kubelet_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from kubelet_plugin.server import PluginServer, SocketPaths
from tests.fixtures.claimdata import DRIVER, GiB, claim, inventory, result
from tests.fixtures.prepare import node_settings


class Traced:
    def __init__(self, root: Path) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.objects: dict[str, dict[str, Any]] = {}
        settings = node_settings(root)
        self.preparer = Preparer(
            settings,
            inventory(count=2, memory=16 * GiB),
            self._source,
            tracer=self.provider.get_tracer("test"),
        )
        self.preparer.reconcile()
        self.server = PluginServer(
            driver=DRIVER,
            sockets=SocketPaths.for_driver(
                DRIVER, plugins_dir=str(root / "plugins"), registrar_dir=str(root / "registry")
            ),
            preparer=self.preparer,
            interceptors=[server_interceptor(tracer_provider=self.provider)],
        )

    def _source(self, ref: ClaimRef, timeout_s: float | None = None) -> dict[str, Any]:
        obj = self.objects.get(ref.uid)
        if obj is None:
            raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} not found")
        return obj

    def add(self, device: str, memory: str, name: str) -> ClaimRef:
        obj = claim([result(device, memory=memory)], name=name)
        meta = obj["metadata"]
        self.objects[meta["uid"]] = obj
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])

    def prepare(self, refs: list[ClaimRef]) -> Any:
        with grpc.insecure_channel(f"unix://{self.server.sockets.dra}") as channel:
            return dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[
                        dra_v1_pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid)
                        for r in refs
                    ]
                ),
                timeout=30,
            )


@pytest.fixture
def traced() -> Iterator[Traced]:
    root = Path(tempfile.mkdtemp(prefix="vgpu-trace-"))
    t = Traced(root)
    t.server.start()
    try:
        yield t
    finally:
        t.server.stop(grace_s=1)
        t.preparer.close()
        shutil.rmtree(root, ignore_errors=True)


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def test_one_prepare_call_is_one_tree(traced: Traced) -> None:
    good = traced.add("gpu-0", "1Gi", "good")
    other = traced.add("gpu-1", "2Gi", "other")
    missing = ClaimRef("default", "missing", "4b1c7e0a-0000-4000-8000-000000000009")
    response = traced.prepare([good, other, missing])  # a batch: claims run on the pool
    assert not response.claims[good.uid].error
    assert "not found" in response.claims[missing.uid].error
    spans = list(traced.exporter.get_finished_spans())
    [call] = [s for s in spans if s.name.endswith("NodePrepareResources")]
    assert call.parent is None and call.kind == trace.SpanKind.SERVER
    claims = children(spans, call)
    assert sorted(s.name for s in claims) == ["prepare claim"] * 3
    by_uid = {s.attributes["vgpu_dra.claim.uid"]: s for s in claims if s.attributes}
    ok = by_uid[good.uid]
    assert ok.attributes is not None
    assert ok.attributes["vgpu_dra.claim.namespace"] == "default"
    assert ok.attributes["vgpu_dra.claim.name"] == "good"
    assert ok.attributes["vgpu_dra.outcome"] == "prepared"
    assert tuple(ok.attributes["vgpu_dra.devices"]) == ("gpu-0",)  # type: ignore[arg-type]
    assert [s.name for s in children(spans, ok)] == [
        "read ResourceClaim",
        "write claim files",
        "write checkpoint",
    ]
    failed = by_uid[missing.uid]
    assert failed.attributes is not None
    assert failed.attributes["vgpu_dra.outcome"] == "invalid_claim"
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert failed.status.description is not None and "not found" in failed.status.description
    assert len({s.context.trace_id for s in spans if s.context is not None}) == 1


def test_unprepare_spans(traced: Traced) -> None:
    ref = traced.add("gpu-0", "1Gi", "u")
    traced.prepare([ref])
    traced.exporter.clear()
    with grpc.insecure_channel(f"unix://{traced.server.sockets.dra}") as channel:
        dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)]
            ),
            timeout=30,
        )
    spans = list(traced.exporter.get_finished_spans())
    [call] = [s for s in spans if s.name.endswith("NodeUnprepareResources")]
    [claim_span] = children(spans, call)
    assert claim_span.name == "unprepare claim"
    assert claim_span.attributes is not None
    assert claim_span.attributes["vgpu_dra.claim.uid"] == ref.uid
    assert claim_span.status.status_code != trace.StatusCode.ERROR


def test_without_a_provider_no_span_is_started(tmp_path: Path) -> None:
    settings = node_settings(tmp_path)
    obj = claim([result("gpu-0", memory="1Gi")])
    seen: list[object] = []

    def source(ref: ClaimRef, timeout_s: float | None) -> dict[str, Any]:
        seen.append(trace.get_current_span())  # what prepare runs in while reading the claim
        return obj

    preparer = Preparer(settings, inventory(), source)  # the default: the global provider
    preparer.reconcile()
    try:
        meta = obj["metadata"]
        outcome = preparer.prepare([ClaimRef(meta["namespace"], meta["name"], meta["uid"])])
        assert not next(iter(outcome.values())).error
        assert seen == [trace.INVALID_SPAN]  # no span was started at all
    finally:
        preparer.close()
