"""What the controller's metrics cost: one scrape at 5,000 nodes x 8 GPUs per detail level, and
the observer call each decision makes.

Setup: a `Reconciler` (no API: nothing is decided) fed the Node and ResourceSlice events of
`cluster_events(5000)` (40,000 GPUs, as the allocator benchmark), 20,000 allocated claims spread
over random GPUs (so allocated figures are not all zero) and 100 gated pods waiting with a
memory request each (so the stranded-memory walk has requests to compare with); the informers'
and the leader's gauges as in the process.

Measured per `--metrics-detail` (cluster, node, gpu): series and bytes of one scrape, time to
collect and render the registry (`generate_latest`, what the HTTP handler does) and a full
scrape over loopback HTTP (p50 of 5), and the cost of the decision observer call (one histogram
observation and one counter increment), timed in a loop. Writes
bench/results/controller_metrics.json.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import machine_at_start, utc_stamp, write_results
from bench.scrape import scrape_cost
from controller.informers import ALL, Informer
from controller.metrics import DETAILS, ControllerMetrics, StateCollector
from controller.reconciler import GATE, Defaults, Reconciler
from tests.fixtures.allocator_cluster import DEVICE_CLASS, DRIVER, claim_obj, cluster_events

RESULTS = Path(__file__).parent / "results" / "controller_metrics.json"
NODES = 5000
CLAIMS = 20_000
WAITING = 100
ROUNDS = 5


def build() -> tuple[Reconciler, float]:
    reconciler = Reconciler(None, Defaults({}))  # type: ignore[arg-type]  # no decision: no API
    reconciler.on_event("DeviceClass", "apply", {**DEVICE_CLASS, "metadata": {"name": DRIVER}})
    started = time.perf_counter()
    for kind, obj in cluster_events(NODES, seed=NODES):
        reconciler.model.apply(kind, obj)
    rng = random.Random(1)
    devices = list(reconciler.model.devices.values())
    for i in range(CLAIMS):
        device = rng.choice(devices)
        claim = claim_obj(f"c{i}", memory="4Gi", cores="10")
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "driver": device.key[0],
                            "pool": device.key[1],
                            "device": device.key[2],
                            "request": "gpu",
                            "shareID": f"s{i}",
                            "consumedCapacity": {"memory": "4Gi", "cores": "10"},
                        }
                    ]
                }
            }
        }
        reconciler.model.apply("ResourceClaim", claim)
    for i in range(WAITING):
        claim = claim_obj(f"w{i}", memory=f"{rng.randint(8, 70)}Gi")
        reconciler.claims[("default", f"w{i}")] = claim
        pod = {
            "metadata": {"name": f"w{i}", "namespace": "default", "uid": f"p{i}"},
            "spec": {
                "schedulingGates": [{"name": GATE}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"w{i}"}],
            },
        }
        reconciler.pods[("default", f"w{i}")] = pod
        reconciler.waiting.add(("default", f"w{i}"))
    elapsed = time.perf_counter() - started
    gc.collect()
    gc.freeze()  # the model is long-lived, as in the controller
    return reconciler, elapsed


def measure(reconciler: Reconciler, detail: str) -> dict[str, Any]:
    metrics = ControllerMetrics()
    informers = [Informer(None, r, lambda kind, op, obj: None) for r in ALL]  # type: ignore[arg-type]
    metrics.registry.register(StateCollector(reconciler, informers, detail=detail))
    cost = scrape_cost(metrics.registry, ROUNDS, timeout_s=60)
    return {
        "series": cost.series,
        "bytes": len(cost.body),
        "render_p50_ms": round(statistics.median(cost.render_s) * 1e3, 1),
        "http_scrape_p50_ms": round(statistics.median(cost.http_s) * 1e3, 1),
    }


def observer_cost_us() -> float:
    metrics = ControllerMetrics()
    calls = 100_000
    started = time.perf_counter()
    for _ in range(calls):
        metrics.decided("placed", 0.002)
    return round((time.perf_counter() - started) / calls * 1e6, 3)


def main() -> None:
    reconciler, feed_s = build()
    results: dict[str, Any] = {
        "benchmark": "controller_metrics",
        "machine": machine_at_start(),
        "cluster": {
            "nodes": NODES,
            "gpus": len(reconciler.model.devices),
            "allocated_claims": CLAIMS,
            "waiting_pods": WAITING,
            "build_s": round(feed_s, 1),
        },
        "scrape": {detail: measure(reconciler, detail) for detail in DETAILS},
        "observer_call_us": observer_cost_us(),
        "time": utc_stamp(),
    }
    write_results(RESULTS, results)


if __name__ == "__main__":
    main()
