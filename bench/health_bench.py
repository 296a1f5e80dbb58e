"""Detection latencies of device health, hot-plug and node-side enforcement.

Setup: a real control plane with one simulated `a10-pcie` node whose kubelet plugin runs as a
process with its defaults (`--rescan-seconds 2`) except a 1 s XID quiet period (so a taint lifts
between samples). Faults go through the simulator's C entry points (`Injector`); each clock
starts the instant the fault exists, and the API is polled every 20 ms from this process.

Measured:
- `xid_to_taint`: XID 94 injected into the simulated driver -> the taint is in the ResourceSlice
  (NVML event, decision, fsynced state file, publisher woken, API write);
- `gpu_removed_to_slice`: GPU hot-removed -> its device is gone from the ResourceSlice (the rescan
  period dominates); `gpu_added_to_slice`: added back -> published again;
- `fatal_xid_to_pod_evicted`: XID 48 on a GPU a running pod uses -> the pod is gone
  (NoExecute taint, kube-controller-manager's device taint eviction, the kubelet stand-in
  confirming the deletion);
- `over_cap_to_kill`: a tenant without the hook allocates 3 GiB on a 1 GiB claim -> it is dead,
  with the enforcer's run loop at its default period (`DEFAULT_PERIOD_S`) in a fresh interpreter
  on the simulated node, as the plugin's `enforcement` thread runs it.
Target (issue 14): GPU removed -> slice updated within 5 s. Writes bench/results/health.json.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import machine, utc_stamp, write_results
from dra_driver import kube
from dra_driver.kube import RESOURCE_API

RESULTS = Path(__file__).parent / "results" / "health.json"
ROOT = Path(__file__).resolve().parents[1]
DRIVER = "vgpu.dra.dev"
SAMPLES = 8
POLL_S = 0.02
TARGETS = {"gpu_removed_to_slice_max_s": 5.0}

TENANT = """
import ctypes, time
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
print("ready", flush=True)
input()
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(3 << 30)) == 0
time.sleep(120)
"""

ENFORCER = """
import sys, threading
from dra_driver.nvml import PyNvml, session
from kubelet_plugin.enforcement import Enforcer, NvmlProcesses
from kubelet_plugin.plan import ClaimPlan

plans = [ClaimPlan.model_validate_json(line) for line in sys.argv[1].splitlines()]
with session(PyNvml()) as nvml:
    Enforcer(sys.argv[2], lambda: {p.uid: p for p in plans}, NvmlProcesses(nvml), []).run(
        threading.Event()
    )
"""


INJECTOR = """
import ctypes, sys, time
lib = ctypes.CDLL("libnvidia-ml.so.1")
for line in sys.stdin:
    kind, gpu, value = line.split()
    call = lib.vgpusim_inject_xid if kind == "xid" else lib.vgpusim_set_removed
    rc = call(int(gpu), int(value))
    print(rc, time.monotonic(), flush=True)
