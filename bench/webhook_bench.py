"""Admission latency of the webhook under 200 concurrent pod creations through the real API server.

Setup: a fresh control plane; one `vgpu-dra controller` process serving the webhook on loopback
(self-managed certificates, admin credentials: RBAC does not change latency); the chart's webhook
configurations registered with the bed's API server (`vgpu_testbed.cluster.webhook`), limited to
the benchmark's namespace. Each round, 200 threads each create one vgpu-manager pod at once
(vgpu-number 1, vgpu-cores 10, vgpu-memory 1024: translated, one shared template ensured);
`ROUNDS` rounds after a warm-up round.

Measured:
- `webhook`: inside the webhook, from reading an AdmissionReview to writing its answer, per
  admission, from the controller's structured admission log (exact) and from its own histogram
  `vgpu_dra_webhook_admission_duration_seconds` (bucket bounds);
- `apiserver`: the API server's own `apiserver_admission_webhook_admission_duration_seconds` for
  the mutating webhook (its buckets are coarse: 5 ms, 25 ms, 100 ms, ...; the figure is the
  upper bound of the bucket holding the percentile), which adds TLS, connection handling and
  the network round trip;
- `client`: a pod create as the creating thread sees it (the whole API request).
Both ways of serving are measured on the same control plane, alternating, PASSES times each:
`--webhook-process inline` (the controller's own threads, sharing the GIL with its informers,
which decode every one of these pod creations) and `child` (the default: `vgpu-dra webhook` as
the controller's child process). Each pass starts its own controller and uses a fresh namespace.

Two CPU placements (`CONFIGS`), alternating with the ways above:
- `shared`: everything (API server, etcd, the 200 creating threads, the webhook, and whatever
  else runs on the machine) on both CPUs: the honest worst case of a 2-CPU bed.
- `own-cpu` (a MODEL of production placement, where the webhook runs on its own node's CPUs and
  not on the API server's): a cgroup v1 cpuset puts the webhook's process (and its child) on CPU
  1 and the control plane and this benchmark's threads on CPU 0. Other processes of the machine
  are not moved: they still share both CPUs. Needs root and the cpuset controller; skipped
  (with a note) otherwise.
Target (issue 11): p99 <= 10 ms inside the webhook. Writes bench/results/webhook.json (`figures`:
the last `child` pass of `shared`; `by_config`: every pass with its load average), with the
headline figures of the last twenty passes under `runs`.
After those passes, one more `child` pass per placement runs the webhook with
`--webhook-phase-timing` (`diagnosis`: where the admissions' time went, phase by phase, and on
CPU / in the CPU queue / asleep, controller/webhook/phases.py); the timing costs ~0.05 ms per
admission, so the headline figures come from the passes without it
(VGPU_BENCH_WEBHOOK_PHASES=0 skips the diagnosis).
Transports (`TRANSPORTS`, --webhook-transport: a thread per connection or one asyncio event
loop) are a second dimension of the ways: `child` is threads, `child-asyncio` the event loop.
VGPU_BENCH_WEBHOOK_TIMED=1 phase-times every pass (each pass's figures then carry `phases`, with
`total_ms` from the request line: a clock that starts later than the API server's cannot pass
for an improvement when read next to the API server's histogram) instead of a diagnosis pass.
VGPU_BENCH_WEBHOOK_CONFIGS, _MODES, _TRANSPORTS and _PASSES narrow a run (comma lists, a number).
VGPU_BENCH_WEBHOOK_CONCURRENCY (default 200) sets the pod creations per round.
VGPU_BENCH_WEBHOOK_BASELINE=<a source tree> (e.g. `git archive` of an earlier commit) adds to
each of our ways a twin, `<way>@baseline`, whose controller runs that tree's code, alternating
with the others: an A/B of a change on the same control plane.

The floor (`go-noop`, a third transport, one way): hack/noop-webhook, a Go webhook that answers
every admission "allowed" with no patch (standard library, built on first use into the cache
like the other Go tools), serving HTTP/1.1 only on the same port with a certificate of the
bench's own (published into both configurations for its pass), measured exactly as the others:
the API server's histogram for the same webhook name and the clients' p99. What the API server
reports for it is what this machine costs a webhook that costs nothing; `floor_ratios` divides
each way's median p99 (over its passes) by the floor's. `protocol` in each pass: for the floor,
the ALPN protocols the API server offered at each handshake and the HTTP version of each
admission it sent (the bed registers the webhook by a loopback URL, for which the API server
offers h2: serving h2 would not be representative of a webhook behind a Service, which the API
server speaks HTTP/1.1 to); for ours, what the webhook selects when a client offers h2 (none:
HTTP/1.1).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import percentiles, utc_stamp, write_results
from dra_driver import kube

RESULTS = Path(__file__).parent / "results" / "webhook.json"
CONCURRENCY = int(os.environ.get("VGPU_BENCH_WEBHOOK_CONCURRENCY", "200"))  # pod creations at once
ROUNDS = 3
MODES = ("inline", "child")  # --webhook-process: the controller's threads, or its own process
# --webhook-transport: a thread per connection, or one event loop. A way is a mode and a
# transport; its key is the mode alone for `threads` (as before the transports), else
# `<mode>-<transport>`.
TRANSPORTS = ("threads", "asyncio", "go-noop")
BASELINE_SUFFIX = "@baseline"  # VGPU_BENCH_WEBHOOK_BASELINE: a way served by another tree
FLOOR = "go-noop"  # the floor's way (and transport): one way, whatever the modes
CONFIGS = ("shared", "own-cpu")  # CPU placement, see above
PASSES = 3  # per way and placement, alternating
CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")
WEBHOOK_CPU, CONTROL_PLANE_CPU = "1", "0"  # own-cpu placement
TARGETS = {"webhook_p99_ms": 10.0}
LABEL = "vgpu-dra.bench/webhook"
HOOK_NAME = "legacy-pods.vgpu.dra.dev"
MUTATE_PATH = "/mutate-pods"
SECRET = "vgpu-dra-webhook-tls"  # the controller's certificates (self-managed mode)
_ADMISSION = re.compile(r'msg="admission mutate Pod [^"]*: (\w+) in ([\d.]+) ms"(.*)')
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def legacy_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {
                        "limits": {
                            "nvidia.com/vgpu-number": "1",
                            "nvidia.com/vgpu-cores": "10",
                            "nvidia.com/vgpu-memory": "1024",
                        }
                    },
                }
            ]
        },
    }


def histogram(text: str, metric: str, labels: dict[str, str]) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a Prometheus histogram's buckets matching labels."""
    buckets = []
    for line in text.splitlines():
        if not line.startswith(metric + "_bucket{"):
            continue
        label_text, value = line[len(metric) + 8 :].rsplit("} ", 1)
        found = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        if all(found.get(k) == v for k, v in labels.items()):
            le = found["le"]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(value)))
    merged: dict[float, float] = {}
    for le, count in buckets:  # several label sets (e.g. rejected) add up
        merged[le] = merged.get(le, 0.0) + count
    return sorted(merged.items())


