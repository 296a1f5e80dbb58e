"""Prometheus metrics of the controller, served on `--metrics-address` (docs/observability.md).

Like the kubelet plugin's (`kubelet_plugin.metrics`), two kinds:
- event metrics, updated where things happen: decision latency and outcomes, through the
  reconciler's `ReconcileObserver` (`ControllerMetrics` is one: `decided(outcome, seconds)`);
- state metrics, computed at scrape time by `StateCollector` from what the controller already
  holds: the allocator's model (capacity and allocations of every device), the reconciler's
  gated pods, the informers' counters and the leader elector. Nothing is kept up to date
  between scrapes, so the worker pays nothing for them.

Cardinality. A 5,000-node cluster with 8 GPUs per node has 40,000 GPUs; four per-GPU gauges
would be 160,000 series from one process, most of them also exported by each node's plugin
(`vgpu_dra_gpu_allocated_*`). So `--metrics-detail` chooses: `cluster` (totals only, a dozen
series), `node` (the default: six series per node, 30,000 at 5,000 nodes, the same order as a
kube-state-metrics node) or `gpu` (adds four per GPU; for small clusters or debugging). Labels
never carry pod or claim names: those are unbounded and live in Events and the Placement
condition.

Thread safety: the worker thread mutates the model while a scrape reads it from the HTTP
server's thread. The collector takes C-level copies (`list(dict.values())`, `dict(...)`, which
hold the GIL for their whole run) and otherwise only does single lookups, so it never iterates a
dict that is being resized; a scrape may see a decision half applied, never a crash.

The webhook (another module) registers its admission metrics into `ControllerMetrics.registry`,
named `vgpu_dra_webhook_*`, so one endpoint serves the whole process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.objects import claim_names
from controller.reconciler import OUTCOMES
from dra_driver import names
from dra_driver.allocator import QuantityError, parse_quantity

if TYPE_CHECKING:
    from controller.informers import Informer
    from controller.reconciler import Reconciler
    from dra_driver.allocator.model import Device

PREFIX = "vgpu_dra_controller_"
DETAILS = ("cluster", "node", "gpu")
# A decision is ~1 ms on a small cluster, tens of ms at 5k nodes; writes add API round trips.
DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# The reconciler's outcomes (OUTCOMES) that place the pod; every other one is a failure reason.
PLACED = ("placed", "replaced")


class ControllerMetrics:
    """The controller's registry and its event metrics; a `ReconcileObserver`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.decision_seconds = Histogram(
            PREFIX + "decision_duration_seconds",
            "Time of one placement decision of a gated pod (allocator plus API writes), by "
            "outcome (" + ", ".join(OUTCOMES) + ").",
            ["outcome"],
            registry=self.registry,
            buckets=DECISION_BUCKETS,
        )
        self.placements = Counter(
            PREFIX + "placements",
            "Gated pods placed (claims written, scheduling gate lifted), re-placements included.",
            registry=self.registry,
        )
        self.failures = Counter(
            PREFIX + "placement_failures",
            "Decisions that placed nothing, by reason (refused, invalid: the pod waits for a "
            "change; retry, api_error: decided again; handed_over: left to kube-scheduler; "
            "internal_error: the decision raised, the pod waits for a change).",
            ["reason"],
            registry=self.registry,
        )
        # Children bound once: a decision pays one observation and at most one increment.
        self._seconds = {outcome: self.decision_seconds.labels(outcome) for outcome in OUTCOMES}
        self._failures = {o: self.failures.labels(o) for o in OUTCOMES if o not in PLACED}

    # ReconcileObserver
    def decided(self, outcome: str, seconds: float) -> None:
        """One decision's outcome (the reconciler's OUTCOMES) and duration; never raises."""
        timer = self._seconds.get(outcome)
        if timer is None:  # an outcome added to the reconciler later still counts
            timer = self._seconds[outcome] = self.decision_seconds.labels(outcome)
        timer.observe(seconds)
        if outcome in PLACED:
            self.placements.inc()
            return
        failure = self._failures.get(outcome)
        if failure is None:
            failure = self._failures[outcome] = self.failures.labels(outcome)
        failure.inc()


@dataclass(slots=True)
class _Totals:
    gpus: int = 0
    memory_capacity: int = 0
    memory_allocated: int = 0
    cores_capacity: int = 0
    cores_allocated: int = 0
    largest_free: int = 0
    free: int = 0

    def add(self, memory: int, memory_used: int, cores: int, cores_used: int) -> None:
        """Count one GPU."""
        self.gpus += 1
        self.memory_capacity += memory
        self.memory_allocated += memory_used
        self.cores_capacity += cores
        self.cores_allocated += cores_used
        free = memory - memory_used
        self.free += free
        self.largest_free = max(self.largest_free, free)

    @classmethod
    def sum(cls, parts: Iterable[_Totals]) -> _Totals:
        out = cls()
        for part in parts:
            out.gpus += part.gpus
            out.memory_capacity += part.memory_capacity
            out.memory_allocated += part.memory_allocated
            out.cores_capacity += part.cores_capacity
            out.cores_allocated += part.cores_allocated
        return out