"""


class Injector:
    """Faults injected through the simulator's own C entry points in a long-lived child, which
    reports the CLOCK_MONOTONIC instant each call returned (shared by all processes), so a clock
    can start exactly when the fault exists rather than around a CLI's start-up."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", INJECTOR],
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __call__(self, kind: str, gpu: int, value: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{kind} {gpu} {value}\n")
        self.proc.stdin.flush()
        rc, at = self.proc.stdout.readline().split()
        if rc != "0":
            raise RuntimeError(f"vgpusim {kind} returned {rc}")
        return float(at)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def stats(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_s": round(statistics.median(ordered), 3),
        "max_s": round(ordered[-1], 3),
        "min_s": round(ordered[0], 3),
        "mean_s": round(statistics.fmean(ordered), 3),
    }


def timed(action: Callable[[], float], done: Callable[[], bool], timeout: float = 60.0) -> float:
    """Seconds from the instant `action` returns (when the fault took effect) until `done()`."""
    started = action()
    while not done():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{getattr(done, '__name__', done)} not reached")
        time.sleep(POLL_S)
    return time.monotonic() - started


def devices(client: kube.KubeClient, node: str) -> dict[str, dict[str, Any]]:
    objs = client.list(
        kube.path(RESOURCE_API, "resourceslices"),
        field_selector=f"spec.driver={DRIVER},spec.nodeName={node}",
    )
    return {
        d["attributes"]["uuid"]["string"]: d for o in objs for d in o["spec"].get("devices") or []
    }


def slice_figures(client: kube.KubeClient, inject: Injector, node: str) -> dict[str, Any]:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    gpus = fakegpu.load_profile("a10-pcie").gpus
    deadline = time.monotonic() + 60
    while len(devices(client, node)) != len(gpus):
        if time.monotonic() > deadline:
            raise TimeoutError("the node's slices never appeared")
        time.sleep(0.2)
    taint_s: list[float] = []
    removed_s: list[float] = []
    added_s: list[float] = []
    for n in range(SAMPLES):
        gpu = n % len(gpus)
        uuid_ = gpus[gpu].uuid

        def tainted(u: str = uuid_) -> bool:
            return bool(devices(client, node).get(u, {}).get("taints"))

        def published(u: str = uuid_) -> bool:
            return u in devices(client, node)

        taint_s.append(timed(partial(inject, "xid", gpu, 94), tainted))
        timed(time.monotonic, lambda: not tainted())  # the 1 s quiet period lifts it
        removed_s.append(timed(partial(inject, "removed", gpu, 1), lambda: not published()))
        added_s.append(timed(partial(inject, "removed", gpu, 0), published))
    return {
        "xid_to_taint": stats(taint_s),
        "gpu_removed_to_slice": stats(removed_s),
        "gpu_added_to_slice": stats(added_s),
    }


def eviction_figures(client: kube.KubeClient, inject: Injector, node: str) -> dict[str, Any]:
    """A fatal XID on a GPU in use -> its pod is gone (NoExecute, device taint eviction)."""
    import yaml

    from tests.fixtures.workloads import gpu_pod, running_pod
    from vgpu_testbed.fakegpu import simulator as fakegpu

    device_class = yaml.safe_load((ROOT / "deploy" / "deviceclass.yaml").read_text())
    client.create(kube.path(RESOURCE_API, "deviceclasses"), device_class)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    client.create(
        kube.path("v1", "namespaces"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    gpus = fakegpu.load_profile("a10-pcie").gpus
    samples = []
    for n, gpu in enumerate(gpus):
        name = f"victim-{n}"
        deadline = time.monotonic() + 60
        while True:  # the namespace's default ServiceAccount appears asynchronously
            try:
                gpu_pod(client, namespace, name, uuid=gpu.uuid, memory="1Gi")
                break
            except kube.KubeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        running_pod(client, namespace, name)

        def gone(pod: str = name) -> bool:
            try:
                client.get(kube.path("v1", "pods", pod, namespace=namespace))
            except kube.NotFound:
                return True
            return False

        samples.append(timed(partial(inject, "xid", n, 48), gone))

        # Re-enumeration lifts the fatal taint (and frees nothing else of this node).
        def absent(u: str = gpu.uuid) -> bool:
            return u not in devices(client, node)

        def clean(u: str = gpu.uuid) -> bool:
            device = devices(client, node).get(u)
            return device is not None and not device.get("taints")

        timed(partial(inject, "removed", n, 1), absent)
        timed(partial(inject, "removed", n, 0), clean)
    return {"fatal_xid_to_pod_evicted": stats(samples)}


def kill_figures(env: dict[str, str], root: Path) -> dict[str, Any]:
    """Over-cap -> kill with the enforcer's own run loop (default period) in a child."""
    from tests.fixtures.tenants import claim_dir_spec, claim_plan
    from vgpu_testbed.container import container_command
    from vgpu_testbed.fakegpu import simulator as fakegpu

    gpu_uuid = fakegpu.load_profile("a10-pcie").gpus[0].uuid
    state = root / "enforce-state"
    samples = []
    for _ in range(SAMPLES):
        uid = str(uuid.uuid4())
        (state / "claims" / uid).mkdir(parents=True)
        plan = claim_plan(uid, gpu_uuid, 1 << 30)
        spec = claim_dir_spec(state / "claims" / uid, uid)
        child_env = {**os.environ, **env}
        enforcer = subprocess.Popen(
            [sys.executable, "-c", ENFORCER, json.dumps(plan), str(state)], env=child_env, cwd=ROOT
        )
        tenant = subprocess.Popen(
            container_command(spec, ["gpu"], [sys.executable, "-c", TENANT]),
            env=child_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert tenant.stdout is not None and tenant.stdin is not None
            assert tenant.stdout.readline().strip() == "ready"
            started = time.monotonic()
            tenant.stdin.write("\n")
            tenant.stdin.flush()
            tenant.wait(timeout=60)
            samples.append(time.monotonic() - started)
        finally:
            for proc in (tenant, enforcer):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return {"over_cap_to_kill": stats(samples)}


def main() -> None:
    from vgpu_testbed.cluster.control_plane import Cluster
    from vgpu_testbed.standin.node_agents import start_node_agents

    root = Path(tempfile.mkdtemp(prefix="vgpu-bench-health-"))
    cluster = Cluster.start(root / "cluster", ("a10-pcie",), die_with_parent=True)
    client = kube.KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        node = cluster.nodes[0].name
        agents = start_node_agents(
            cluster, [node], plugin_args=["--xid-quiet-seconds", "1", "--no-governor"]
        )[node]
        try:
            inject = Injector(agents.gpu_env)
            try:
                figures = slice_figures(client, inject, node)
                figures.update(eviction_figures(client, inject, node))
            finally:
                inject.close()
            figures.update(kill_figures(agents.gpu_env, root))
        finally:
            agents.stop()
    finally:
        client.close()
        keep = os.environ.get("VGPU_BENCH_KEEP") is not None  # keep logs to debug a failure
        cluster.stop(keep_logs=keep)
        if keep:
            print("kept", root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    document = {
        "benchmark": "health",
        "when": utc_stamp(),
        "machine": machine(),
        "targets": TARGETS,
        "met": {
            "gpu_removed_to_slice_max_s": figures["gpu_removed_to_slice"]["max_s"]
            <= TARGETS["gpu_removed_to_slice_max_s"]
        },
        "figures": figures,
    }
    write_results(RESULTS, document)


if __name__ == "__main__":
    main()
