"""NodePrepareResources of the kubelet plugin against a floor: the upstream helper's way.

Setup: one real control plane (vgpu_testbed.cluster.control_plane) and two kubelet plugin
processes on one machine, driven by one client (this process, the kubelet's part: our gRPC v1
stubs over each plugin's unix socket, a 45 s deadline per call as the kubelet sets):
- `ours`: `vgpu-dra kubelet-plugin` on a simulated 8x H100 node (`dgx-h100`), with its defaults
  (governor, enforcement, health, the hot-plug check, Events) except `--no-publish-slices`;
- `floor`: hack/prepare-floor (Go, k8s.io/dynamic-resource-allocation v0.37.1's kubelet-plugin
  helper; built on first use by hack/prepare-floor/build.sh): one claim GET, a CDI spec through
  the CDI reference library and a fsynced checkpoint per prepare, as the helper's users write
  them; API client QPS 1,000.
Both read the same claims (created and allocated in the API server beforehand: 256 MiB and 3 %
of one of 8 GPUs each).

Measured, with the two plugins interleaved so that both see the same machine:
- `single` (RUNS runs of CYCLES claims): per claim, a prepare+unprepare cycle on one plugin,
  then the same claim on the other (which plugin goes first rotates per run). Per run and plugin:
  prepare latency p50/p99 (end to end, as the client sees it), unprepare p50, CPU per cycle
  (utime+stime of the process and its reaped children, from /proc/<pid>/stat, over the run:
  background threads and the hot-plug rescan count too) and the ratios ours/floor;
- `batch` (BATCHES x BATCH claims in one call each, rotating which plugin goes first):
  prepare and unprepare wall time, CPU;
- `batch_256`: one call of 256 claims per plugin, and the "Connection pool is full" warnings our
  plugin logged meanwhile (the API client's pool must match --workers);
- `syncs_per_cycle`: fsync/fdatasync calls per cycle of each plugin (strace, 10 cycles);
- `claim_get_from_bench`: this process's own GET of a claim (context: the API server's part).
Targets (issue 32): in every run p50 and p99 ratio <= 1.0, CPU per cycle ratio <= 1.0; batch
figures no worse than before (0.519 s prepare, 0.053 s unprepare for 128 claims on 2026-11-28);
no pool warnings. Writes bench/results/prepare.json with the load average before and after
(figures from a loaded machine are not comparable); `PREPARE_BENCH_RUNS`,
`PREPARE_BENCH_CYCLES` shorten a development run. `PREPARE_BENCH_BASELINE=<source tree>` adds
an earlier version as a third plugin, `baseline`, interleaved with the other two, with its own
ratios to the floor (before/after under the same conditions).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.common import machine, percentiles, request, utc_stamp, write_results
from dra_driver import kube
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tests.fixtures.claimdata import DRIVER, HOOK_LIB, NODE, create_allocated_claim, result

RESULTS = Path(__file__).parent / "results" / "prepare.json"
ROOT = Path(__file__).resolve().parents[1]
RUNS = int(os.environ.get("PREPARE_BENCH_RUNS", "6"))
CYCLES = int(os.environ.get("PREPARE_BENCH_CYCLES", "300"))
# A source tree of an earlier version (e.g. `git archive <rev> | tar -x -C <dir>` plus its built
# extension): run as a third plugin, `baseline`, interleaved with the other two (before/after).
BASELINE = os.environ.get("PREPARE_BENCH_BASELINE", "")
WARMUP = 20
BATCHES = 5
BATCH = 128
BIG_BATCH = 256
GPUS = 8
PROFILE = "dgx-h100"
DEADLINE_S = 45.0  # the kubelet's per-call timeout for DRA plugins
POOL_FULL = "Connection pool is full"
TARGETS = {
    "single_p50_ratio_max": 1.0,
    "single_p99_ratio_max": 1.0,
    "cpu_per_cycle_ratio_max": 1.0,
    "batch_prepare_s_max": 0.519,
    "batch_unprepare_s_max": 0.053,
    "pool_full_warnings_max": 0,
}
CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass
class Plugin:
    """One plugin process and the client's channel to its DRA socket."""

    name: str
    argv: list[str]
    socket: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = ROOT
    proc: subprocess.Popen[bytes] | None = None
    channel: grpc.Channel | None = None
    stub: Any = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log()[-3000:]
                raise RuntimeError(f"{self.name} did not serve {self.socket}:\n{tail}")
            time.sleep(0.1)
        self.channel = grpc.insecure_channel(f"unix://{self.socket}")
        self.stub = dra_v1_pb2_grpc.DRAPluginStub(self.channel)

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cpu_s(self) -> float:
        """utime + stime of the process and of its children it waited for (the rescan's)."""
        text = Path(f"/proc/{self.pid}/stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        # fields[0] is the state (field 3 of proc(5)): utime, stime, cutime, cstime are 14-17.
        return sum(int(fields[n - 3]) for n in (14, 15, 16, 17)) * CLOCK_TICK_S

    def prepare(self, refs: Sequence[ClaimRef]) -> float:
        started = time.perf_counter()
        response = self.stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=request(refs)), timeout=DEADLINE_S
        )
        elapsed = time.perf_counter() - started
        errors = [c.error for c in response.claims.values() if c.error]
        if errors or len(response.claims) != len(refs):
            raise RuntimeError(f"{self.name}: prepare failed: {errors[:3]}")
        return elapsed

    def unprepare(self, refs: Sequence[ClaimRef]) -> float:
        started = time.perf_counter()
        response = self.stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=request(refs)), timeout=DEADLINE_S
        )
        elapsed = time.perf_counter() - started
        errors = [c.error for c in response.claims.values() if c.error]
        if errors:
            raise RuntimeError(f"{self.name}: unprepare failed: {errors[:3]}")
        return elapsed


