"""The controller's metrics after real reconciler decisions, scraped over HTTP and parsed with
Prometheus' text parser.

The reconciler runs against the in-memory API of test_reconciler.py (real optimistic
concurrency) over the allocator's real model; nothing of the metrics is stood in. Proves:
placements and each failure reason are counted with their decision latency; pending gated pods
by state; cluster and per-node allocated vs capacity after known claims; fragmentation and
stranded memory on a scripted layout; per-GPU series only with detail `gpu`, none per node with
`cluster`; leader status follows the elector; the informers' lists and watch restarts; the
naming conventions.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.informers import PODS, Informer
from controller.metrics import ControllerMetrics, StateCollector
from controller.reconciler import Defaults, Reconciler
from dra_driver import kube
from dra_driver.metrics_http import MetricsServer, serve_metrics
from tests.fixtures.allocator_cluster import DEVICE_CLASS, DRIVER, MEMORY, PRODUCTS, node_events
from tests.fixtures.scrape import Samples, scrape
from tests.unit.controller.fakes import (
    NS,
    FakeApi,
    Script,
    claim_path,
    feed,
    make_claim,
    make_pod,
    pod_path,
)

GiB = 1 << 30
H100 = MEMORY[PRODUCTS[0]]  # 80 GiB


class Bed:
    """A reconciler with metrics on `nodes` x `gpus` H100s, served on a loopback port."""

    def __init__(
        self,
        nodes: int = 2,
        gpus: int = 2,
        *,
        detail: str = "node",
        leader: Callable[[], bool] = lambda: True,
        informers: list[Informer] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.api = FakeApi()
        self.metrics = ControllerMetrics()
        extra = {"clock": clock} if clock is not None else {}
        self.r = Reconciler(
            self.api,  # type: ignore[arg-type]
            Defaults({}),
            observer=self.metrics,
            **extra,  # type: ignore[arg-type]
        )
        self.r.on_event("DeviceClass", "apply", {**DEVICE_CLASS, "metadata": {"name": DRIVER}})
        for n in range(nodes):
            for kind, obj in node_events(n, gpus=gpus, shape="none"):
                self.r.on_event(kind, "apply", obj)
        self.metrics.registry.register(
            StateCollector(self.r, informers or [], leader=leader, detail=detail)
        )
        self.server: MetricsServer = serve_metrics("127.0.0.1:0", self.metrics.registry)

    def scrape(self) -> Samples:
        return scrape(self.server.url)

    def submit(self, name: str, memory: str = "10Gi", **annotations: str) -> None:
        make_claim(self.api, name, memory=memory)
        make_pod(self.api, name, [name], **annotations)
        feed(self.r, self.api)


@pytest.fixture
def beds() -> Iterator[Callable[..., Bed]]:
    started: list[Bed] = []

    def start(*args: object, **kwargs: object) -> Bed:
        bed = Bed(*args, **kwargs)  # type: ignore[arg-type]
        started.append(bed)
        return bed

    yield start
    for bed in started:
        bed.server.stop()


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of `name` with exactly `labels`."""
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no sample {key}; have {[k for k in samples if k[0] == name]}"
    return samples[key]


def has(samples: Samples, name: str) -> bool:
    return any(k[0] == name for k in samples)


P = "vgpu_dra_controller_"


