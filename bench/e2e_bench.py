"""Pods/s through the real control plane: the policy path vs kube-scheduler's default path
(issue 10, e2e.json).

For each client-limit setting (stock: kube-scheduler 50 requests/s, kube-controller-manager
20/s; raised: both 1,000/s) one test-bed control plane runs, with `vgpu-dra controller` as a
subprocess (admin credentials). At 100 and then 500 nodes (8 GPUs each, ResourceSlices from the
real builder, Nodes with allocatable pods/cpu/memory) the same batch of pods is created on each
path in turn, each pod with its own ResourceClaim (one GPU share, 10Gi + 20 cores), by a few
concurrent writers:

- policy path: pods carry the scheduling gate `vgpu.dra.dev/policy`; the controller allocates
  the claim and lifts the gate, kube-scheduler binds;
- default path: no gate; kube-scheduler's DRA plugin allocates and binds.

Figures per run: pods/s from the first creation to the last claim allocated (status.allocation
seen by a watch), per-pod creation -> allocated percentiles, and for the policy path the
controller's own decision time (from the allocator's debug log lines) as a share of the run's
wall time; and where the machine's CPU went during each run (`cpu_s`: seconds of CPU, user plus
system from /proc, of etcd, kube-apiserver, kube-scheduler, kube-controller-manager, the
controller, and this process: the clients creating pods and the watch), to tell an API-server
bound run from a controller bound one on the 2 cores. The pods tolerate every taint (the nodes
carry the not-ready taint the admission plugin adds; no kubelets run). Sizes via
E2E_BENCH_SIZES / E2E_BENCH_PODS / E2E_BENCH_LIMITS; writes bench/results/e2e.json (or
E2E_BENCH_OUT).
"""

from __future__ import annotations

import os
import re
import resource
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.cluster_load import (
    bench_claim,
    bench_pod,
    controller_process,
    create_device_class,
    is_ready,
    probe_url,
)
from bench.common import machine_at_start, percentiles, utc_stamp, write_results
from bench.controller_bench import create_all, slices_of
from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from vgpu_testbed.cluster.control_plane import CONTROL_PLANE, running_cluster

RESULTS = Path(os.environ.get("E2E_BENCH_OUT", Path(__file__).parent / "results" / "e2e.json"))
SIZES = tuple(int(s) for s in os.environ.get("E2E_BENCH_SIZES", "100,500").split(","))
PODS = int(os.environ.get("E2E_BENCH_PODS", "150"))
LIMITS: dict[str, int | None] = {
    name: qps
    for name, qps in (("stock", None), ("raised", 1000))
    if name in os.environ.get("E2E_BENCH_LIMITS", "stock,raised").split(",")
}
DRIVER = "scale.vgpu.dra.dev"  # as controller_bench: its slices_of() builds for this driver
GATE = "vgpu.dra.dev/policy"
WRITERS = 4
DECISION = re.compile(r"decision \S+ in ([\d.]+) ms \(layout rebuilt: (True|False)\)")
ALLOCATABLE = {"cpu": "64", "memory": "512Gi", "pods": "500"}


def add_nodes(client: KubeClient, kubeconfig: str, first: int, last: int) -> None:
    """Nodes first..last-1 with allocatable resources in their status, and their slices."""

    def node(n: int) -> None:
        name = f"scale-{n:05d}"
        obj = client.create(
            kube.path("v1", "nodes"),
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            },
        )
        obj["status"] = {"capacity": ALLOCATABLE, "allocatable": ALLOCATABLE}
        client.replace(kube.path("v1", "nodes", name, subresource="status"), obj)

    with ThreadPoolExecutor(8) as pool:
        for _ in pool.map(node, range(first, last)):
            pass
    create_all(
        kubeconfig,
        [
            (kube.path(RESOURCE_API, "resourceslices"), obj)
            for n in range(first, last)
            for obj in slices_of(n)
        ],
    )