def ours(root: Path, kubeconfig: Path, *, name: str = "ours", tree: Path = ROOT) -> Plugin:
    """`vgpu-dra kubelet-plugin` on a simulated dgx-h100 node, defaults but for slices; `tree`:
    the source tree it runs from (another one for a before/after comparison)."""
    from tests.fixtures.simulated import simulated_node_env

    base = root / name
    plugin_dir = base / "plugins"
    env = simulated_node_env(base / "gpus", PROFILE)
    if tree != ROOT:
        env["PYTHONPATH"] = str(tree)
    return Plugin(
        name=name,
        argv=[
            *(sys.executable, "-m", "dra_driver.cli", "kubelet-plugin"),
            *(f"--node-name={NODE}", f"--kubeconfig={kubeconfig}"),
            *(f"--plugin-dir={plugin_dir}", f"--registrar-dir={base}/registry"),
            *(f"--cdi-root={base}/cdi", f"--state-dir={base}/state", f"--hook-path={HOOK_LIB}"),
            "--no-publish-slices",
        ],
        socket=plugin_dir / "dra.sock",
        log_path=base / "plugin.log",
        env=env,
        cwd=tree,
    )


def floor(root: Path, kubeconfig: Path) -> Plugin:
    base = root / "floor"
    plugin_dir = base / "plugins"
    return Plugin(
        name="floor",
        argv=[
            *(floor_binary(), f"-kubeconfig={kubeconfig}", f"-node-name={NODE}"),
            *(f"-driver-name={DRIVER}", f"-plugin-dir={plugin_dir}"),
            *(f"-registrar-dir={base}/registry", f"-cdi-root={base}/cdi"),
            *(f"-state-dir={base}/state", f"-devices={GPUS}"),
        ],
        socket=plugin_dir / "dra.sock",
        log_path=base / "plugin.log",
    )


def floor_binary() -> str:
    """hack/prepare-floor's binary (built on first use; its build.sh caches it)."""
    script = ROOT / "hack" / "prepare-floor" / "build.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"hack/prepare-floor/build.sh failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def create_claims(client: kube.KubeClient, namespace: str, count: int) -> list[ClaimRef]:
    # 8 GPUs x 80 GiB: 256 claims of 256 MiB / 3 cores each fit (32 per GPU)
    return [
        create_allocated_claim(
            client,
            namespace,
            [result(f"gpu-{i % GPUS}", memory="256Mi", cores=3, share_id=str(uuid.uuid4()))],
        )
        for i in range(count)
    ]