def test_a_placement_is_counted_with_its_latency_and_the_allocation(
    beds: Callable[..., Bed],
) -> None:
    bed = beds()
    before = bed.scrape()
    assert value(before, P + "placements_total") == 0
    assert value(before, P + "memory_capacity_bytes") == 4 * H100
    assert value(before, P + "memory_allocated_bytes") == 0
    assert value(before, P + "gpus") == 4
    assert value(before, P + "cores_capacity") == 400
    bed.submit("p", memory="10Gi")
    assert value(bed.scrape(), P + "pending_pods", state="queued") == 1
    bed.r.reconcile()
    after = bed.scrape()
    assert value(after, P + "placements_total") == 1
    assert value(after, P + "decision_duration_seconds_count", outcome="placed") == 1
    assert value(after, P + "decision_duration_seconds_sum", outcome="placed") > 0
    assert value(after, P + "decision_duration_seconds_count", outcome="refused") == 0
    consumed = bed.api.get(claim_path("p"))["status"]["allocation"]["devices"]["results"][0]
    cores = int(consumed["consumedCapacity"].get("cores", "0"))
    assert value(after, P + "memory_allocated_bytes") == 10 * GiB
    assert value(after, P + "cores_allocated") == cores
    assert value(after, P + "node_memory_allocated_bytes", node="node-00000") == 10 * GiB
    assert value(after, P + "node_memory_allocated_bytes", node="node-00001") == 0
    assert value(after, P + "node_memory_capacity_bytes", node="node-00001") == 2 * H100
    assert value(after, P + "node_gpus", node="node-00000") == 2
    # The pod's gate is gone once the informer delivers it: nothing pending any more.
    bed.r.on_event("Pod", "apply", bed.api.get(pod_path("p")))
    assert value(bed.scrape(), P + "pending_pods", state="queued") == 0


def test_refusals_are_counted_by_reason_and_the_pod_waits(beds: Callable[..., Bed]) -> None:
    bed = beds(nodes=0)
    bed.submit("nowhere")
    bed.submit("bad", topology="sideways")
    bed.r.reconcile()
    samples = bed.scrape()
    assert value(samples, P + "placement_failures_total", reason="refused") == 1
    assert value(samples, P + "placement_failures_total", reason="invalid") == 1
    assert value(samples, P + "placement_failures_total", reason="retry") == 0
    assert value(samples, P + "decision_duration_seconds_count", outcome="refused") == 1
    assert value(samples, P + "decision_duration_seconds_count", outcome="invalid") == 1
    assert value(samples, P + "pending_pods", state="waiting") == 2
    assert value(samples, P + "pending_pods", state="queued") == 0
    bed.r.reconcile()  # nothing changed: no decision, nothing counted
    again = bed.scrape()
    assert value(again, P + "decision_duration_seconds_count", outcome="refused") == 1


def test_a_claim_deleted_mid_placement_counts_as_retry(beds: Callable[..., Bed]) -> None:
    bed = beds(nodes=1)
    bed.submit("p")
    del bed.api.objects[claim_path("p")]
    bed.r.reconcile()
    samples = bed.scrape()
    assert value(samples, P + "placement_failures_total", reason="retry") == 1
    assert value(samples, P + "decision_duration_seconds_count", outcome="retry") == 1
    assert value(samples, P + "placements_total") == 0


def test_an_api_failure_counts_as_api_error(beds: Callable[..., Bed]) -> None:
    bed = beds(nodes=1)
    bed.submit("p")
    bed.api.fail[claim_path("p") + "/status"] = [kube.KubeError(500, "InternalError", "boom")]
    bed.r.reconcile()
    assert value(bed.scrape(), P + "placement_failures_total", reason="api_error") == 1


def test_fragmentation_and_stranded_memory(beds: Callable[..., Bed]) -> None:
    """One node, two 80 GiB GPUs: 50 GiB placed on each (spread), then a 40 GiB request fits
    neither (30 GiB free on each): 60 GiB stranded, half of the free memory off the largest
    free block."""
    bed = beds(nodes=1, detail="gpu")
    bed.submit("a", memory="50Gi", **{"device-policy": "spread"})
    bed.submit("b", memory="50Gi", **{"device-policy": "spread"})
    bed.r.reconcile()
    samples = bed.scrape()
    assert value(samples, P + "stranded_memory_bytes") == 0  # nothing waits
    assert value(samples, P + "node_memory_fragmentation_ratio", node="node-00000") == 0.5
    gpus = [k for k in samples if k[0] == P + "gpu_memory_allocated_bytes"]
    assert sorted(samples[k] for k in gpus) == [50 * GiB, 50 * GiB]
    assert all(dict(k[1])["node"] == "node-00000" for k in gpus)
    assert {dict(k[1])["device"] for k in gpus} == {"gpu-0", "gpu-1"}
    bed.submit("c", memory="40Gi")
    bed.r.reconcile()
    samples = bed.scrape()
    assert value(samples, P + "placement_failures_total", reason="refused") == 1
    assert value(samples, P + "stranded_memory_bytes") == 60 * GiB
    bed.submit("d", memory="20Gi")  # fits: 30 GiB free blocks are usable by a waiting request
    bed.r.on_event("Pod", "delete", bed.api.get(pod_path("c")))
    bed.r.waiting.add((NS, "d"))  # as if refused: make it the only waiting request
    assert value(bed.scrape(), P + "stranded_memory_bytes") == 0


