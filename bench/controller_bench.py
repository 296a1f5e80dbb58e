"""The allocation controller at scale on the real control plane (issue 10, controller_scale.json).

Setup: the test bed's control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager); 5,000 Nodes and their ResourceSlices (8 GPUs each, the real slice
builder, mixed products and NVLink shapes) created through the apiserver by concurrent clients.
Then `vgpu-dra controller` starts as a subprocess with the admin credentials and is measured:

- start to ready: from the process start until /readyz answers 200, i.e. every informer listed
  (target <= 10 s);
- RSS after ready and the peak (VmHWM) at the end (target <= 500 MiB);
- decisions under churn: gated pods, each with its own ResourceClaim, are created while other
  slices are republished (a new pool generation) and earlier pods and claims are deleted; each
  decision's duration comes from the allocator's debug log line ("decision ... in X ms (layout
  rebuilt: ...)"), p50/p99 over all, and over those that did not rebuild the layout after a
  slice change; plus the time from pod creation to its claim allocated, seen by a watch.

The nodes carry the not-ready taint the admission plugin adds (no kubelets, no node lifecycle
controller here); the bench pods tolerate every taint, so node fit passes as on healthy nodes.
Sizes via CONTROLLER_BENCH_NODES / CONTROLLER_BENCH_PODS (the smoke test uses a few). Writes
bench/results/controller_scale.json (not when CONTROLLER_BENCH_OUT says elsewhere).
"""

from __future__ import annotations

import os
import re
import statistics
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
from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from dra_driver.slices import build_slices
from tests.fixtures.allocator_cluster import PRODUCTS, SHAPES, inventory
from vgpu_testbed.cluster.control_plane import running_cluster

RESULTS = Path(
    os.environ.get(
        "CONTROLLER_BENCH_OUT", Path(__file__).parent / "results" / "controller_scale.json"
    )
)
NODES = int(os.environ.get("CONTROLLER_BENCH_NODES", "5000"))
PODS = int(os.environ.get("CONTROLLER_BENCH_PODS", "300"))
GPUS = 8
WRITERS = 16  # concurrent clients creating nodes and slices
DRIVER = "scale.vgpu.dra.dev"
NAMESPACE = "scale-bench"
GATE = "vgpu.dra.dev/policy"
SLICES = kube.path(RESOURCE_API, "resourceslices")
CLAIMS_PATH = kube.path(RESOURCE_API, "resourceclaims", namespace=NAMESPACE)
PODS_PATH = kube.path("v1", "pods", namespace=NAMESPACE)
DECISION = re.compile(r"decision (\S+) in ([\d.]+) ms \(layout rebuilt: (True|False)\)")
TARGETS = {"rss_mib": 500, "start_to_ready_s": 10.0}


def node_name(n: int) -> str:
    return f"scale-{n:05d}"


def node_obj(n: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name(n), "labels": {"kubernetes.io/hostname": node_name(n)}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
    }


def slices_of(n: int, generation: int = 1) -> list[dict[str, Any]]:
    product = PRODUCTS[n % len(PRODUCTS)]
    shape = sorted(SHAPES)[n % len(SHAPES)]
    objs = build_slices(
        inventory(n, GPUS, product, SHAPES[shape]),
        driver=DRIVER,
        node_name=node_name(n),
        node_uid=f"uid-{n}",
    )
    for obj in objs:
        obj["metadata"].pop("ownerReferences", None)  # the Node uid above is not the real one
        obj["spec"]["pool"]["generation"] = generation
    return objs


def create_all(kubeconfig: str, jobs: list[tuple[str, dict[str, Any]]]) -> float:
    """Create every (path, object) with WRITERS concurrent clients; the seconds it took."""
    local = threading.local()
    clients: list[KubeClient] = []
    lock = threading.Lock()

    def one(job: tuple[str, dict[str, Any]]) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = KubeClient.from_kubeconfig(kubeconfig)
            with lock:
                clients.append(client)
        for attempt in range(5):
            try:
                client.create(*job)
                return
            except kube.AlreadyExists:  # an earlier attempt did land
                return
            except kube.Unreachable:  # a loaded apiserver may drop a connection: once more
                time.sleep(0.2 * (attempt + 1))
        client.create(*job)

    started = time.monotonic()
    with ThreadPoolExecutor(WRITERS) as pool:
        for _ in pool.map(one, jobs):
            pass
    for client in clients:
        client.close()
    return time.monotonic() - started


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field} for pid {pid}")


def churn(client: KubeClient, stop: threading.Event, counts: dict[str, int], nodes: int) -> None:
    """Republish one node's slices with a new pool generation every second, round robin."""
    n = 0
    generation = 2
    while not stop.wait(1.0):
        target = (n * 7919) % nodes
        for obj in slices_of(target, generation):
            name = obj["metadata"]["name"]
            current = client.get(kube.path(RESOURCE_API, "resourceslices", name))
            obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            client.replace(kube.path(RESOURCE_API, "resourceslices", name), obj)
        counts["slice_updates"] += 1
        n += 1
        if n % max(1, nodes) == 0:
            generation += 1