def single_run(plugins: Sequence[Plugin], refs: Sequence[ClaimRef]) -> dict[str, Any]:
    """One run: every claim through a cycle on each plugin in turn, in `plugins` order."""
    prepare_s: dict[str, list[float]] = {p.name: [] for p in plugins}
    unprepare_s: dict[str, list[float]] = {p.name: [] for p in plugins}
    cpu_before = {p.name: p.cpu_s() for p in plugins}
    started = time.perf_counter()
    for ref in refs:
        for plugin in plugins:
            prepare_s[plugin.name].append(plugin.prepare([ref]))
            unprepare_s[plugin.name].append(plugin.unprepare([ref]))
    wall = time.perf_counter() - started
    figures: dict[str, Any] = {"first": plugins[0].name, "wall_s": round(wall, 3)}
    for plugin in plugins:
        cpu = plugin.cpu_s() - cpu_before[plugin.name]
        figures[plugin.name] = {
            "prepare": percentiles(prepare_s[plugin.name]),
            "unprepare": percentiles(unprepare_s[plugin.name]),
            "cpu_per_cycle_ms": round(cpu / len(refs) * 1e3, 3),
        }
    for name, key in (("ours", "ratio"), ("baseline", "baseline_ratio")):
        if name in figures:
            figures[key] = ratios(figures[name], figures["floor"])
    return figures


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """a's figures over b's (latency p50 and p99, unprepare p50, CPU per cycle)."""
    return {
        "p50": round(a["prepare"]["p50_ms"] / b["prepare"]["p50_ms"], 3),
        "p99": round(a["prepare"]["p99_ms"] / b["prepare"]["p99_ms"], 3),
        "unprepare_p50": round(a["unprepare"]["p50_ms"] / b["unprepare"]["p50_ms"], 3),
        "cpu_per_cycle": round(a["cpu_per_cycle_ms"] / b["cpu_per_cycle_ms"], 3),
    }


def batch_round(plugin: Plugin, refs: Sequence[ClaimRef]) -> dict[str, float]:
    cpu = plugin.cpu_s()
    prepare = plugin.prepare(refs)
    unprepare = plugin.unprepare(refs)
    return {
        "prepare_s": round(prepare, 3),
        "unprepare_s": round(unprepare, 3),
        "cpu_s": round(plugin.cpu_s() - cpu, 3),
    }