def test_detail_cluster_has_no_per_node_series(beds: Callable[..., Bed]) -> None:
    samples = beds(detail="cluster").scrape()
    assert has(samples, P + "memory_capacity_bytes")
    assert not has(samples, P + "node_memory_capacity_bytes")
    assert not has(samples, P + "gpu_memory_capacity_bytes")
    assert not has(beds(detail="node").scrape(), P + "gpu_memory_capacity_bytes")


def test_leader_status_follows_the_elector(beds: Callable[..., Bed]) -> None:
    leading = [False]
    bed = beds(leader=lambda: leading[0])
    assert value(bed.scrape(), P + "leader") == 0
    leading[0] = True
    assert value(bed.scrape(), P + "leader") == 1


def test_informer_lists_and_watch_restarts() -> None:
    """The scripted server of test_informers: one dropped watch, one 410 Gone."""
    stop = threading.Event()
    informer = Informer(Script(stop), PODS, lambda kind, op, obj: None)  # type: ignore[arg-type]
    informer.start(stop)
    informer.join(timeout=20)
    metrics = ControllerMetrics()
    bed_api = FakeApi()
    reconciler = Reconciler(bed_api, Defaults({}), observer=metrics)  # type: ignore[arg-type]
    metrics.registry.register(StateCollector(reconciler, [informer]))
    server = serve_metrics("127.0.0.1:0", metrics.registry)
    try:
        with urllib.request.urlopen(server.url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.stop()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert value(samples, P + "informer_synced", resource="pods") == 1
    assert value(samples, P + "informer_lists_total", resource="pods") == 2
    restarts = P + "informer_watch_restarts_total"
    assert value(samples, restarts, resource="pods", reason="expired") == 1
    assert value(samples, restarts, resource="pods", reason="error") == 1


def test_naming_conventions(beds: Callable[..., Bed]) -> None:
    bed = beds(detail="gpu")
    with urllib.request.urlopen(bed.server.url, timeout=10) as response:
        families = list(text_string_to_metric_families(response.read().decode()))
    assert families and all(f.name.startswith(P) for f in families)
    for family in families:
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.name.endswith("_bytes") or family.name.endswith("_seconds"):
            assert family.type in ("gauge", "histogram")


def test_a_bad_detail_is_refused() -> None:
    with pytest.raises(ValueError, match="detail 'pod'"):
        StateCollector(Reconciler(FakeApi(), Defaults({})), [], detail="pod")  # type: ignore[arg-type]


def test_metrics_flags_have_environment_twins_and_are_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from controller.main import build_parser, main

    env = {"VGPU_DRA_METRICS_ADDRESS": "0.0.0.0:9464", "VGPU_DRA_METRICS_DETAIL": "gpu"}
    args = build_parser(env).parse_args([])
    assert (args.metrics_address, args.metrics_detail) == ("0.0.0.0:9464", "gpu")
    assert build_parser({}).parse_args([]).metrics_address == ""  # off by default
    with pytest.raises(SystemExit) as exited:
        build_parser({}).parse_args(["--metrics-detail", "pod"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit) as exited:
        main(["--metrics-address", "9464", "--kubeconfig", "/nonexistent"])
    assert exited.value.code == 2
    assert "--metrics-address: expected host:port" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # from the environment too
        build_parser({"VGPU_DRA_METRICS_ADDRESS": "nowhere"}).parse_args([])
