"""What a user of the allocator sees: placements/s, decision latency, the model's memory and the
first decision after a start, on synthetic clusters of `SIZES` nodes x 8 GPUs.

Setup: mixed H100/A100/A10 nodes with five NVLink shapes, slices from the real builder, fed to a
fresh `ClusterModel` as watch events for every workload. Node binpack, device spread and topology
`link` in every workload:

- `share`: one GPU, 10Gi + 20 cores;
- `nvlink2` / `nvlink4`: 2 / 4 GPUs, 20Gi + 30 cores each, matchAttribute nvlinkDomain;
- `cel`: one GPU, 4Gi, selected by CEL (productName contains "A100" and memory > 30Gi).

Per workload: the first decision on the freshly fed model (the layout built, the class and request
selectors evaluated on every device: what a controller's first decision after a start costs), then
`PLACEMENTS` decisions, each a full `place` (node fit, scan, exact search, results with shareIDs)
followed by `commit`, so later decisions see what earlier ones consumed; wall-clock and CPU time
of the deciding thread per decision (the machine is shared: CPU time leaves preemption out). The
claim mix is the four workloads' decisions together. The cyclic GC runs as in the controller
(no freezing). At the largest size, the model's memory (tracemalloc: feeding the events and
building the layout; then with the four workloads' first decisions, i.e. the allocator's caches).

Targets (issue 28): >= 5,000 placements/s for the claim mix at 1,000 nodes; p99 <= 5 ms, model
<= 64 MiB and first decision <= 2 s at 5,000 nodes. Writes bench/results/allocator.json.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.common import machine_at_start, utc_stamp, write_results
from dra_driver.allocator.allocate import Allocator, Unschedulable
from dra_driver.allocator.model import ClusterModel
from dra_driver.allocator.request import Claim, Policy, parse_claim
from tests.fixtures.allocator_cluster import DEVICE_CLASS, DRIVER, claim_obj, cluster_events

RESULTS = Path(__file__).parent / "results" / "allocator.json"
SIZES = tuple(int(s) for s in os.environ.get("ALLOC_BENCH_SIZES", "1000,5000").split(","))
PLACEMENTS = 400
CLASSES = {DRIVER: DEVICE_CLASS}
LINK = f"{DRIVER}/nvlinkDomain"
POD: dict[str, Any] = {"metadata": {"name": "bench"}, "spec": {}}
TARGETS = {
    "placements_per_s_at_1000_nodes": 5000,
    "p99_ms_at_5000_nodes": 5.0,
    "model_mib_at_5000_nodes": 64,
    "first_decision_s_at_5000_nodes": 2.0,
}


def workloads() -> dict[str, tuple[dict[str, Any], Policy]]:
    link = Policy(node="binpack", device="spread", topology="link")
    selector = (
        f'device.attributes["{DRIVER}"].productName.contains("A100") && '
        f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("30Gi"))'
    )
    raw = {
        "share": claim_obj("share", memory="10Gi", cores="20"),
        "nvlink2": claim_obj("nvlink2", count=2, memory="20Gi", cores="30", match=LINK),
        "nvlink4": claim_obj("nvlink4", count=4, memory="20Gi", cores="30", match=LINK),
        "cel": claim_obj("cel", memory="4Gi", selectors=(selector,)),
    }
    return {name: (obj, link) for name, obj in raw.items()}


def build(nodes: int) -> tuple[ClusterModel, float]:
    """A model fed the cluster's events (the layout is left to the first decision), and the
    seconds feeding took."""
    events = cluster_events(nodes, seed=nodes)
    model = ClusterModel()
    started = time.perf_counter()
    for kind, obj in events:
        model.apply(kind, obj)
    return model, time.perf_counter() - started


def claims(obj: dict[str, Any], count: int) -> list[Claim]:
    """`count` copies of one claim with distinct uids (each placement is a new claim)."""
    out = []
    for i in range(count):
        copy = {**obj, "metadata": {**obj["metadata"], "uid": f"{obj['metadata']['uid']}-{i}"}}
        out.append(parse_claim(copy, CLASSES))
    return out


def run(
    model: ClusterModel, obj: dict[str, Any], policy: Policy
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """The first decision, then up to `PLACEMENTS` decisions with their commits: the summary,
    and the wall and CPU seconds of each timed decision."""
    alloc = Allocator(model)
    todo = claims(obj, PLACEMENTS + 1)
    gc.collect()
    started, started_cpu = time.perf_counter(), time.thread_time()
    alloc.commit(alloc.place(POD, [todo.pop()], policy))
    first = (time.perf_counter() - started, time.thread_time() - started_cpu)
    wall: list[float] = []
    cpu: list[float] = []
    full = False
    for claim in todo:
        started, started_cpu = time.perf_counter(), time.thread_time()
        try:
            placement = alloc.place(POD, [claim], policy)
        except Unschedulable:  # a small cluster is full for this shape: stop there
            full = True
            break
        alloc.commit(placement)
        cpu.append(time.thread_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    summary = {
        "placements": len(wall),
        "cluster_full": full,
        "first_decision_ms": round(first[0] * 1e3, 1),
        "first_decision_cpu_ms": round(first[1] * 1e3, 1),
        **figures("", wall),
        **figures("cpu_", cpu),
    }
    return summary, {"wall": wall, "cpu": cpu}


def memory(nodes: int) -> dict[str, float]:
    """MiB the model holds once fed and laid out, then with every workload's first decision
    made (the allocator's caches: selection masks, node keys, search inputs)."""
    events = cluster_events(nodes, seed=nodes)
    gc.collect()
    tracemalloc.start()
    model = ClusterModel()
    for kind, obj in events:
        model.apply(kind, obj)
    model.layout()
    laid_out, _ = tracemalloc.get_traced_memory()
    alloc = Allocator(model)
    for obj, policy in workloads().values():
        alloc.place(POD, claims(obj, 1), policy)
    decided, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "model_mib": round(laid_out / (1 << 20), 1),
        "with_allocator_mib": round(decided / (1 << 20), 1),
    }


