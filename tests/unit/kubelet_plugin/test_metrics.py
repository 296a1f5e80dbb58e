"""The kubelet plugin's metrics, scraped over HTTP and parsed with Prometheus' text parser:
state read at scrape time (prepared plans, regions, NVML), latency histograms and error counters
fed by the Preparer's observer, and the clamps (utilisation <= 100 %, usage >= 0)."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.metrics_http import MetricsServer, parse_address, serve_metrics
from dra_driver.nvml import DeviceHandle, NvmlError
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.metrics import GpuReading, NodeCollector, NvmlGpuReader, PluginMetrics
from kubelet_plugin.prepare import Preparer
from kubelet_plugin.telemetry import ClaimPods, ClaimTelemetry
from tests.fixtures.claimdata import NODE, GiB, claim, inventory, result
from tests.fixtures.prepare import node_settings
from tests.fixtures.regions import write_region
from tests.fixtures.scrape import Samples, scrape

MIB = 1 << 20


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels`."""
    found = [
        v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


class Gpus:
    def __init__(self, readings: dict[str, GpuReading]) -> None:
        self.readings = readings

    def read(self, uuid: str) -> GpuReading | None:
        return self.readings.get(uuid)


class Plugin:
    def __init__(self, root: Path) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        settings = node_settings(root)
        self.inventory = inventory(count=2, memory=16 * GiB)
        self.metrics = PluginMetrics(NODE)
        self.pod_objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods = ClaimPods(self._read_pod)
        self.preparer = Preparer(
            settings,
            self.inventory,
            self.pods.wrap_source(self._source),
            observer=ClaimTelemetry(metrics=self.metrics, events=None, pods=self.pods),
        )
        self.preparer.reconcile()  # creates the CDI root and claims dir, as at start-up
        self.state_dir = Path(settings.state_dir)
        self.gpus = Gpus({})
        self.metrics.add_node_collector(
            NodeCollector(
                node=NODE,
                state_dir=settings.state_dir,
                prepared=self.preparer.prepared,
                inventory=self.preparer.inventory,
                pods=self.pods.pod_label,
                containers=self.pods.container_label,
                gpus=self.gpus,
            )
        )

    def _source(self, ref: ClaimRef, timeout_s: float | None = None) -> dict[str, Any]:
        from kubelet_plugin.claims import ClaimError

        obj = self.objects.get(ref.uid)
        if obj is None:
            raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} not found")
        return obj

    def _read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        from dra_driver import kube

        found = self.pod_objects.get((namespace, name))
        if found is None:
            raise kube.NotFound(404, "NotFound", f"pods {name} not found")
        return found

    def add(self, results: list[dict[str, Any]], *, name: str, pod: str = "") -> ClaimRef:
        obj = claim(results, name=name, namespace="tenant-a")
        if pod:
            obj["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": "p-1"}]
            self.pod_objects[("tenant-a", pod)] = {
                "metadata": {"name": pod, "namespace": "tenant-a", "uid": "p-1"},
                "spec": {
                    "containers": [
                        {"name": "sidecar"},
                        {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                },
            }
        meta = obj["metadata"]
        self.objects[meta["uid"]] = obj
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Plugin]:
    p = Plugin(tmp_path)
    try:
        yield p
    finally:
        p.preparer.close()
        p.pods.close()


@pytest.fixture
def served(plugin: Plugin) -> Iterator[MetricsServer]:
    server = serve_metrics("127.0.0.1:0", plugin.metrics.registry)
    try:
        yield server
    finally:
        server.stop()


def test_claim_and_gpu_figures_after_known_claims(plugin: Plugin, served: MetricsServer) -> None:
    gpu0, gpu1 = (g.uuid for g in plugin.inventory.gpus)
    a = plugin.add([result("gpu-0", memory="1Gi", cores=30, share_id="s1")], name="a", pod="web")
    b = plugin.add([result("gpu-0", memory="2Gi", cores=20, share_id="s2")], name="b")
    outcomes = plugin.preparer.prepare([a, b])
    assert not any(o.error for o in outcomes.values())
    # claim a: one live process holding 300 MiB, governor measured 25 % utilisation
    region_path = plugin.state_dir / "claims" / a.uid / "region"
    write_region(region_path, gpu0, 30, pid=os.getpid())
    _set(region_path, used=300 * MIB, util_milli=25_000)
    plugin.gpus.readings[gpu0] = GpuReading(memory_used=5 * GiB, utilisation=0.4)

    plugin.pods.flush()  # the pod lookup for the container label (a background thread)
    samples = _scrape_holding_slot(served.url, region_path)

    claim_a = {
        "claim": "a",
        "namespace": "tenant-a",
        "pod": "web",
        "container": "main",
        "gpu": gpu0.lower(),
    }
    assert value(samples, "vgpu_dra_claim_memory_limit_bytes", **claim_a) == GiB
    assert value(samples, "vgpu_dra_claim_memory_used_bytes", **claim_a) == 300 * MIB
    assert value(samples, "vgpu_dra_claim_cores_limit_ratio", **claim_a) == 0.30
    assert value(samples, "vgpu_dra_claim_utilization_ratio", **claim_a) == 0.25
    assert value(samples, "vgpu_dra_claim_processes", **claim_a) == 1
    claim_b = {"claim": "b", "pod": "", "container": ""}
    assert value(samples, "vgpu_dra_claim_memory_used_bytes", **claim_b) == 0  # no region yet
    gpu_0 = {"node": NODE, "gpu": gpu0.lower(), "device": "gpu-0"}
    assert value(samples, "vgpu_dra_gpu_allocated_memory_bytes", **gpu_0) == 3 * GiB
    assert value(samples, "vgpu_dra_gpu_allocated_cores_ratio", **gpu_0) == 0.5
    assert value(samples, "vgpu_dra_gpu_claims", **gpu_0) == 2
    assert value(samples, "vgpu_dra_gpu_memory_total_bytes", **gpu_0) == 16 * GiB
    assert value(samples, "vgpu_dra_gpu_memory_used_bytes", **gpu_0) == 5 * GiB
    assert value(samples, "vgpu_dra_gpu_utilization_ratio", **gpu_0) == 0.4
    gpu_1 = {"gpu": gpu1.lower()}
    assert value(samples, "vgpu_dra_gpu_claims", **gpu_1) == 0
    assert value(samples, "vgpu_dra_prepared_claims", node=NODE) == 2
    assert value(samples, "vgpu_dra_prepare_duration_seconds_count") == 2


def test_errors_are_counted_by_reason(plugin: Plugin, served: MetricsServer) -> None:
    missing = ClaimRef("tenant-a", "gone", "0b3c1f1e-0000-4000-8000-000000000001")
    first = plugin.add([result("gpu-1", memory="10Gi")], name="first")
    big = plugin.add([result("gpu-1", memory="7Gi")], name="too-big", pod="greedy")
    larger_than_gpu = plugin.add([result("gpu-0", memory="17Gi")], name="larger")
    bad_uid = ClaimRef("tenant-a", "x", "../etc")
    plugin.preparer.prepare([missing])
    plugin.preparer.prepare([first])
    plugin.preparer.prepare([big])
    assert plugin.pods.of(big.uid) == ()  # read, failed: not remembered (no unprepare comes)
    plugin.preparer.prepare([larger_than_gpu])  # wrong, not overbooked: it never fits here
    plugin.preparer.prepare([bad_uid])
    plugin.preparer.unprepare([bad_uid])
    samples = scrape(served.url)
    assert value(samples, "vgpu_dra_prepare_errors_total", reason="invalid_claim") == 3
    assert value(samples, "vgpu_dra_prepare_errors_total", reason="overbooked") == 1
    assert value(samples, "vgpu_dra_prepare_errors_total", reason="internal") == 0
    assert value(samples, "vgpu_dra_unprepare_errors_total", reason="invalid_claim") == 1
    assert value(samples, "vgpu_dra_prepare_duration_seconds_count") == 5
    assert value(samples, "vgpu_dra_prepared_claims") == 1


def test_unprepared_claims_leave_the_scrape(plugin: Plugin, served: MetricsServer) -> None:
    ref = plugin.add([result("gpu-1", memory="1Gi")], name="short", pod="job")
    plugin.preparer.prepare([ref])
    assert value(scrape(served.url), "vgpu_dra_claim_memory_limit_bytes", claim="short") == GiB
    plugin.preparer.unprepare([ref])
    samples = scrape(served.url)
    assert not [k for k in samples if dict(k[1]).get("claim") == "short"]
    assert value(samples, "vgpu_dra_unprepare_duration_seconds_count") == 1
    assert plugin.pods.of(ref.uid) == ()


class FakeNvml:
    def __init__(self, used: int, util: int, fail_init: bool = False) -> None:
        self.used, self.util, self.fail_init, self.inits = used, util, fail_init, 0

    def init(self) -> None:
        self.inits += 1
        if self.fail_init:
            raise NvmlError("nvmlInit", 9, "no driver")

    def shutdown(self) -> None: ...

    def device_by_uuid(self, uuid: str) -> DeviceHandle:
        return DeviceHandle(uuid)

    def memory_used(self, device: DeviceHandle) -> int:
        return self.used

    def gpu_utilization(self, device: DeviceHandle) -> int:
        return self.util


def test_nvml_readings_are_clamped() -> None:
    odd = FakeNvml(used=-5, util=250)
    reading = NvmlGpuReader(lambda: odd).read("GPU-x")  # type: ignore[arg-type,return-value]
    assert reading == GpuReading(memory_used=0, utilisation=1.0)


def test_nvml_unavailable_means_no_live_figures_and_one_attempt() -> None:
    broken = FakeNvml(used=1, util=1, fail_init=True)
    reader = NvmlGpuReader(lambda: broken)  # type: ignore[arg-type,return-value]
    assert reader.read("GPU-x") is None
    assert reader.read("GPU-y") is None
    assert broken.inits == 1


def test_metrics_address_is_validated() -> None:
    assert parse_address("127.0.0.1:9402") == ("127.0.0.1", 9402)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("9402", ":9402", "host:port", "127.0.0.1:70000"):
        with pytest.raises(ValueError, match="host:port"):
            parse_address(bad)


def test_metric_names_follow_the_conventions(plugin: Plugin, served: MetricsServer) -> None:
    ref = plugin.add([result("gpu-0", memory="1Gi", cores=10)], name="n")
    plugin.preparer.prepare([ref])
    with urllib.request.urlopen(served.url, timeout=10) as response:
        families = list(text_string_to_metric_families(response.read().decode()))
    names = {f.name for f in families}
    assert names and all(n.startswith("vgpu_dra_") for n in names)
    for family in families:
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.name.endswith("_ratio"):
            assert all(0.0 <= s.value <= 1.0 for s in family.samples)
        if family.name.endswith("_bytes"):
            assert all(s.value >= 0 for s in family.samples)


def _set(path: Path, *, used: int, util_milli: int) -> None:
    from kubelet_plugin.region import Region

    with Region(str(path)) as region:
        region.layout.slots[0].used[0] = used
        region.layout.devices[0].util_milli = util_milli
        del region.layout  # release the view before the map closes


def _scrape_holding_slot(url: str, region_path: Path) -> Samples:
    """Scrape while this process holds slot 0's liveness lock, as a live hooked process does."""
    import fcntl
    import struct

    from kubelet_plugin import region as rg

    fd = os.open(region_path, os.O_RDWR)
    try:
        lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, rg.LOCK_BASE + 4096, 1, 0)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
        return scrape(url)
    finally:
        os.close(fd)