def count_syncs(plugin: Plugin, refs: Sequence[ClaimRef]) -> float | None:
    """fsync/fdatasync calls per prepare+unprepare cycle of `plugin`, counted by strace (None
    without strace or ptrace rights)."""
    if shutil.which("strace") is None:
        return None
    out = plugin.log_path.with_name("strace.txt")
    tracer = subprocess.Popen(
        [
            *("strace", "-f", "-qq", "-e", "trace=fsync,fdatasync"),
            "-o",
            str(out),
            "-p",
            str(plugin.pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)  # attached to every thread
        for ref in refs:
            plugin.prepare([ref])
            plugin.unprepare([ref])
        time.sleep(0.2)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
    if not out.exists():
        return None
    calls = sum(1 for line in out.read_text().splitlines() if re.search(r"\bf(data)?sync\(", line))
    return calls / len(refs)


def measure_get(client: kube.KubeClient, refs: Sequence[ClaimRef]) -> dict[str, float]:
    get_s: list[float] = []
    for ref in refs:
        started = time.perf_counter()
        path = kube.path(kube.RESOURCE_API, "resourceclaims", ref.name, namespace=ref.namespace)
        client.get(path)
        get_s.append(time.perf_counter() - started)
    return percentiles(get_s)


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def series(get: Callable[[dict[str, Any]], float]) -> dict[str, Any]:
        values = [get(run) for run in runs]
        return {
            "runs": values,
            "min": min(values),
            "median": round(statistics.median(values), 3),
            "max": max(values),
        }

    out: dict[str, Any] = {}
    names = [n for n in ("ours", "floor", "baseline") if n in runs[0]]
    for name in names:
        out[f"{name}_p50_ms"] = series(lambda r, n=name: r[n]["prepare"]["p50_ms"])
        out[f"{name}_p99_ms"] = series(lambda r, n=name: r[n]["prepare"]["p99_ms"])
        out[f"{name}_unprepare_p50_ms"] = series(lambda r, n=name: r[n]["unprepare"]["p50_ms"])
        out[f"{name}_cpu_per_cycle_ms"] = series(lambda r, n=name: r[n]["cpu_per_cycle_ms"])
    for key, prefix in (("ratio", ""), ("baseline_ratio", "baseline_")):
        if key in runs[0]:
            out[f"{prefix}p50_ratio"] = series(lambda r, k=key: r[k]["p50"])
            out[f"{prefix}p99_ratio"] = series(lambda r, k=key: r[k]["p99"])
            out[f"{prefix}unprepare_p50_ratio"] = series(lambda r, k=key: r[k]["unprepare_p50"])
            out[f"{prefix}cpu_per_cycle_ratio"] = series(lambda r, k=key: r[k]["cpu_per_cycle"])
    return out


def batch_summary(rounds: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    mine = [r[name] for r in rounds]
    return {
        key: {
            "runs": [r[key] for r in mine],
            "median": round(statistics.median(r[key] for r in mine), 3),
        }
        for key in ("prepare_s", "unprepare_s", "cpu_s")
    }


@contextmanager
def running(plugins: Sequence[Plugin]) -> Iterator[None]:
    with ExitStack() as stack:
        for plugin in plugins:
            stack.callback(plugin.stop)
            plugin.start()
        yield


def main() -> None:
    from vgpu_testbed.cluster.control_plane import Cluster

    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="vgpu-bench-"))
    cluster = Cluster.start(root / "cluster", (PROFILE,), die_with_parent=True)
    client = kube.KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    loads: list[list[float]] = []
    try:
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        client.create(
            kube.path("v1", "namespaces"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
        refs = create_claims(client, namespace, CYCLES)
        batch_refs = create_claims(client, namespace, BIG_BATCH)
        plugins = [ours(root, cluster.kubeconfig), floor(root, cluster.kubeconfig)]
        if BASELINE:
            plugins.append(ours(root, cluster.kubeconfig, name="baseline", tree=Path(BASELINE)))
        with running(plugins):
            for plugin in plugins:  # connections, imports, page cache
                for ref in refs[:WARMUP]:
                    plugin.prepare([ref])
                    plugin.unprepare([ref])
            runs = []
            for n in range(RUNS):
                loads.append([round(x, 2) for x in os.getloadavg()])
                order = plugins[n % len(plugins) :] + plugins[: n % len(plugins)]
                runs.append(single_run(order, refs))
                print(f"run {n}: {runs[-1]['ratio']}", file=sys.stderr, flush=True)
            batches = []
            for n in range(BATCHES):
                order = plugins[n % len(plugins) :] + plugins[: n % len(plugins)]
                batches.append({p.name: batch_round(p, batch_refs[:BATCH]) for p in order})
            warnings_before = {p.name: p.log().count(POOL_FULL) for p in plugins}
            big = {p.name: batch_round(p, batch_refs) for p in plugins}
            pool_full = {
                p.name: p.log().count(POOL_FULL) - warnings_before[p.name] for p in plugins
            }
            syncs = {p.name: count_syncs(p, refs[:10]) for p in plugins}
            get = measure_get(client, refs)
    finally:
        client.close()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    single = summary(runs)
    batch = {p.name: batch_summary(batches, p.name) for p in plugins}
    document = {
        "benchmark": "prepare",
        "when": utc_stamp(),
        "machine": {
            **machine(),
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_1m_before_each_run": [x[0] for x in loads],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "setup": {
            "runs": RUNS,
            "cycles_per_run": CYCLES,
            "batches": BATCHES,
            "batch_claims": BATCH,
            "ours": "vgpu-dra kubelet-plugin on a simulated dgx-h100, --no-publish-slices",
            "floor": "hack/prepare-floor (k8s.io/dynamic-resource-allocation v0.37.1), QPS 1000",
            "baseline": BASELINE or None,
        },
        "targets": TARGETS,
        "met": {
            "single_p50_ratio_max": single["p50_ratio"]["max"] <= TARGETS["single_p50_ratio_max"],
            "single_p99_ratio_max": single["p99_ratio"]["max"] <= TARGETS["single_p99_ratio_max"],
            "cpu_per_cycle_ratio_max": single["cpu_per_cycle_ratio"]["max"]
            <= TARGETS["cpu_per_cycle_ratio_max"],
            "batch_prepare_s_max": batch["ours"]["prepare_s"]["median"]
            <= TARGETS["batch_prepare_s_max"],
            "batch_unprepare_s_max": batch["ours"]["unprepare_s"]["median"]
            <= TARGETS["batch_unprepare_s_max"],
            "pool_full_warnings_max": pool_full["ours"] <= TARGETS["pool_full_warnings_max"],
        },
        "single": single,
        "batch": batch,
        "batch_256": {**big, "pool_full_warnings": pool_full},
        "syncs_per_cycle": syncs,
        "claim_get_from_bench": get,
        "runs": runs,
        "batches": batches,
    }
    write_results(RESULTS, document)


if __name__ == "__main__":
    main()