def bucket_quantile(after: list[tuple[float, float]], before: list[tuple[float, float]],
                    q: float) -> float | None:  # fmt: skip
    """Upper bound (ms) of the bucket holding quantile q of the observations between the two
    scrapes."""
    start = dict(before)
    counts = [(le, n - start.get(le, 0.0)) for le, n in after]
    if not counts or counts[-1][1] <= 0:
        return None
    total = counts[-1][1]
    for le, n in counts:
        if n >= q * total:
            return round(le * 1e3, 3)
    return None


def bucket_shares(
    after: list[tuple[float, float]], before: list[tuple[float, float]]
) -> dict[str, float]:
    """Share of the observations between the two scrapes at or below each bucket's upper bound
    (ms; exact, unlike a quantile read off coarse buckets), up to the first bucket holding all."""
    start = dict(before)
    counts = [(le, n - start.get(le, 0.0)) for le, n in after]
    if not counts or counts[-1][1] <= 0:
        return {}
    total = counts[-1][1]
    shares: dict[str, float] = {}
    for le, n in counts:
        shares["inf" if le == float("inf") else f"{le * 1e3:g}"] = round(n / total, 4)
        if n >= total:
            break
    return shares


def main() -> None:
    from vgpu_testbed.cluster.control_plane import Cluster
    from vgpu_testbed.cluster.flags import free_ports
    from vgpu_testbed.cluster.webhook import register_webhooks

    configs = _env_list("VGPU_BENCH_WEBHOOK_CONFIGS", CONFIGS)
    modes = _env_list("VGPU_BENCH_WEBHOOK_MODES", MODES)
    transports = _env_list("VGPU_BENCH_WEBHOOK_TRANSPORTS", TRANSPORTS)
    ways = [m if t == "threads" else f"{m}-{t}" for m in modes for t in transports if t != FLOOR]
    baseline = os.environ.get("VGPU_BENCH_WEBHOOK_BASELINE")
    if baseline:  # an A/B of a change: each of our ways also served from the baseline tree
        ways = [w for way in ways for w in (way, f"{way}{BASELINE_SUFFIX}")]
    ways += [FLOOR] if FLOOR in transports else []
    timed = os.environ.get("VGPU_BENCH_WEBHOOK_TIMED") == "1"
    passes = int(os.environ.get("VGPU_BENCH_WEBHOOK_PASSES", PASSES))
    diagnose = os.environ.get("VGPU_BENCH_WEBHOOK_PHASES", "1") != "0"
    notes: list[str] = []
    cpusets: Cpusets | None = None
    if "own-cpu" in configs:
        try:
            cpusets = Cpusets.create()
        except OSError as exc:
            notes.append(f"own-cpu skipped: no cpuset ({exc})")
            configs = [c for c in configs if c != "own-cpu"]
    root = Path(tempfile.mkdtemp(prefix="vgpu-bench-webhook-"))
    cluster = Cluster.start(root / "cluster", ("a10-pcie",), die_with_parent=True)
    client = _client(cluster.kubeconfig)
    try:
        system_ns = "vgpu-dra-system"
        _namespace(client, system_ns, {})
        (port,) = free_ports(1)
        values = {"webhook": {"namespaceSelector": {"matchLabels": {LABEL: "on"}}}}
        hooks = register_webhooks(cluster, port, None, namespace=system_ns, values=values)

        def measure(n: int, placement: str, mode: str, timing: bool) -> dict[str, Any]:
            log_path = root / f"controller-{n}-{placement}-{mode}.log"
            if mode == FLOOR:
                return _measure_floor(client, cluster, root / f"floor-{n}", port=port,
                                      config_name=hooks[0]["metadata"]["name"],
                                      publish=lambda ca: register_webhooks(
                                          cluster, port, ca, namespace=system_ns, values=values),
                                      placement=placement, cpusets=cpusets)  # fmt: skip
            return _measure(client, cluster, log_path, mode, port=port, system_ns=system_ns,
                            config_name=hooks[0]["metadata"]["name"], placement=placement,
                            cpusets=cpusets, timing=timing)  # fmt: skip

        by_config, diagnosis = _passes(
            measure, configs, ways, passes=passes, diagnose=diagnose, cpusets=cpusets, timed=timed
        )
    finally:
        if cpusets is not None:
            cpusets.remove()
        client.close()
        keep = os.environ.get("VGPU_BENCH_KEEP") is not None
        cluster.stop(keep_logs=keep)
        if keep:
            print("kept", root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    setup = {
        "concurrency": CONCURRENCY,
        "rounds": ROUNDS,
        "pods": CONCURRENCY * ROUNDS,
        "passes_per_way": passes,
        "configs": configs,
        "modes": modes,
        "transports": transports,
        "baseline_tree": baseline or None,
        "phase_timed_passes": timed,
        "notes": notes,
    }
    document = _document(setup, by_config, diagnosis)
    document["runs"] = _runs(document)
    write_results(RESULTS, document)


def _passes(
    measure: Callable[[int, str, str, bool], dict[str, Any]],
    configs: list[str],
    modes: list[str],
    *,
    passes: int,
    diagnose: bool,
    cpusets: Cpusets | None,
    timed: bool = False,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every pass, alternating placements and ways (rotating their order) so that none always
    runs on the more loaded machine or right after the same other one; then the phase-timed
    diagnosis passes. With `timed`, every pass is phase-timed (its figures carry `phases`) and
    there is no separate diagnosis."""
    by_config: dict[str, dict[str, Any]] = {}
    diagnosis: dict[str, Any] = {}
    # Each pass starts the round one way later: the first way of a round follows the previous
    # round's last (e.g. the floor, whose CA swap gives the API server's webhook client a new
    # connection pool), and no way may always be the one that pays for it.
    runs = [(c, m, timed) for p in range(passes) for c in configs for m in _rotated(modes, p)]
    runs += [(c, "child", True) for c in configs] if diagnose and not timed else []
    for n, (placement, mode, timing) in enumerate(runs):
        if cpusets is not None and placement == "own-cpu":
            cpusets.split()  # the control plane (and this process) on its CPU
        elif cpusets is not None:
            cpusets.join()
        figures = measure(n, placement, mode, timing)
        if timing and not timed:
            diagnosis.setdefault(placement, []).append(figures)
        else:
            by_config.setdefault(placement, {}).setdefault(mode, []).append(figures)
    if cpusets is not None:
        cpusets.join()
    return by_config, diagnosis


def _rotated(items: list[str], by: int) -> list[str]:
    shift = by % len(items) if items else 0
    return items[shift:] + items[:shift]


def _document(
    setup: dict[str, Any], by_config: dict[str, dict[str, Any]], diagnosis: dict[str, Any]
) -> dict[str, Any]:
    headline = by_config.get("shared") or next(iter(by_config.values()))
    child = (headline.get("child") or next(iter(headline.values())))[-1]
    target = TARGETS["webhook_p99_ms"]
    return {
        "benchmark": "webhook",
        "when": utc_stamp(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m": child["load_avg_1m"],
        },
        "setup": setup,
        "targets": TARGETS,
        "met": {"webhook_p99_ms": child["webhook"]["p99_ms"] <= target},
        # Per placement and way: the passes whose p99 met the target, of all passes.
        "met_by_config": {
            placement: {
                mode: f"{sum(f['webhook']['p99_ms'] <= target for f in runs)}/{len(runs)}"
                for mode, runs in by_mode.items()
            }
            for placement, by_mode in by_config.items()
        },
        # The default (the webhook in its own process) on shared CPUs, last pass.
        "figures": {k: v for k, v in child.items() if k != "load_avg_1m"},
        # Each pass per placement and way, in the order they ran: `shared` = all on both CPUs,
        # `own-cpu` = the modelled production placement (a CPU for the webhook); `inline` = the
        # controller's own threads (the old way), `child` = `vgpu-dra webhook` as its child.
        "by_config": by_config,
        # One phase-timed `child` pass per placement (not part of the figures above).
        "diagnosis": diagnosis,
        "floor_ratios": _floor_ratios(by_config),
    }


def _share_within_500ms(figures: dict[str, Any]) -> float | None:
    shares = figures["apiserver"].get("share_within_ms")
    if not shares:
        return None
    return float(shares.get("500", 1.0))  # absent: a smaller bucket already held them all


def _floor_ratios(by_config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per placement and way: its median p99 over its passes divided by the floor's, by the API
    server's histogram (bucket upper bounds: a ratio of 1 means the same bucket) and by the
    clients; and the median share of admissions the API server saw end within 500 ms, divided
    by the floor's (below 1: fewer than with the floor). The medians themselves alongside."""
    measures: dict[str, Callable[[dict[str, Any]], float | None]] = {
        "apiserver_p99_le_ms": lambda f: f["apiserver"]["p99_le_ms"],
        "client_p99_ms": lambda f: f["client"]["p99_ms"],
        "webhook_p99_ms": lambda f: f["webhook"]["p99_ms"],
        # Exact (a count, not a bucket bound): more is better, so its ratio is inverted.
        "apiserver_share_within_500ms": _share_within_500ms,
    }
    ratios: dict[str, Any] = {}
    for placement, by_way in by_config.items():
        floor = by_way.get(FLOOR)
        if not floor:
            continue
        for way, runs in by_way.items():
            entry: dict[str, Any] = {}
            for name, value in measures.items():
                ours = [v for v in map(value, runs) if v is not None]
                base = [v for v in map(value, floor) if v is not None]
                if ours and base:
                    mine, theirs = statistics.median(ours), statistics.median(base)
                    entry[name] = {
                        "median": mine,
                        "floor_median": theirs,
                        "ratio": round(mine / theirs, 2) if theirs else None,
                    }
            ratios.setdefault(placement, {})[way] = entry
    return ratios


def _env_list(name: str, default: tuple[str, ...]) -> list[str]:
    text = os.environ.get(name)
    return [v.strip() for v in text.split(",") if v.strip()] if text else list(default)


class Cpusets:
    """Two cgroup v1 cpusets for the `own-cpu` placement: `hook` (CPU 1) for the webhook's
    process, `plane` (CPU 0) for this process and its other descendants (the control plane)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.hook = base / "hook"
        self.plane = base / "plane"

    @classmethod
    def create(cls) -> Cpusets:
        base = CPUSET_ROOT / f"vgpu-bench-webhook-{os.getpid()}"
        mems = (CPUSET_ROOT / "cpuset.mems").read_text().strip()
        sets = cls(base)
        for path, cpus in ((base, f"{CONTROL_PLANE_CPU},{WEBHOOK_CPU}"),
                           (sets.hook, WEBHOOK_CPU), (sets.plane, CONTROL_PLANE_CPU)):  # fmt: skip
            path.mkdir(exist_ok=True)
            (path / "cpuset.mems").write_text(mems)
            (path / "cpuset.cpus").write_text(cpus)
        return sets

    def split(self) -> None:
        self._move(_descendants(os.getpid()) | {os.getpid()}, self.plane)

    def join(self) -> None:
        self._move(_descendants(os.getpid()) | {os.getpid()}, CPUSET_ROOT)

    def prefix(self) -> list[str]:
        """A command prefix that enters the webhook's cpuset before exec (children inherit)."""
        procs = self.hook / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]

    def remove(self) -> None:
        self.join()
        for path in (self.hook, self.plane, self.base):
            with contextlib.suppress(OSError):
                path.rmdir()

    @staticmethod
    def _move(pids: set[int], cpuset: Path) -> None:
        for pid in sorted(pids):
            with contextlib.suppress(OSError):  # exited meanwhile
                (cpuset / "cgroup.procs").write_text(str(pid))


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _namespace(client: kube.KubeClient, name: str, labels: dict[str, str]) -> None:
    client.create(
        kube.path("v1", "namespaces"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
    )
    _wait(f"the default ServiceAccount of {name}", lambda: _exists(
        client, kube.path("v1", "serviceaccounts", "default", namespace=name)))  # fmt: skip


def _measure(
    client: kube.KubeClient,
    cluster: Any,
    log_path: Path,
    mode: str,
    *,
    port: int,
    system_ns: str,
    config_name: str,
    placement: str,
    cpusets: Cpusets | None,
    timing: bool,
) -> dict[str, Any]:
    """One controller (webhook served `mode`: the process, and `-<transport>` if not threads),
    a warm-up round and ROUNDS measured rounds in a
    fresh tenant namespace, whose pods are deleted afterwards (so passes start alike)."""
    way, suffix, _ = mode.partition(BASELINE_SUFFIX)
    process, _, transport = way.partition("-")
    # The baseline's code: `python -m` imports from the working directory first.
    cwd = os.environ["VGPU_BENCH_WEBHOOK_BASELINE"] if suffix else None
    tenant = f"bench-{way}{'-base' if suffix else ''}-{uuid.uuid4().hex[:6]}"
    _namespace(client, tenant, {LABEL: "on"})
    controller: subprocess.Popen[bytes] | None = None
    try:
        with log_path.open("w") as out:
            prefix = cpusets.prefix() if placement == "own-cpu" and cpusets is not None else []
            controller = subprocess.Popen(
                [*prefix, sys.executable, "-m", "dra_driver.cli", "controller",
                 "--kubeconfig", str(cluster.kubeconfig), "--health-address", "127.0.0.1:0",
                 "--webhook-port", str(port), "--webhook-bind", "127.0.0.1",
                 "--webhook-cert-ips", "127.0.0.1", "--webhook-namespace", system_ns,
                 "--webhook-config-names", config_name, "--webhook-cert-sync", "1s",
                 "--webhook-process", process, "--webhook-transport", transport or "threads",
                 "--webhook-phase-timing", str(timing).lower()],
                stdout=out, stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, cwd=cwd,
            )  # fmt: skip
        _wait("the webhook serving", lambda: "webhook on https://" in log_path.read_text())
        _wait("the caBundle published", lambda: _published(
            client, config_name, _secret_bundle(client, system_ns)))  # fmt: skip
        time.sleep(1.0)  # let the API server's webhook informer see the caBundle
        protocol = {"selected_for_h2_offer": _alpn_selected(
            port, _secret_bundle(client, system_ns) or b"")}  # fmt: skip
        # Connections, the template (a new shape: one create for 200 admissions), caches.
        _, warm_errors = _create_round(client, tenant, "warm", CONCURRENCY)
        warm_lines = len(_admissions(log_path.read_text()))
        metrics_before = _apiserver_metrics(client, cluster.server)
        hook_before = _webhook_metrics(client, system_ns, port)
        client_samples, errors = _measured_rounds(client, tenant)
        metrics_after = _apiserver_metrics(client, cluster.server)
        hook_after = _webhook_metrics(client, system_ns, port)
        load = round(os.getloadavg()[0], 2)
        time.sleep(0.5)  # the last admission lines reach the log
        admissions = _admissions(log_path.read_text())[warm_lines:]
    finally:
        if controller is not None:
            controller.send_signal(signal.SIGTERM)
            controller.wait(timeout=30)
    client.request(
        "DELETE", kube.path("v1", "pods", namespace=tenant), body={"gracePeriodSeconds": 0}
    )
    figures = _figures(
        (metrics_before, metrics_after), (hook_before, hook_after), admissions, client_samples
    )
    figures["client"]["errors"] = errors
    figures["client"]["warm_up_errors"] = warm_errors
    figures["protocol"] = protocol
    if timing:
        figures["phases"] = _phases(admissions)
    print(f"{placement} {mode}: webhook p50 {figures['webhook']['p50_ms']} ms p99 "
          f"{figures['webhook']['p99_ms']} ms, load {load}", flush=True)  # fmt: skip
    return {"load_avg_1m": load, **figures}


def _published(client: kube.KubeClient, name: str, bundle: bytes | None) -> bool:
    """Both configurations trust `bundle` (the serving webhook's CA; a previous pass may have
    left another one there)."""
    import base64

    if not bundle:
        return False
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        config = client.get(kube.path("admissionregistration.k8s.io/v1", plural, name))
        for hook in config.get("webhooks") or []:
            published = hook.get("clientConfig", {}).get("caBundle") or ""
            if base64.b64decode(published) != bundle:
                return False
    return True


def _secret_bundle(client: kube.KubeClient, namespace: str) -> bytes | None:
    """The CA bundle the controller keeps in its Secret (None before it wrote one)."""
    import base64

    try:
        secret = client.get(kube.path("v1", "secrets", SECRET, namespace=namespace))
    except kube.NotFound:
        return None
    text = (secret.get("data") or {}).get("ca-bundle.crt")
    return base64.b64decode(text) if text else None


def _alpn_selected(port: int, bundle: bytes) -> str:
    """What the webhook selects when a client offers h2 and HTTP/1.1 (as the API server does
    for a loopback URL): an ALPN name, or "none (HTTP/1.1)"."""
    import ssl

    context = ssl.create_default_context(cadata=bundle.decode())
    context.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        return tls.selected_alpn_protocol() or "none (HTTP/1.1)"


def _measure_floor(
    client: kube.KubeClient,
    cluster: Any,
    workdir: Path,
    *,
    port: int,
    config_name: str,
    publish: Callable[[bytes], Any],
    placement: str,
    cpusets: Cpusets | None,
) -> dict[str, Any]:
    """The floor: hack/noop-webhook on the webhook's port, with a certificate of its own
    published into both configurations, measured like `_measure` (a warm-up round, ROUNDS
    measured rounds in a fresh tenant namespace)."""
    import datetime as dt

    from controller.webhook import certs

    binary = _noop_webhook()
    workdir.mkdir(parents=True)
    day = dt.timedelta(days=1)
    ca_pem, ca_key = certs.new_ca(day)
    cert_pem, key_pem = certs.new_serving(
        ca_pem, ca_key, certs.Names(("noop",), ("127.0.0.1",)), day
    )
    (workdir / "tls.crt").write_bytes(cert_pem)
    (workdir / "tls.key").write_bytes(key_pem)
    log_path = workdir / "noop-webhook.log"
    tenant = f"bench-{FLOOR}-{uuid.uuid4().hex[:6]}"
    _namespace(client, tenant, {LABEL: "on"})
    publish(ca_pem)
    server: subprocess.Popen[bytes] | None = None
    try:
        with log_path.open("w") as out:
            prefix = cpusets.prefix() if placement == "own-cpu" and cpusets is not None else []
            server = subprocess.Popen(
                [*prefix, binary, "-listen", f"127.0.0.1:{port}",
                 "-cert", str(workdir / "tls.crt"), "-key", str(workdir / "tls.key")],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait("the floor serving", lambda: "noop-webhook on https://" in log_path.read_text())
        _wait("its CA published", lambda: _published(client, config_name, ca_pem))
        time.sleep(1.0)  # let the API server's webhook informer see the caBundle
        _, warm_errors = _create_round(client, tenant, "warm", CONCURRENCY)
        metrics_before = _apiserver_metrics(client, cluster.server)
        stats_before = _floor_stats(port, ca_pem)
        client_samples, errors = _measured_rounds(client, tenant)
        metrics_after = _apiserver_metrics(client, cluster.server)
        stats_after = _floor_stats(port, ca_pem)
        load = round(os.getloadavg()[0], 2)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    client.request(
        "DELETE", kube.path("v1", "pods", namespace=tenant), body={"gracePeriodSeconds": 0}
    )
    # The mutating admissions (the validating webhook is called too, as with ours).
    durations = stats_after["durations_ms"].get(MUTATE_PATH, [])[
        len(stats_before["durations_ms"].get(MUTATE_PATH, [])) :
    ]
    admissions: list[tuple[str, float, dict[str, str]]] = [("allowed", ms, {}) for ms in durations]
    figures = _figures((metrics_before, metrics_after), ("", ""), admissions, client_samples)
    figures["client"]["errors"] = errors
    figures["client"]["warm_up_errors"] = warm_errors
    figures["protocol"] = {
        "alpn_offered": _delta(stats_after["alpn_offered"], stats_before["alpn_offered"]),
        "http_versions": _delta(stats_after["protocols"], stats_before["protocols"]),
        "new_connections": stats_after["connections"] - stats_before["connections"],
    }
    print(f"{placement} {FLOOR}: API server p99 <= {figures['apiserver']['p99_le_ms']} ms, "
          f"client p99 {figures['client']['p99_ms']} ms, load {load}", flush=True)  # fmt: skip
    return {"load_avg_1m": load, **figures}


def _noop_webhook() -> str:
    """The floor's binary (built on first use; hack/noop-webhook/build.sh caches it)."""
    script = Path(__file__).resolve().parent.parent / "hack" / "noop-webhook" / "build.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"hack/noop-webhook/build.sh failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def _floor_stats(port: int, ca_pem: bytes) -> dict[str, Any]:
    """The floor's GET /stats (its counts since it started)."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cadata=ca_pem.decode())
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/stats", context=context) as answer:
        stats: dict[str, Any] = json.loads(answer.read())
    return stats


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _runs(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The headline figures of the last runs (this one included): on a shared 2-CPU machine a
    single p99 says little, the spread over runs says more. Runs before the webhook had its own
    process have no `process` (they are `inline`)."""
    try:
        previous = json.loads(RESULTS.read_text()).get("runs") or []
    except (OSError, ValueError):
        previous = []
    current = [
        {
            "when": document["when"],
            "config": placement,
            "process": mode,
            "load_avg_1m": figures["load_avg_1m"],
            "webhook_p50_ms": figures["webhook"]["p50_ms"],
            "webhook_p99_ms": figures["webhook"]["p99_ms"],
            "apiserver_p99_le_ms": figures["apiserver"]["p99_le_ms"],
            "phase_total_p99_ms": (figures.get("phases") or {}).get("p99", {}).get("total_ms"),
            "client_errors": figures["client"]["errors"],
        }
        for placement, by_mode in document["by_config"].items()
        for mode, passes in by_mode.items()
        for figures in passes
    ]
    return [*previous, *current][-20:]


def _figures(
    apiserver: tuple[str, str],
    webhook: tuple[str, str],
    admissions: list[tuple[str, float, dict[str, str]]],
    client_samples: list[float],
) -> dict[str, Any]:
    """Percentiles from the scrapes before/after the measured rounds and the samples."""
    api_metric = "apiserver_admission_webhook_admission_duration_seconds"
    api_labels = {"name": HOOK_NAME, "type": "admit", "operation": "CREATE"}
    api_before, api_after = (histogram(t, api_metric, api_labels) for t in apiserver)
    own_metric = "vgpu_dra_webhook_admission_duration_seconds"
    own_before, own_after = (histogram(t, own_metric, {"operation": "mutate"}) for t in webhook)
    api_count = api_after[-1][1] - dict(api_before).get(float("inf"), 0.0) if api_after else 0
    return {
        "webhook": {
            **percentiles([ms / 1e3 for _, ms, _ in admissions]),
            "decisions": sorted({d for d, _, _ in admissions}),
            "histogram_p50_le_ms": bucket_quantile(own_after, own_before, 0.50),
            "histogram_p99_le_ms": bucket_quantile(own_after, own_before, 0.99),
        },
        "apiserver": {
            "p50_le_ms": bucket_quantile(api_after, api_before, 0.50),
            "p99_le_ms": bucket_quantile(api_after, api_before, 0.99),
            "count": api_count,
            "share_within_ms": bucket_shares(api_after, api_before),
        },
        "client": percentiles(client_samples),
    }


def _client(kubeconfig: Path) -> kube.KubeClient:
    """An admin client whose connection pool holds a connection per creating thread."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    configuration = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = CONCURRENCY
    return kube.KubeClient(k8s.ApiClient(configuration))


def _apiserver_metrics(client: kube.KubeClient, server: str) -> str:
    """The API server's /metrics text (the admin may read it)."""
    headers = {"Accept": "text/plain", **client._auth_headers()}
    response = client.api_client.call_api("GET", server + "/metrics", header_params=headers)
    raw = response.read()
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _webhook_metrics(client: kube.KubeClient, namespace: str, port: int) -> str:
    """The webhook's own /metrics, over TLS verified with the CA from its Secret."""
    import base64
    import ssl
    import urllib.request

    secret = client.get(kube.path("v1", "secrets", SECRET, namespace=namespace))
    context = ssl.create_default_context(
        cadata=base64.b64decode(secret["data"]["ca-bundle.crt"]).decode()
    )
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context) as answer:
        return str(answer.read().decode())


def _admissions(text: str) -> list[tuple[str, float, dict[str, str]]]:
    """(decision, ms, the line's other fields) per admission line of the webhook's log."""
    return [
        (m.group(1), float(m.group(2)), dict(_FIELD.findall(m.group(3))))
        for m in _ADMISSION.finditer(text)
    ]


COUNTS = ("in_flight", "threads")


def _phases(admissions: list[tuple[str, float, dict[str, str]]]) -> dict[str, Any]:
    """Where the time went (--webhook-phase-timing fields): per field its p50/p99 over all
    admissions, and its mean over the admissions slower than 10 ms (the target) vs the rest."""
    numeric = [
        {k: float(v) for k, v in fields.items() if k.endswith("_ms") or k in COUNTS}
        for _, _, fields in admissions
    ]
    numeric = [n for n in numeric if "total_ms" in n]
    slow = [n for n in numeric if n["total_ms"] > TARGETS["webhook_p99_ms"]]
    fast = [n for n in numeric if n["total_ms"] <= TARGETS["webhook_p99_ms"]]
    keys = sorted({k for n in numeric for k in n})

    def mean(rows: list[dict[str, float]], key: str) -> float | None:
        values = [r[key] for r in rows if key in r]
        return round(sum(values) / len(values), 3) if values else None

    def quantile(key: str, q: float) -> float | None:
        values = sorted(r[key] for r in numeric if key in r)
        return values[min(len(values) - 1, int(q * len(values)))] if values else None

    return {
        "n": len(numeric),
        "slow_n": len(slow),
        "handshakes_n": sum("tls_ms" in n for n in numeric),
        "p50": {k: quantile(k, 0.50) for k in keys},
        "p99": {k: quantile(k, 0.99) for k in keys},
        "mean_slow": {k: mean(slow, k) for k in keys},
        "mean_rest": {k: mean(fast, k) for k in keys},
    }


def _measured_rounds(client: kube.KubeClient, namespace: str) -> tuple[list[float], int]:
    """The measured rounds of a pass (after its warm-up): every client latency, failures."""
    client_samples: list[float] = []
    errors = 0
    for n in range(ROUNDS):
        samples, failed = _create_round(client, namespace, f"r{n}", CONCURRENCY)
        client_samples += samples
        errors += failed
    return client_samples, errors


def _create_round(
    client: kube.KubeClient, namespace: str, tag: str, count: int
) -> tuple[list[float], int]:
    """`count` pods created at once from `count` threads: client latencies, failures."""
    barrier = threading.Barrier(count)
    pods = kube.path("v1", "pods", namespace=namespace)

    def one(n: int) -> float | None:
        barrier.wait()
        started = time.perf_counter()
        try:
            client.create(pods, legacy_pod(f"{tag}-{n}"))
        except kube.KubeError as exc:
            print(f"create failed: {exc}", file=sys.stderr)
            return None
        return time.perf_counter() - started

    with ThreadPoolExecutor(max_workers=count) as pool:
        results = list(pool.map(one, range(count)))
    samples = [r for r in results if r is not None]
    return samples, len(results) - len(samples)


def _exists(client: kube.KubeClient, resource: str) -> bool:
    try:
        client.get(resource)
    except kube.NotFound:
        return False
    return True


def _wait(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)