class StateCollector(Collector):
    """State metrics, read at scrape time (see the module docstring)."""

    def __init__(
        self,
        reconciler: Reconciler,
        informers: Sequence[Informer],
        *,
        leader: Callable[[], bool] = lambda: True,
        detail: str = "node",
    ) -> None:
        if detail not in DETAILS:
            raise ValueError(f"detail {detail!r}: use one of {', '.join(DETAILS)}")
        self._reconciler = reconciler
        self._informers = informers
        self._leader = leader
        self._detail = detail
        self._lock = threading.Lock()  # one scrape at a time (they share nothing else)

    def describe(self) -> Iterable[Metric]:
        return []  # dynamic: no description at registration, no collect() there either

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._leader_metric()
            yield from self._pending_metrics()
            yield from self._informer_metrics()
            yield from self._capacity_metrics()

    def _leader_metric(self) -> Iterator[Metric]:
        try:
            leading = bool(self._leader())
        except Exception:  # an elector that cannot tell is not leading
            leading = False
        yield GaugeMetricFamily(
            PREFIX + "leader",
            "1 while this replica holds the Lease and allocates, else 0 (a standby).",
            value=1 if leading else 0,
        )

    def _pending_metrics(self) -> Iterator[Metric]:
        pods = len(self._reconciler.pods)
        waiting = len(self._reconciler.waiting)
        family = GaugeMetricFamily(
            PREFIX + "pending_pods",
            "Pods held by the policy path's scheduling gate, by state (waiting: refused, "
            "tried again on a change; queued: not decided yet or being retried).",
            labels=["state"],
        )
        family.add_metric(["waiting"], waiting)
        family.add_metric(["queued"], max(0, pods - waiting))
        yield family

    def _informer_metrics(self) -> Iterator[Metric]:
        synced = GaugeMetricFamily(
            PREFIX + "informer_synced",
            "1 once the informer has listed its resource, else 0.",
            labels=["resource"],
        )
        lists = CounterMetricFamily(
            PREFIX + "informer_lists",
            "Full lists of the resource (1 at start, then one after each expired or failed watch).",
            labels=["resource"],
        )
        restarts = CounterMetricFamily(
            PREFIX + "informer_watch_restarts",
            "Watches that ended abnormally, by reason (expired: 410 Gone, relisted; error: the "
            "call failed, retried after a backoff).",
            labels=["resource", "reason"],
        )
        for informer in self._informers:
            resource = informer.resource.plural
            synced.add_metric([resource], 1 if informer.synced.is_set() else 0)
            lists.add_metric([resource], informer.relists)
            restarts.add_metric([resource, "expired"], informer.expired)
            restarts.add_metric([resource, "error"], informer.failures)
        yield from (synced, lists, restarts)

    def _capacity_metrics(self) -> Iterator[Metric]:
        model = self._reconciler.model
        devices = _copy_values(model.devices)
        per_node: dict[str, _Totals] = {}
        gpu_rows: list[tuple[list[str], int, int, int, int]] = []
        usable = _smallest_pending_memory(self._reconciler)
        stranded = 0
        keys: dict[str, tuple[str, str]] = {}  # driver -> its memory and cores capacity names
        no_use: dict[str, int] = {}
        per_gpu = self._detail == "gpu"
        for device in devices:  # 40,000 at 5,000 nodes: kept to plain lookups
            driver = device.key[0]
            names_of = keys.get(driver)
            if names_of is None:
                names_of = keys[driver] = (
                    f"{driver}/{names.CAPACITY_MEMORY}",
                    f"{driver}/{names.CAPACITY_CORES}",
                )
            memory_cap = device.capacity.get(names_of[0])
            if memory_cap is None:
                continue  # not a GPU of a vgpu-dra-like driver (no memory capacity)
            memory = memory_cap.value
            cores_cap = device.capacity.get(names_of[1])
            cores = cores_cap.value if cores_cap is not None else 0
            if model.is_held(device.key):  # a GPU held whole counts whole
                memory_used, cores_used = memory, cores
            else:
                used = model.used.get(device.key) or no_use
                memory_used = min(memory, used.get(names_of[0], 0))
                cores_used = min(cores, used.get(names_of[1], 0))
            node = per_node.get(device.node)
            if node is None:
                node = per_node[device.node] = _Totals()
            node.add(memory, memory_used, cores, cores_used)
            free = memory - memory_used
            if usable is not None and free > 0 and not usable(free, memory):
                stranded += free
            if per_gpu:
                labels = [device.node, device.uuid.lower(), device.key[2]]
                gpu_rows.append((labels, memory, memory_used, cores, cores_used))
        yield from self._capacity_families(per_node, stranded, gpu_rows)

    def _capacity_families(
        self,
        per_node: dict[str, _Totals],
        stranded: int,
        gpu_rows: list[tuple[list[str], int, int, int, int]],
    ) -> Iterator[Metric]:
        yield from _totals_families(PREFIX, "", [([], _Totals.sum(per_node.values()))])
        yield GaugeMetricFamily(
            PREFIX + "stranded_memory_bytes",
            "Free GPU memory that no waiting pod's request can use: on GPUs whose free memory "
            "is less than the smallest memory any waiting request asks of one GPU (0 while no "
            "pod waits).",
            value=stranded,
        )
        if self._detail in ("node", "gpu"):
            rows = [([name], totals) for name, totals in sorted(per_node.items())]
            yield from _totals_families(PREFIX + "node_", "node", rows)
            fragmentation = GaugeMetricFamily(
                PREFIX + "node_memory_fragmentation_ratio",
                "How scattered a node's free GPU memory is: 1 - (largest free memory on one "
                "GPU / free memory of all its GPUs); 0 when it is all on one GPU or none is free.",
                labels=["node"],
            )
            for labels, totals in rows:
                fragmentation.add_metric(labels, _fragmentation(totals))
            yield fragmentation
        if self._detail == "gpu":
            yield from _gpu_families(gpu_rows)


