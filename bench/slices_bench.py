"""Cost of keeping a node's ResourceSlices current: the pure builder/plan and the API round trips.

Setup: a throwaway real control plane (vgpu_testbed.cluster.control_plane, one node) and the
SlicePublisher with hand-made inventories; when the simulated GPUs are built, also `discover()` in a
fresh process against the `dgx-h100` profile (what a plugin start or resync pays for NVML).

Measured:
- `build_8`, `build_128`: building the desired slices for 8 / 128 GPUs (pure);
- `plan_noop_8`: the diff when nothing changed (pure);
- `sync_first_8`: the first sync (GET node, LIST, CREATE);
- `sync_noop_8`: a sync with nothing to write (GET node + LIST): the steady-state resync cost;
- `sync_change_8`: a sync that bumps the generation (GET, LIST, PUT);
- `discover_dgx_h100`: wall time of a process that imports pynvml and runs discover().
No targets: these are figures to watch. Writes bench/results/slices.json.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import utc_stamp, write_results
from dra_driver import slices
from dra_driver.kube import KubeClient
from kubelet_plugin.slice_publisher import SlicePublisher, plan_sync
from tests.fixtures.inventories import synthetic_inventory

RESULTS = Path(__file__).parent / "results" / "slices.json"
DRIVER = "vgpu.dra.dev"
SAMPLES = 100


def timed(fn: Callable[[], object], samples: int) -> dict[str, float]:
    durations = []
    for _ in range(samples):
        started = time.perf_counter()
        fn()
        durations.append(time.perf_counter() - started)
    ordered = sorted(durations)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)

    return {
        "n": samples,
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1e3, 3),
    }


def pure_figures() -> dict[str, Any]:
    def build(count: int) -> Callable[[], object]:
        inv = synthetic_inventory(count)
        return lambda: slices.build_slices(inv, driver=DRIVER, node_name="n", node_uid="u")

    desired = slices.build_slices(
        synthetic_inventory(8), driver=DRIVER, node_name="n", node_uid="u"
    )
    listed = [{**obj, "spec": {**obj["spec"], "pool": {**obj["spec"]["pool"]}}} for obj in desired]
    for obj in listed:
        obj["spec"]["pool"]["generation"] = 3
    return {
        "build_8": timed(build(8), SAMPLES),
        "build_128": timed(build(128), SAMPLES),
        "plan_noop_8": timed(lambda: plan_sync(desired, listed), SAMPLES),
    }


def api_figures() -> dict[str, Any]:
    from vgpu_testbed.cluster.control_plane import Cluster

    root = Path(tempfile.mkdtemp(prefix="slices-bench-"))
    with Cluster.start(root, ["dgx-h100"], die_with_parent=True) as cluster:
        client = KubeClient.from_kubeconfig(str(cluster.kubeconfig))
        publisher = SlicePublisher(client, driver=DRIVER, node_name="node-1")
        small, big = synthetic_inventory(8), synthetic_inventory(8, memory=40 << 30)
        first = timed(lambda: publisher.sync(small), 1)
        noop = timed(lambda: publisher.sync(small), SAMPLES)
        flip = [small, big]

        def change() -> None:
            flip.reverse()
            assert publisher.sync(flip[0])

        changed = timed(change, SAMPLES // 2)
        client.close()
    return {
        "sync_first_8": first,
        "sync_noop_8": noop,
        "sync_change_8": changed,
        "final_generation": publisher.generation,
    }


def discover_figure() -> dict[str, Any] | str:
    try:
        from vgpu_testbed.fakegpu import simulator as fakegpu
    except ImportError:
        return "skipped: simulated GPUs (vgpu_testbed.fakegpu.simulator) not available"
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            **fakegpu.prepare_node(fakegpu.load_profile("dgx-h100"), Path(tmp) / "s"),
        }
        code = (
            "import time; from dra_driver.inventory import discover\n"
            "t = time.perf_counter(); n = len(discover().gpus)\n"
            "print(n, time.perf_counter() - t)"
        )
        runs: list[float] = []
        calls: list[float] = []
        for _ in range(5):
            started = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            runs.append(time.perf_counter() - started)
            count, seconds = out.stdout.split()
            assert count == "8", out.stdout + out.stderr
            calls.append(float(seconds))
    return {
        "discover_call_ms_min": round(min(calls) * 1e3, 1),
        "discover_call_ms_max": round(max(calls) * 1e3, 1),
        "process_wall_ms_min": round(min(runs) * 1e3, 1),
        "runs": len(runs),
    }


def main(argv: Sequence[str] = ()) -> None:
    results = {
        "benchmark": "slices",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "pure": pure_figures(),
        "api": api_figures(),
        "discover_dgx_h100": discover_figure(),
        "time": utc_stamp(),
    }
    write_results(RESULTS, results)


if __name__ == "__main__":
    main(sys.argv[1:])
