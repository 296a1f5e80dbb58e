"""NodePrepareResources latency and batch throughput of the kubelet plugin.

Setup: a real control plane (vgpu_testbed.cluster.control_plane), the plugin's gRPC servers in this
process for a hand-made 8-GPU inventory, and a gRPC client (the v1 stubs) over the unix socket — the
same path the kubelet uses. Claims are created and allocated in the API server beforehand.

Measured:
- `single`: one claim per NodePrepareResources call, end to end (claim GET from the apiserver,
  planning, claim dir + vgpu.conf + CDI spec + checkpoint with fsyncs, gRPC both ways);
- `single_cached`: the same with claims served from memory, i.e. without the API round trip;
- `claim_get`: the API GET alone;
- `unprepare`: one claim per NodeUnprepareResources call;
- `batch_256`: wall time of one call with 256 claims (end to end);
- `syncs_per_cycle`: fsync + fdatasync calls per single-claim prepare+unprepare (the server runs
  in this process, so counting the calls is exact).
Targets: single p50 <= 3.5 ms, p99 <= 20 ms; batch_256 <= 3 s. Writes bench/results/prepare.json
with the load average before and after (figures from a loaded machine are not comparable).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.common import machine, node_settings, percentiles, request, utc_stamp, write_results
from dra_driver import kube
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.prepare import ClaimSource, Preparer, kube_claim_source
from kubelet_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from kubelet_plugin.server import PluginServer, SocketPaths
from tests.fixtures.claimdata import (
    DRIVER,
    create_allocated_claim,
    inventory,
    result,
)

RESULTS = Path(__file__).parent / "results" / "prepare.json"
SINGLE_SAMPLES = 300
BATCH = 256
TARGETS = {"single_p50_ms": 3.5, "single_p99_ms": 20.0, "batch_256_s": 3.0}


class Bench:
    def __init__(self, client: kube.KubeClient, root: Path) -> None:
        self.client = client
        self.root = root
        self.namespace = f"bench-{uuid.uuid4().hex[:6]}"
        client.create(
            kube.path("v1", "namespaces"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}},
        )

    def claims(self, count: int) -> list[ClaimRef]:
        # 8 GPUs x 80 GiB: 256 claims of 256 MiB / 3 cores each fit (32 per GPU)
        return [
            create_allocated_claim(
                self.client,
                self.namespace,
                [result(f"gpu-{i % 8}", memory="256Mi", cores=3, share_id=str(uuid.uuid4()))],
            )
            for i in range(count)
        ]

    def serve(
        self, name: str, source: Callable[[kube.KubeClient], ClaimSource]
    ) -> tuple[PluginServer, Preparer]:
        base = self.root / name
        settings = node_settings(base)
        preparer = Preparer(settings, inventory(count=8), source(self.client))
        preparer.reconcile()
        sockets = SocketPaths.for_driver(
            DRIVER, plugins_dir=str(base / "plugins"), registrar_dir=str(base / "registry")
        )
        server = PluginServer(driver=DRIVER, sockets=sockets, preparer=preparer)
        server.start()
        return server, preparer


def run_round(stub: Any, refs: Sequence[ClaimRef]) -> tuple[list[float], list[float]]:
    prepare_s: list[float] = []
    unprepare_s: list[float] = []
    for ref in refs:
        started = time.perf_counter()
        response = stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=request([ref]))
        )
        prepare_s.append(time.perf_counter() - started)
        assert not response.claims[ref.uid].error, response.claims[ref.uid].error
        started = time.perf_counter()
        stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=request([ref])))
        unprepare_s.append(time.perf_counter() - started)
    return prepare_s, unprepare_s


def measure_api(bench: Bench, refs: list[ClaimRef], batch_refs: list[ClaimRef]) -> dict[str, Any]:
    """Claims read from the API server on every prepare (the production path)."""
    figures: dict[str, Any] = {}
    server, preparer = bench.serve("api", kube_claim_source)
    try:
        with grpc.insecure_channel(f"unix://{server.sockets.dra}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            run_round(stub, refs[:20])  # warm-up: connections, imports, page cache
            figures["syncs_per_cycle"] = count_syncs(lambda: run_round(stub, refs[:10])) / 10
            prepare_s, unprepare_s = run_round(stub, refs)
            figures["single"] = percentiles(prepare_s)
            figures["unprepare"] = percentiles(unprepare_s)
            started = time.perf_counter()
            response = stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=request(batch_refs)), timeout=45
            )
            batch_s = time.perf_counter() - started
            errors = [c.error for c in response.claims.values() if c.error]
            assert not errors, errors[:3]
            figures["batch_256"] = {"claims": BATCH, "wall_s": round(batch_s, 3)}
            started = time.perf_counter()
            stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=request(batch_refs)), timeout=45
            )
            figures["batch_256_unprepare"] = {
                "claims": BATCH,
                "wall_s": round(time.perf_counter() - started, 3),
            }
    finally:
        server.stop(grace_s=1)
        preparer.close()
    return figures


def count_syncs(work: Callable[[], object]) -> int:
    """fsync and fdatasync calls made (by any thread of this process) while `work` runs."""
    calls = 0
    originals = {name: getattr(os, name) for name in ("fsync", "fdatasync")}

    def counting(real: Callable[[int], None]) -> Callable[[int], None]:
        def call(fd: int) -> None:
            nonlocal calls
            calls += 1
            real(fd)

        return call

    for name, real in originals.items():
        setattr(os, name, counting(real))
    try:
        work()
    finally:
        for name, real in originals.items():
            setattr(os, name, real)
    return calls


def measure_cached(bench: Bench, refs: list[ClaimRef]) -> dict[str, Any]:
    """The same single-claim calls with claims served from memory (no API round trip)."""
    objects = {
        r.uid: bench.client.get(
            kube.path(kube.RESOURCE_API, "resourceclaims", r.name, namespace=r.namespace)
        )
        for r in refs
    }
    server, preparer = bench.serve(
        "cached", lambda _client: lambda ref, _timeout_s: objects[ref.uid]
    )
    try:
        with grpc.insecure_channel(f"unix://{server.sockets.dra}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            run_round(stub, refs[:20])
            prepare_s, _ = run_round(stub, refs)
    finally:
        server.stop(grace_s=1)
        preparer.close()
    return {"single_cached": percentiles(prepare_s)}


def measure_get(bench: Bench, refs: list[ClaimRef]) -> dict[str, Any]:
    """The claim GET alone, back to back (a warm apiserver: a lower bound)."""
    get_s: list[float] = []
    for ref in refs:
        started = time.perf_counter()
        bench.client.get(
            kube.path(kube.RESOURCE_API, "resourceclaims", ref.name, namespace=ref.namespace)
        )
        get_s.append(time.perf_counter() - started)
    return {"claim_get": percentiles(get_s)}


def main() -> None:
    from vgpu_testbed.cluster.control_plane import Cluster

    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="vgpu-bench-"))
    cluster = Cluster.start(root / "cluster", ("dgx-h100",), die_with_parent=True)
    client = kube.KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        bench = Bench(client, root)
        refs = bench.claims(SINGLE_SAMPLES)
        batch_refs = bench.claims(BATCH)
        figures = {
            **measure_get(bench, refs),
            **measure_api(bench, refs, batch_refs),
            **measure_cached(bench, refs),
        }
    finally:
        client.close()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    document = {
        "benchmark": "prepare",
        "when": utc_stamp(),
        "machine": {
            **machine(),
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "targets": TARGETS,
        "met": {
            "single_p50_ms": figures["single"]["p50_ms"] <= TARGETS["single_p50_ms"],
            "single_p99_ms": figures["single"]["p99_ms"] <= TARGETS["single_p99_ms"],
            "batch_256_s": figures["batch_256"]["wall_s"] <= TARGETS["batch_256_s"],
        },
        "figures": figures,
    }
    write_results(RESULTS, document)


if __name__ == "__main__":
    main()