def run_churn(client: KubeClient, kubeconfig: str, nodes: int) -> dict[str, Any]:
    """Create gated pods with claims at a steady pace while slices change and older pods and
    claims are deleted; the creation -> allocated latency of each claim."""
    created: dict[str, float] = {}
    allocated: dict[str, float] = {}
    stop = threading.Event()
    counts = {"slice_updates": 0, "deleted": 0}
    version = client.list_versioned(CLAIMS_PATH)[1]

    def watch_claims() -> None:
        while not stop.is_set() and len(allocated) < PODS:
            try:
                for event in client_w.watch(CLAIMS_PATH, version, timeout_s=30):
                    obj = event.get("object") or {}
                    name = str((obj.get("metadata") or {}).get("name"))
                    if (obj.get("status") or {}).get("allocation") and name not in allocated:
                        allocated[name] = time.monotonic()
                    if stop.is_set() or len(allocated) >= PODS:
                        return
            except kube.KubeError:
                continue

    client_w = KubeClient.from_kubeconfig(kubeconfig)
    watcher = threading.Thread(target=watch_claims, daemon=True)
    watcher.start()
    churner = threading.Thread(target=churn, args=(client, stop, counts, nodes), daemon=True)
    churner.start()
    creator = KubeClient.from_kubeconfig(kubeconfig)
    started = time.monotonic()
    for i in range(PODS):
        creator.create(
            CLAIMS_PATH, bench_claim(f"c{i}", NAMESPACE, DRIVER, gpus=1 + (i % 4 == 3))
        )  # every fourth asks for two GPUs
        created[f"c{i}"] = time.monotonic()
        creator.create(PODS_PATH, bench_pod(f"p{i}", NAMESPACE, f"c{i}", GATE))
        if i >= 50 and i % 5 == 0:  # release an older placement now and then
            old = i - 50
            if f"c{old}" in allocated:
                creator.delete(kube.path("v1", "pods", f"p{old}", namespace=NAMESPACE))
                creator.delete(
                    kube.path(RESOURCE_API, "resourceclaims", f"c{old}", namespace=NAMESPACE)
                )
                counts["deleted"] += 1
        time.sleep(0.05)
    deadline = time.monotonic() + 120
    while len(allocated) < PODS and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    churner.join(timeout=30)
    creator.close()
    client_w.close()
    latencies = [allocated[k] - created[k] for k in created if k in allocated]
    return {
        "pods": PODS,
        "allocated": len(latencies),
        "duration_s": round(time.monotonic() - started, 1),
        **counts,
        "creation_to_allocated": percentiles(latencies) if latencies else {},
    }


def decisions(log: Path) -> dict[str, Any]:
    all_ms: list[float] = []
    steady_ms: list[float] = []
    rebuilds = 0
    for node, ms, rebuilt in DECISION.findall(log.read_text()):
        del node
        all_ms.append(float(ms) / 1e3)
        if rebuilt == "True":
            rebuilds += 1
        else:
            steady_ms.append(float(ms) / 1e3)
    out: dict[str, Any] = {"decisions": len(all_ms), "with_layout_rebuild": rebuilds}
    if all_ms:
        out["all"] = percentiles(all_ms)
    if steady_ms:
        out["without_layout_rebuild"] = percentiles(steady_ms)
    if rebuilds:
        rebuilt_ms = sorted(set(all_ms) - set(steady_ms))
        out["layout_rebuild_median_ms"] = round(statistics.median(rebuilt_ms) * 1e3, 1)
    return out


def main() -> None:
    results: dict[str, Any] = {
        "benchmark": "controller_scale",
        "machine": machine_at_start(),
        "targets": TARGETS,
        "nodes": NODES,
        "gpus_per_node": GPUS,
    }
    with (
        tempfile.TemporaryDirectory(prefix="controller-bench-") as tmp,
        running_cluster(Path(tmp) / "cluster", ["a10-pcie"], die_with_parent=True) as cluster,
    ):
        kubeconfig_path = str(cluster.kubeconfig)
        client = KubeClient.from_kubeconfig(kubeconfig_path)
        create_device_class(client, DRIVER)
        client.create(
            kube.path("v1", "namespaces"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        node_s = create_all(
            kubeconfig_path, [(kube.path("v1", "nodes"), node_obj(n)) for n in range(NODES)]
        )
        slice_jobs = [(SLICES, obj) for n in range(NODES) for obj in slices_of(n)]
        slice_s = create_all(kubeconfig_path, slice_jobs)
        results["setup"] = {
            "nodes_created_per_s": round(NODES / node_s, 1),
            "slices": len(slice_jobs),
            "slices_created_per_s": round(len(slice_jobs) / slice_s, 1),
        }
        print("setup", results["setup"], flush=True)
        log = Path(tmp) / "controller.log"
        started = time.monotonic()
        with controller_process(kubeconfig_path, log) as proc:
            ready_s = None
            while time.monotonic() - started < 300 and proc.poll() is None:
                url = probe_url(log)
                if url and is_ready(url):
                    ready_s = time.monotonic() - started
                    break
                time.sleep(0.05)
            if ready_s is None:
                raise RuntimeError(f"controller not ready; log:\n{log.read_text()[-3000:]}")
            results["start_to_ready_s"] = round(ready_s, 2)
            results["rss_after_ready_mib"] = rss_mib(proc.pid)
            print("ready", ready_s, results["rss_after_ready_mib"], flush=True)
            results["churn"] = run_churn(client, kubeconfig_path, NODES)
            results["decision"] = decisions(log)
            results["rss_end_mib"] = rss_mib(proc.pid)
            results["rss_peak_mib"] = rss_mib(proc.pid, "VmHWM")
        client.close()
    results["verdict"] = {
        "rss_met": results["rss_peak_mib"] <= TARGETS["rss_mib"],
        "start_to_ready_met": results["start_to_ready_s"] <= TARGETS["start_to_ready_s"],
    }
    results["machine"]["load_average_at_end"] = os.getloadavg()[0]
    results["time"] = utc_stamp()
    write_results(RESULTS, results)


if __name__ == "__main__":
    main()