def _copy_values(mapping: Mapping[Any, Device]) -> list[Device]:
    """A copy of the model's devices that a concurrent insert cannot break."""
    for _ in range(10):
        try:
            return list(mapping.values())
        except RuntimeError:  # resized during the copy (only if the copy ever ran Python code)
            continue
    return []


def _fragmentation(totals: _Totals) -> float:
    if totals.free <= 0:
        return 0.0
    return 1.0 - totals.largest_free / totals.free


def _totals_families(
    prefix: str, label: str, rows: list[tuple[list[str], _Totals]]
) -> Iterator[Metric]:
    labels = [label] if label else []
    where = "on the node" if label else "in the cluster"
    families = {
        "gpus": (f"GPUs published {where} (devices with a memory capacity).", "gpus"),
        "memory_capacity_bytes": (f"GPU memory published {where}.", "memory_capacity"),
        "memory_allocated_bytes": (
            f"GPU memory allocated to claims {where} (a GPU held whole counts whole).",
            "memory_allocated",
        ),
        "cores_capacity": (
            f"Compute published {where}, in the driver's cores capacity (100 = one GPU's SMs).",
            "cores_capacity",
        ),
        "cores_allocated": (f"Compute allocated to claims {where}, same unit.", "cores_allocated"),
    }
    for name, (doc, field) in families.items():
        family = GaugeMetricFamily(prefix + name, doc, labels=labels)
        for values, totals in rows:
            family.add_metric(values, getattr(totals, field))
        yield family


def _gpu_families(rows: list[tuple[list[str], int, int, int, int]]) -> Iterator[Metric]:
    specs = (
        ("gpu_memory_capacity_bytes", "Memory the GPU publishes."),
        ("gpu_memory_allocated_bytes", "Memory of the GPU allocated to claims."),
        ("gpu_cores_capacity", "Compute the GPU publishes (100 = all its SMs)."),
        ("gpu_cores_allocated", "Compute of the GPU allocated to claims."),
    )
    families = [
        GaugeMetricFamily(PREFIX + name, doc, labels=["node", "gpu", "device"])
        for name, doc in specs
    ]
    for labels, *values in rows:
        for family, value in zip(families, values, strict=True):
            family.add_metric(labels, value)
    yield from families


def _smallest_pending_memory(reconciler: Reconciler) -> Callable[[int, int], bool] | None:
    """A test "can some waiting request use `free` bytes of a GPU of `total` bytes", or None
    while no pod waits. A request naming no memory takes a whole GPU (only a free GPU serves
    it); selectors and classes are not considered (this is a measure of size only)."""
    smallest: int | None = None
    whole = False
    for key in list(reconciler.waiting):
        pod = reconciler.pods.get(key)
        if pod is None:
            continue
        for claim_name in claim_names(pod) or []:
            claim = reconciler.claims.get((key[0], claim_name))
            if claim is None:
                continue
            for amount in _memory_requests(claim):
                if amount is None:
                    whole = True
                else:
                    smallest = amount if smallest is None else min(smallest, amount)
    if smallest is None and not whole:
        return None
    limit = smallest

    def usable(free: int, total: int) -> bool:
        return (limit is not None and free >= limit) or (whole and free >= total)

    return usable


def _memory_requests(claim: Mapping[str, Any]) -> Iterator[int | None]:
    """Per-GPU memory each request alternative of a claim asks (None: no amount, a whole GPU)."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    for request in requests:
        alternatives = [request["exactly"]] if request.get("exactly") else []
        alternatives += list(request.get("firstAvailable") or [])
        for alternative in alternatives:
            if alternative.get("adminAccess"):
                continue
            amounts = (alternative.get("capacity") or {}).get("requests") or {}
            text = amounts.get(names.CAPACITY_MEMORY)
            if text is None:
                yield None
                continue
            try:
                yield parse_quantity(str(text))
            except QuantityError:
                continue
