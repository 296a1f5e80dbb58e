"""`--otlp-endpoint` end to end: the plugin process exports its traces over OTLP/gRPC.

A minimal OTLP trace receiver (the collector's gRPC service from opentelemetry-proto) listens on
127.0.0.1; `vgpu-dra kubelet-plugin --otlp-endpoint http://127.0.0.1:<port>` runs on simulated
GPUs against the real API server; one claim is prepared through the DRA socket; SIGTERM makes
the plugin flush its batch.

What this proves: the flag installs the exporter and the gRPC server interceptor in the real
process: the receiver gets one trace with the server span of NodePrepareResources, the claim's
`prepare claim` span under it (claim UID attribute) and the read/write steps, from service
`vgpu-dra-kubelet-plugin`.
"""

from __future__ import annotations

import signal
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from dra_driver import kube
from tests.fixtures.claimdata import NODE, create_allocated_claim, result
from tests.fixtures.simulated import require_simulated_gpus, simulated_node_env
from tests.integration.kubelet_plugin.conftest import (
    plugin_process,
    plugin_process_argv,
    prepare,
    wait_for,
)


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, Any], Any]] = []  # (service, attributes, span)
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        attrs = {a.key: a.value for a in span.attributes}
                        self.spans.append((resource.get("service.name", ""), attrs, span))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    servicer = Receiver()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(grace=1).wait()


def test_the_plugin_exports_prepare_traces_over_otlp(
    cluster: Any,
    kube_client: kube.KubeClient,
    namespace: str,
    receiver: tuple[Receiver, int],
) -> None:
    require_simulated_gpus()
    servicer, port = receiver
    root = Path(tempfile.mkdtemp(prefix="vgpu-otlp-"))
    gpu_env = simulated_node_env(root)
    gpu_env["no_grpc_proxy"] = "127.0.0.1"  # a proxy from the environment must not relay it
    argv = plugin_process_argv(
        root,
        cluster.kubeconfig,
        NODE,
        "--no-nvidia-cdi",
        f"--otlp-endpoint=http://127.0.0.1:{port}",
    )
    dra = root / "plugins" / "vgpu.dra.dev" / "dra.sock"
    with plugin_process(argv, gpu_env, root / "plugin.log") as proc:
        wait_for(dra.exists, what="the DRA socket")
        ref = create_allocated_claim(kube_client, namespace, [result("gpu-0", memory="1Gi")])
        assert prepare(dra, [ref]) == {ref.uid: ""}
        proc.send_signal(signal.SIGTERM)  # shutdown flushes the batch
        assert proc.wait(timeout=30) == 0
    with servicer.lock:
        spans = list(servicer.spans)
    assert {service for service, _, _ in spans} == {"vgpu-dra-kubelet-plugin"}
    [call] = [s for _, _, s in spans if s.name.endswith("NodePrepareResources")]
    [(attrs, claim_span)] = [(a, s) for _, a, s in spans if s.name == "prepare claim"]
    assert attrs["vgpu_dra.claim.uid"].string_value == ref.uid
    assert attrs["vgpu_dra.outcome"].string_value == "prepared"
    assert claim_span.parent_span_id == call.span_id
    assert claim_span.trace_id == call.trace_id
    steps = sorted(s.name for _, _, s in spans if s.parent_span_id == claim_span.span_id)
    assert steps == ["read ResourceClaim", "write checkpoint", "write claim files"]