def watch_allocations(
    kubeconfig: str,
    claims_path: str,
    version: str,
    allocated: dict[str, float],
    done: threading.Event,
) -> None:
    """Record when each claim is first seen allocated; set `done` once PODS are."""
    watcher = KubeClient.from_kubeconfig(kubeconfig)
    seen = version
    try:
        while not done.is_set():
            try:
                for event in watcher.watch(claims_path, seen, timeout_s=30):
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    seen = str(meta.get("resourceVersion") or seen)
                    name = str(meta.get("name"))
                    if (obj.get("status") or {}).get("allocation") and name not in allocated:
                        allocated[name] = time.monotonic()
                        if len(allocated) >= PODS:
                            done.set()
                    if done.is_set():
                        return
            except kube.KubeError:
                continue
    finally:
        watcher.close()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a live process so far (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command: state is field 3, utime 14 and stime 15 (1-based, proc(5)).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    taken = {name: cpu_seconds(pid) for name, pid in pids.items()}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    taken["bench (clients, watch)"] = usage.ru_utime + usage.ru_stime
    return taken


def run_path(kubeconfig: str, namespace: str, *, gated: bool) -> dict[str, Any]:
    """Create PODS pods with claims in `namespace`; wait until every claim is allocated."""
    client = KubeClient.from_kubeconfig(kubeconfig)
    client.create(
        kube.path("v1", "namespaces"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    claims_path = kube.path(RESOURCE_API, "resourceclaims", namespace=namespace)
    version = client.list_versioned(claims_path)[1]
    created: dict[str, float] = {}
    allocated: dict[str, float] = {}
    done = threading.Event()

    thread = threading.Thread(
        target=watch_allocations,
        args=(kubeconfig, claims_path, version, allocated, done),
        daemon=True,
    )
    thread.start()
    local = threading.local()
    writers: list[KubeClient] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        writer = getattr(local, "client", None)
        if writer is None:
            writer = local.client = KubeClient.from_kubeconfig(kubeconfig)
            with lock:
                writers.append(writer)
        name = f"p{i}"
        created[name] = time.monotonic()
        writer.create(claims_path, bench_claim(name, namespace, DRIVER))
        writer.create(
            kube.path("v1", "pods", namespace=namespace),
            bench_pod(name, namespace, name, GATE if gated else None),
        )

    started = time.monotonic()
    with ThreadPoolExecutor(WRITERS) as pool:
        for _ in pool.map(one, range(PODS)):
            pass
    created_s = time.monotonic() - started
    done.wait(timeout=600)
    done.set()
    thread.join(timeout=40)
    for writer in writers:
        writer.close()
    client.close()
    latencies = [allocated[k] - created[k] for k in created if k in allocated]
    end = max(allocated.values()) if allocated else time.monotonic()
    return {
        "pods": PODS,
        "allocated": len(allocated),
        "creation_s": round(created_s, 2),
        "wall_s": round(end - started, 2),
        "pods_per_s": round(len(allocated) / (end - started), 1),
        "creation_to_allocated": percentiles(latencies) if latencies else {},
        "_started": started,
        "_end": end,
    }


def main() -> None:
    results: dict[str, Any] = {
        "benchmark": "e2e",
        "machine": machine_at_start(),
        "pods_per_run": PODS,
        "runs": {},
    }
    for limits, qps in LIMITS.items():
        with (
            tempfile.TemporaryDirectory(prefix="e2e-bench-") as tmp,
            running_cluster(
                Path(tmp) / "cluster", ["a10-pcie"], die_with_parent=True, client_qps=qps
            ) as cluster,
        ):
            kubeconfig = str(cluster.kubeconfig)
            client = KubeClient.from_kubeconfig(kubeconfig)
            create_device_class(client, DRIVER)
            log = Path(tmp) / "controller.log"
            with controller_process(kubeconfig, log) as controller:
                pids = {p.name: p.pid for p in cluster.processes if p.name in CONTROL_PLANE}
                pids["controller"] = controller.pid
                made = 0
                for size in SIZES:
                    add_nodes(client, kubeconfig, made, size)
                    made = size
                    deadline = time.monotonic() + 120
                    while time.monotonic() < deadline:
                        url = probe_url(log)
                        if url and is_ready(url):
                            break
                        time.sleep(0.2)
                    time.sleep(2)  # let the controller's informers take the new objects in
                    entry: dict[str, Any] = {}
                    for path, gated in (("policy", True), ("default", False)):
                        before = len(DECISION.findall(log.read_text()))
                        cpu_before = cpu_snapshot(pids)
                        figures = run_path(kubeconfig, f"{path}-{size}", gated=gated)
                        cpu_after = cpu_snapshot(pids)
                        wall = figures.pop("_end") - figures.pop("_started")
                        # From the first creation to the last allocation seen, and a little
                        # after (the watch's end): the whole machine offers 2 x wall.
                        figures["cpu_s"] = {
                            name: round(cpu_after[name] - cpu_before[name], 2)
                            for name in cpu_before
                        }
                        if gated:
                            found = DECISION.findall(log.read_text())[before:]
                            decided = [float(ms) for ms, _ in found]
                            rebuilt = [float(ms) for ms, flag in found if flag == "True"]
                            figures["controller_decisions"] = len(decided)
                            figures["controller_decision_ms_total"] = round(sum(decided), 1)
                            figures["controller_decision_share"] = round(
                                sum(decided) / 1e3 / wall, 4
                            )
                            # The first decision after nodes were added rebuilds the layout
                            # (once); the share without it is the steady-state figure.
                            figures["controller_layout_rebuild_ms"] = round(sum(rebuilt), 1)
                            figures["controller_decision_share_without_rebuild"] = round(
                                (sum(decided) - sum(rebuilt)) / 1e3 / wall, 4
                            )
                        entry[path] = figures
                        print(limits, size, path, figures, flush=True)
                    results["runs"].setdefault(limits, {})[str(size)] = entry
            client.close()
    results["client_limits"] = {
        "stock": "kube-scheduler 50/s (burst 100), kube-controller-manager 20/s (burst 30)",
        "raised": "both 1000/s, burst 1000",
    }
    results["machine"]["load_average_at_end"] = os.getloadavg()[0]
    results["time"] = utc_stamp()
    write_results(RESULTS, results)


if __name__ == "__main__":
    main()
