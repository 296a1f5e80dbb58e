"""Prometheus metrics of the kubelet plugin, served on `--metrics-address` (docs/observability.md).

Two kinds:
- event metrics, updated where things happen: prepare/unprepare latency histograms and error
  counters by reason (through the Preparer's observer), ResourceSlice publishes by outcome,
  governor tick durations;
- loop metrics, read at scrape time from the plugin's `Supervisor` (`LoopCollector`, shared with
  the controller): failed steps and stalls of every long-lived loop;
- state metrics, computed at scrape time by `NodeCollector` from what the plugin already holds:
  the Preparer's prepared plans (allocated memory and cores, caps), the current inventory,
  NVML (physical memory used, utilisation) and each claim's region (memory charged to the cap,
  measured utilisation, throttle time; `kubelet_plugin.claim_usage`). Nothing is kept up to
  date between scrapes, so there is no bookkeeping on the prepare path and nothing to go stale.

Conventions: prefix `vgpu_dra_`, base units (bytes, seconds, ratios 0..1 where the API speaks
of percent), `_total` counters. Every label value comes from the plugin's own state (the plan,
the inventory, the claim's `reservedFor`, the names of the containers of the claim's pod as the
API server serves them: `kubelet_plugin.telemetry`), never from a region file a tenant can
write.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dra_driver.gpu import NodeInventory
from dra_driver.nvml import DeviceHandle, Nvml, NvmlError
from dra_driver.supervision import LoopCollector, Supervisor
from kubelet_plugin.claim_usage import DeviceStats, read_usage
from kubelet_plugin.enforcement import REASON_NO_HOOK, REASON_OVER_CAP
from kubelet_plugin.plan import MAX_CORES, ClaimPlan

log = logging.getLogger(__name__)

PREFIX = "vgpu_dra_"
# Prepare is 1-20 ms on a healthy node, a claim GET against a slow apiserver can take seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TICK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
GPU_LABELS = ("node", "gpu", "device")
# kubelet_plugin.prepare's failure reasons (PrepareOutcome.reason), shown at 0 from the start.
ENFORCEMENT_REASONS = (REASON_OVER_CAP, REASON_NO_HOOK)
PREPARE_REASONS = (
    "overbooked",
    "invalid_claim",
    "api_error",
    "hook_library",
    "node_io",
    "internal",
)
CLAIM_LABELS = ("node", "namespace", "pod", "container", "claim", "claim_uid", "gpu", "device")


@dataclass(frozen=True, slots=True)
class GpuReading:
    memory_used: int
    utilisation: float  # 0..1


class GpuReader(Protocol):
    """Live figures of one GPU at scrape time (None when it cannot be read)."""

    def read(self, uuid: str) -> GpuReading | None: ...


class NvmlGpuReader:
    """`GpuReader` over the NVML seam; opens NVML on first use and keeps it open."""

    def __init__(self, nvml_factory: Callable[[], Nvml]) -> None:
        self._factory = nvml_factory
        self._nvml: Nvml | None = None
        self._handles: dict[str, DeviceHandle] = {}
        self._lock = threading.Lock()
        self._failed = False

    def read(self, uuid: str) -> GpuReading | None:
        with self._lock:
            if self._failed:
                return None
            try:
                if self._nvml is None:
                    nvml = self._factory()
                    nvml.init()
                    self._nvml = nvml
                handle = self._handles.get(uuid)
                if handle is None:
                    handle = self._handles[uuid] = self._nvml.device_by_uuid(uuid)
                used = self._nvml.memory_used(handle)
                util = self._nvml.gpu_utilization(handle)
            except NvmlError as exc:
                if self._nvml is None:  # NVML cannot be opened at all: stop trying
                    self._failed = True
                    log.warning("metrics: NVML unavailable, no live GPU figures: %s", exc)
                else:
                    log.debug("metrics: NVML read of %s failed: %s", uuid, exc)
                return None
        return GpuReading(memory_used=max(0, used), utilisation=min(1.0, max(0.0, util / 100)))

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                try:
                    self._nvml.shutdown()
                except NvmlError as exc:
                    log.debug("metrics: nvmlShutdown failed: %s", exc)
                self._nvml = None


class PluginMetrics:
    """The plugin's registry: event metrics plus a `NodeCollector` for the state metrics."""

    def __init__(self, node: str = "") -> None:
        # Every series carries `node`, like the scrape-time ones: dashboards and
        # `vgpu-dra status` need no relabelling rules to tell the nodes apart.
        self.node = node
        self.registry = CollectorRegistry(auto_describe=True)
        self.prepare_seconds = Histogram(
            PREFIX + "prepare_duration_seconds",
            "Time to prepare one claim (NodePrepareResources, per claim), failures included.",
            ["node"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        ).labels(node)
        self.unprepare_seconds = Histogram(
            PREFIX + "unprepare_duration_seconds",
            "Time to unprepare one claim (NodeUnprepareResources, per claim).",
            ["node"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        ).labels(node)
        self.prepare_errors = Counter(
            PREFIX + "prepare_errors",
            "Claims whose prepare failed, by reason (overbooked, invalid_claim, api_error, "
            "hook_library, node_io, internal).",
            ["node", "reason"],
            registry=self.registry,
        )
        self.unprepare_errors = Counter(
            PREFIX + "unprepare_errors",
            "Claims whose unprepare failed, by reason (invalid_claim, internal).",
            ["node", "reason"],
            registry=self.registry,
        )
        self.slice_syncs = Counter(
            PREFIX + "slice_syncs",
            "ResourceSlice syncs of this node's pool, by outcome (written, unchanged, error).",
            ["node", "outcome"],
            registry=self.registry,
        )
        self.governor_tick_seconds = Histogram(
            PREFIX + "governor_tick_duration_seconds",
            "Duration of one compute-governor pass (sample NVML, update every capped claim).",
            ["node"],
            registry=self.registry,
            buckets=TICK_BUCKETS,
        ).labels(node)
        self.enforcement_reports = Counter(
            PREFIX + "enforcement_reports",
            "Node-side enforcement findings on prepared claims, by reason (GPUMemoryCapExceeded: "
            "real usage over the cap; GPUHookMissing: a process on the claim's GPU without the "
            "hook).",
            ["node", "reason"],
            registry=self.registry,
        )
        self.enforcement_kills = Counter(
            PREFIX + "enforcement_kills",
            "Processes node-side enforcement killed for using more GPU memory than their claim's "
            "cap (VgpuConfig enforce: kill).",
            ["node"],
            registry=self.registry,
        ).labels(node)
        for reason in ENFORCEMENT_REASONS:
            self.enforcement_reports.labels(node, reason)
        for reason in PREPARE_REASONS:
            self.prepare_errors.labels(node, reason)
        for reason in ("invalid_claim", "internal"):
            self.unprepare_errors.labels(node, reason)
        for outcome in ("written", "unchanged", "error"):
            self.slice_syncs.labels(node, outcome)

    def observe_prepare(self, seconds: float, reason: str) -> None:
        self.prepare_seconds.observe(seconds)
        if reason:
            self.prepare_errors.labels(self.node, reason).inc()

    def observe_unprepare(self, seconds: float, reason: str) -> None:
        self.unprepare_seconds.observe(seconds)
        if reason:
            self.unprepare_errors.labels(self.node, reason).inc()

    def observe_slice_sync(self, outcome: str) -> None:
        self.slice_syncs.labels(self.node, outcome).inc()

    def observe_enforcement(self, reason: str, killed: int) -> None:
        self.enforcement_reports.labels(self.node, reason).inc()
        if killed:
            self.enforcement_kills.inc(killed)

    def observe_governor_tick(self, seconds: float) -> None:
        self.governor_tick_seconds.observe(seconds)

    def add_node_collector(self, collector: NodeCollector) -> None:
        self.registry.register(collector)

    def add_loop_collector(self, supervisor: Supervisor) -> None:
        """`vgpu_dra_loop_failures_total{loop}` and `vgpu_dra_loop_stalled{loop}`, read from the
        plugin's Supervisor at scrape time (the same collector as the controller's)."""
        self.registry.register(LoopCollector(supervisor))


@dataclass(slots=True)
class _GpuTotals:
    memory: int = 0
    cores: int = 0
    claims: int = 0


class NodeCollector(Collector):
    """State metrics, read at scrape time (see the module docstring)."""

    def __init__(
        self,
        *,
        node: str,
        state_dir: str,
        prepared: Callable[[], Mapping[str, ClaimPlan]],
        inventory: Callable[[], NodeInventory],
        pods: Callable[[str], str] = lambda uid: "",
        containers: Callable[[str], str] = lambda uid: "",
        gpus: GpuReader | None = None,
    ) -> None:
        self._node = node
        self._claims_dir = os.path.join(state_dir, "claims")
        self._prepared = prepared
        self._inventory = inventory
        self._pods = pods
        self._containers = containers
        self._gpus = gpus

    def describe(self) -> Iterable[Metric]:
        return []  # dynamic: no description at registration, no collect() there either

    def collect(self) -> Iterator[Metric]:
        node = self._node
        plans = self._prepared()
        inventory = self._inventory()
        by_uuid = {gpu.uuid.lower(): gpu for gpu in inventory.gpus}
        families = _Families()
        totals = {uuid: _GpuTotals() for uuid in by_uuid}
        for plan in plans.values():
            usage = read_usage(os.path.join(self._claims_dir, plan.uid, "region")) or {}
            pod = self._pods(plan.uid)
            container = self._containers(plan.uid)
            for uuid, share in _shares(plan).items():
                gpu = by_uuid.get(uuid)
                device = gpu.device_name if gpu is not None else share.device
                if not share.admin_access:
                    total = totals.setdefault(uuid, _GpuTotals())
                    total.memory += share.memory
                    total.cores += share.cores
                    total.claims += 1
                labels = [node, plan.namespace, pod, container, plan.name, plan.uid, uuid, device]
                families.claim_memory_limit.add_metric(labels, share.memory)
                families.claim_cores_limit.add_metric(labels, share.cores / MAX_CORES)
                stats = usage.get(uuid) or _NO_USAGE
                families.claim_memory_used.add_metric(labels, stats.memory_used)
                families.claim_utilisation.add_metric(labels, stats.utilisation)
                families.claim_throttled.add_metric(labels, stats.throttled_seconds)
                families.claim_processes.add_metric(labels, stats.live_processes)
        families.prepared_claims.add_metric([node], len(plans))
        for uuid, total in totals.items():
            gpu = by_uuid.get(uuid)
            labels = [node, uuid, gpu.device_name if gpu is not None else ""]
            families.gpu_allocated_memory.add_metric(labels, total.memory)
            families.gpu_allocated_cores.add_metric(labels, min(total.cores, MAX_CORES) / 100)
            families.gpu_claims.add_metric(labels, total.claims)
            if gpu is None:
                continue
            families.gpu_memory_total.add_metric(labels, gpu.memory_bytes)
            reading = self._gpus.read(gpu.uuid) if self._gpus is not None else None
            if reading is not None:
                families.gpu_memory_used.add_metric(labels, reading.memory_used)
                families.gpu_utilisation.add_metric(labels, reading.utilisation)
        yield from families.all()


_NO_USAGE = DeviceStats(memory_used=0, utilisation=0.0, throttled_seconds=0.0, live_processes=0)


@dataclass(slots=True)
class _Share:
    device: str
    memory: int = 0
    cores: int = 0
    admin_access: bool = True


def _shares(plan: ClaimPlan) -> dict[str, _Share]:
    """What one claim holds per GPU (two shares of one GPU in one claim add up)."""
    out: dict[str, _Share] = {}
    for device in plan.devices:
        share = out.setdefault(device.uuid.lower(), _Share(device=device.device))
        if device.admin_access:
            continue
        share.memory += device.memory
        share.cores = min(MAX_CORES, share.cores + device.cores)
        share.admin_access = False
    return out


class _Families:
    """The scrape-time families, created fresh for every scrape."""

    def __init__(self) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))

        self.prepared_claims = gauge("prepared_claims", "Claims prepared on this node.", ("node",))
        self.gpu_memory_total = gauge(
            "gpu_memory_total_bytes", "Physical memory of the GPU.", GPU_LABELS
        )
        self.gpu_memory_used = gauge(
            "gpu_memory_used_bytes", "Physical memory in use on the GPU (NVML).", GPU_LABELS
        )
        self.gpu_utilisation = gauge(
            "gpu_utilization_ratio",
            "Share of time the GPU ran kernels over NVML's last sample period (0..1).",
            GPU_LABELS,
        )
        self.gpu_allocated_memory = gauge(
            "gpu_allocated_memory_bytes",
            "Memory of the GPU given to prepared claims (sum of their caps).",
            GPU_LABELS,
        )
        self.gpu_allocated_cores = gauge(
            "gpu_allocated_cores_ratio",
            "Share of the GPU's SMs given to prepared claims (sum of their core caps, 0..1).",
            GPU_LABELS,
        )
        self.gpu_claims = gauge(
            "gpu_claims", "Prepared claims holding a share of the GPU.", GPU_LABELS
        )
        self.claim_memory_limit = gauge(
            "claim_memory_limit_bytes", "Memory cap of the claim on the GPU.", CLAIM_LABELS
        )
        self.claim_memory_used = gauge(
            "claim_memory_used_bytes",
            "Memory the claim's live processes hold on the GPU, as charged to its cap.",
            CLAIM_LABELS,
        )
        self.claim_cores_limit = gauge(
            "claim_cores_limit_ratio",
            "Compute cap of the claim on the GPU as a share of its SMs (0 = no cap).",
            CLAIM_LABELS,
        )
        self.claim_utilisation = gauge(
            "claim_utilization_ratio",
            "Last measured SM utilisation of the claim's processes on the GPU (0..1); measured "
            "for compute-capped claims only.",
            CLAIM_LABELS,
        )
        self.claim_throttled = CounterMetricFamily(
            PREFIX + "claim_throttled_seconds",
            "Time the hook held the claim's kernel launches back to keep it under its cap.",
            labels=list(CLAIM_LABELS),
        )
        self.claim_processes = gauge(
            "claim_processes", "Live hooked processes of the claim.", CLAIM_LABELS
        )

    def all(self) -> list[Metric]:
        return [value for value in vars(self).values() if isinstance(value, Metric)]