def figures(prefix: str, samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        f"{prefix}placements_per_s": round(len(ordered) / sum(ordered), 1),
        f"{prefix}p50_ms": round(statistics.median(ordered) * 1e3, 4),
        f"{prefix}p99_ms": round(p99 * 1e3, 4),
    }


def verdict(sizes: dict[str, Any]) -> dict[str, Any]:
    """Each target against the figures measured (wall-clock; CPU time beside it)."""
    out: dict[str, Any] = {}
    if "1000" in sizes:
        mix = sizes["1000"]["mix"]
        out["placements_per_s_at_1000_nodes_mix"] = {
            "wall": mix["placements_per_s"],
            "cpu": mix["cpu_placements_per_s"],
            "met": mix["placements_per_s"] >= TARGETS["placements_per_s_at_1000_nodes"],
        }
    if "5000" in sizes:
        entry = sizes["5000"]
        out["p99_ms_at_5000_nodes_mix"] = {
            "wall": entry["mix"]["p99_ms"],
            "cpu": entry["mix"]["cpu_p99_ms"],
            "met": entry["mix"]["p99_ms"] <= TARGETS["p99_ms_at_5000_nodes"],
        }
        out["model_mib_at_5000_nodes"] = {
            **entry["memory"],
            "met": entry["memory"]["model_mib"] <= TARGETS["model_mib_at_5000_nodes"],
        }
        first_ms = max(entry[name]["first_decision_ms"] for name in workloads())
        out["first_decision_s_at_5000_nodes"] = {
            "worst_wall_s": round(first_ms / 1e3, 2),
            "met": first_ms / 1e3 <= TARGETS["first_decision_s_at_5000_nodes"],
        }
    return out


def main() -> None:
    results: dict[str, Any] = {
        "benchmark": "allocator",
        "machine": machine_at_start(),
        "targets": TARGETS,
        "sizes": {},
    }
    for nodes in SIZES:
        entry: dict[str, Any] = {}
        mix: dict[str, list[float]] = {"wall": [], "cpu": []}
        for name, (obj, policy) in workloads().items():
            model, feed_s = build(nodes)  # each workload starts from the same empty cluster
            entry.setdefault("devices", len(model.devices))
            entry.setdefault("feed_events_s", round(feed_s, 2))
            entry[name], samples = run(model, obj, policy)
            mix["wall"] += samples["wall"]
            mix["cpu"] += samples["cpu"]
            print(nodes, name, entry[name], flush=True)
            del model
        entry["mix"] = {**figures("", mix["wall"]), **figures("cpu_", mix["cpu"])}
        if nodes == max(SIZES):
            entry["memory"] = memory(nodes)
        results["sizes"][str(nodes)] = entry
    results["verdict"] = verdict(results["sizes"])
    results["machine"]["load_average_at_end"] = os.getloadavg()[0]
    results["time"] = utc_stamp()
    write_results(RESULTS, results)


if __name__ == "__main__":
    main()
