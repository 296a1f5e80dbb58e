"""The admission webhook under 200 concurrent pod creations through the real API server, against
the floor: a Go webhook that does nothing.

Setup: a fresh control plane; the chart's webhook configurations registered with its API server
(`vgpu_testbed.cluster.webhook`), limited to the benchmark's namespaces; 50 Nodes with eight
GPUs each published in ResourceSlices of a driver of the bench's own (for the placement
workload below). Each pass starts one `vgpu-dra controller` (the webhook on loopback,
self-managed certificates, admin credentials: RBAC does not change latency) in a fresh tenant
namespace, then a warm-up round and `ROUNDS` measured rounds. In each round, at once from one
thread each:
- 200 vgpu-manager pods (vgpu-number 1, vgpu-cores 10, vgpu-memory 1024: translated, one shared
  template ensured): the admissions;
- 20 gated pods of the policy path, each with a claim of its own: what the controller's
  placement worker must decide while the admissions arrive (the isolation of placement from
  admission load).

Ways (`VGPU_BENCH_WEBHOOK_WAYS`, a comma list, alternating, their order rotated each pass):
- `webhook`: the controller as it is;
- `<process>-<transport>` (`inline-threads`, `child-asyncio`, ...): the controller started with
  `--webhook-process <process> --webhook-transport <transport>`, for a tree that still has those
  flags; `<way>@baseline` runs `<way>` from the tree VGPU_BENCH_WEBHOOK_BASELINE names (e.g. a
  `git archive` of an earlier commit): an A/B of a change on the same control plane;
- `go-noop`, the floor: hack/noop-webhook (Go, standard library; built on first use into the
  cache like the other Go tools) answers every admission "allowed", a mutation with a fixed
  patch that removes the pod's legacy resources (`FLOOR_PATCH`: without it the API server would
  call the validating webhook for each untranslated pod too, two calls where ours make one), on
  the same port, HTTP/1.1 only, with a certificate of the bench's own published into both
  configurations for its pass; the controller runs too, without its webhook, so the placement
  workload and the memory have a floor as well. The legacy pods name a scheduler that does not
  exist: kube-scheduler's work on them would differ between the floor's pods and ours.

Measured per pass:
- `apiserver`: the API server's own `apiserver_admission_webhook_admission_duration_seconds` for
  the mutating webhook (coarse buckets: the figure is the upper bound of the bucket holding the
  percentile; `share_within_ms` the exact share at or below each bound);
- `client`: a pod create as the creating thread sees it (the whole API request);
- `webhook`: inside the webhook, from reading an AdmissionReview to writing its answer (its
  structured admission log; the floor's handler clock for the floor);
- `placement`: from a gated pod's creation to its claim's allocation (a watch), in ms;
  `decision`: the controller's own `vgpu_dra_controller_decision_duration_seconds` (placed);
- `memory`: VmRSS and VmHWM (peak) of the controller and of any child of it, MiB, at the end;
  `start_to_serving_s`: from starting the controller to its webhook (the floor: its metrics)
  serving;
- `protocol`: for the floor, the ALPN protocols the API server offered and the HTTP versions it
  used; for ours, what the webhook selects when a client offers h2 (none: HTTP/1.1).
`floor_ratios`: each way's median over its passes, and its ratio to the floor's.
VGPU_BENCH_WEBHOOK_PASSES (default 5) and VGPU_BENCH_WEBHOOK_CONCURRENCY (default 200) narrow a
run. Writes bench/results/webhook.json, with the medians of the last runs under `runs`.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import percentiles, utc_stamp, write_results
from dra_driver import kube
from dra_driver.kube import RESOURCE_API

RESULTS = Path(__file__).parent / "results" / "webhook.json"
CONCURRENCY = int(os.environ.get("VGPU_BENCH_WEBHOOK_CONCURRENCY", "200"))  # pods per round
PLACED = 20  # gated pods per round (the placement workload)
NODES = 50  # with GPUS_PER_NODE each, for the placement workload
ROUNDS = 3
PASSES = 5
FLOOR = "go-noop"
WAYS = ("webhook", FLOOR)
BASELINE_SUFFIX = "@baseline"
LABEL = "vgpu-dra.bench/webhook"
HOOK_NAME = "legacy-pods.vgpu.dra.dev"
MUTATE_PATH = "/mutate-pods"
SECRET = "vgpu-dra-webhook-tls"  # the controller's certificates (self-managed mode)
SYSTEM_NS = "vgpu-dra-system"
GATE = "vgpu.dra.dev/policy"
UNSCHEDULED = "vgpu-dra-bench-none"  # a scheduler that does not exist
# The floor's answer to a mutation: the legacy resources gone, as translated pods have them
# gone, so that the API server skips the validating webhook for the floor's pods too (its
# matchConditions route only pods with legacy resources).
FLOOR_PATCH = [{"op": "replace", "path": "/spec/containers/0/resources", "value": {}}]
DECISIONS = "vgpu_dra_controller_decision_duration_seconds"
_ADMISSION = re.compile(r'msg="admission mutate Pod [^"]*: (\w+) in ([\d.]+) ms"')


def legacy_pod(name: str) -> dict[str, Any]:
    """A vgpu-manager pod that no scheduler picks up: what follows its admission (kube-scheduler
    failing to place an untranslated pod with the floor, or a translated one without GPUs with
    ours) would load the API server differently for the floor and for us."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": UNSCHEDULED,
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
            ],
        },
    }


def histogram(text: str, metric: str, labels: dict[str, str]) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a Prometheus histogram's buckets matching labels."""
    merged: dict[float, float] = {}  # several label sets (e.g. rejected) add up
    for line in text.splitlines():
        if not line.startswith(metric + "_bucket{"):
            continue
        label_text, value = line[len(metric) + 8 :].rsplit("} ", 1)
        found = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        if all(found.get(k) == v for k, v in labels.items()):
            le = float("inf") if found["le"] == "+Inf" else float(found["le"])
            merged[le] = merged.get(le, 0.0) + float(value)
    return sorted(merged.items())


def _counts(
    after: list[tuple[float, float]], before: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    start = dict(before)
    return [(le, n - start.get(le, 0.0)) for le, n in after]


def bucket_quantile(after: list[tuple[float, float]], before: list[tuple[float, float]],
                    q: float) -> float | None:  # fmt: skip
    """Upper bound (ms) of the bucket holding quantile q of the observations between the two
    scrapes."""
    counts = _counts(after, before)
    if not counts or counts[-1][1] <= 0:
        return None
    return next((round(le * 1e3, 3) for le, n in counts if n >= q * counts[-1][1]), None)


def bucket_shares(
    after: list[tuple[float, float]], before: list[tuple[float, float]]
) -> dict[str, float]:
    """Share of the observations between the two scrapes at or below each bucket's upper bound
    (ms; exact, unlike a quantile read off coarse buckets), up to the first bucket holding all."""
    counts = _counts(after, before)
    if not counts or counts[-1][1] <= 0:
        return {}
    shares: dict[str, float] = {}
    for le, n in counts:
        shares["inf" if le == float("inf") else f"{le * 1e3:g}"] = round(n / counts[-1][1], 4)
        if n >= counts[-1][1]:
            break
    return shares


def main() -> None:
    from bench import controller_bench as placement
    from bench.cluster_load import create_device_class
    from vgpu_testbed.cluster.control_plane import Cluster
    from vgpu_testbed.cluster.flags import free_ports
    from vgpu_testbed.cluster.webhook import register_webhooks

    ways = _env_list("VGPU_BENCH_WEBHOOK_WAYS", WAYS)
    passes = int(os.environ.get("VGPU_BENCH_WEBHOOK_PASSES", PASSES))
    baseline = os.environ.get("VGPU_BENCH_WEBHOOK_BASELINE")
    if any(w.endswith(BASELINE_SUFFIX) for w in ways) and not baseline:
        raise SystemExit("a @baseline way needs VGPU_BENCH_WEBHOOK_BASELINE=<a source tree>")
    load_start = round(os.getloadavg()[0], 2)
    root = Path(tempfile.mkdtemp(prefix="vgpu-bench-webhook-"))
    cluster = Cluster.start(root / "cluster", ("a10-pcie",), die_with_parent=True)
    client = _client(cluster.kubeconfig)
    by_way: dict[str, list[dict[str, Any]]] = {}
    try:
        _namespace(client, SYSTEM_NS, {})
        kubeconfig = str(cluster.kubeconfig)
        create_device_class(client, placement.DRIVER)
        nodes = [(kube.path("v1", "nodes"), placement.node_obj(n)) for n in range(NODES)]
        placement.create_all(kubeconfig, nodes)
        slices = kube.path(RESOURCE_API, "resourceslices")
        placement.create_all(kubeconfig, [(slices, s) for n in range(NODES)
                                          for s in placement.slices_of(n)])  # fmt: skip
        (port,) = free_ports(1)
        values = {"webhook": {"namespaceSelector": {"matchLabels": {LABEL: "on"}}}}
        hooks = register_webhooks(cluster, port, None, namespace=SYSTEM_NS, values=values)
        bed = _Bed(client, cluster, root, port=port, config_name=hooks[0]["metadata"]["name"],
                   publish=lambda ca: register_webhooks(cluster, port, ca, namespace=SYSTEM_NS,
                                                        values=values),
                   driver=placement.DRIVER)  # fmt: skip
        # Each pass starts the round one way later: the first way of a round follows the
        # previous round's last (e.g. the floor, whose CA swap gives the API server's webhook
        # client a new connection pool), and no way may always be the one that pays for it.
        for n in range(passes):
            for way in _rotated(ways, n):
                figures = bed.measure(n, way, baseline)
                by_way.setdefault(way, []).append(figures)
    finally:
        client.close()
        keep = os.environ.get("VGPU_BENCH_KEEP") is not None
        cluster.stop(keep_logs=keep)
        if keep:
            print("kept", root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    document: dict[str, Any] = {
        "benchmark": "webhook",
        "when": utc_stamp(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m_at_start": load_start,
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "setup": {
            "concurrency": CONCURRENCY,
            "placed_per_round": PLACED,
            "rounds": ROUNDS,
            "nodes": NODES,
            "passes_per_way": passes,
            "ways": ways,
            "baseline_tree": baseline,
        },
        # Each pass per way, in the order they ran.
        "by_way": by_way,
        "floor_ratios": _floor_ratios(by_way),
    }
    document["runs"] = _runs(document)
    write_results(RESULTS, document)


def _rotated(items: list[str], by: int) -> list[str]:
    shift = by % len(items) if items else 0
    return items[shift:] + items[:shift]


def _env_list(name: str, default: tuple[str, ...]) -> list[str]:
    text = os.environ.get(name)
    return [v.strip() for v in text.split(",") if v.strip()] if text else list(default)


MEASURES: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "apiserver_p99_le_ms": lambda f: f["apiserver"]["p99_le_ms"],
    # Exact (a count, not a bucket bound): more is better.
    "apiserver_share_within_500ms": lambda f: (
        float(f["apiserver"]["share_within_ms"].get("500", 1.0))
        if f["apiserver"]["share_within_ms"]
        else None
    ),
    "client_p99_ms": lambda f: f["client"]["p99_ms"],
    "webhook_p99_ms": lambda f: f["webhook"].get("p99_ms"),
    "placement_p50_ms": lambda f: f["placement"].get("p50_ms"),
    "placement_p99_ms": lambda f: f["placement"].get("p99_ms"),
    "decision_p50_le_ms": lambda f: f["decision"]["p50_le_ms"],
    "decision_p99_le_ms": lambda f: f["decision"]["p99_le_ms"],
    "start_to_serving_s": lambda f: f["start_to_serving_s"],
    "rss_mib": lambda f: f["memory"]["rss_mib"],
    "peak_rss_mib": lambda f: f["memory"]["peak_mib"],
}


def _floor_ratios(by_way: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per way and measure: its median over its passes, the floor's, and their ratio."""
    floor = by_way.get(FLOOR) or []
    ratios: dict[str, Any] = {}
    for way, runs in by_way.items():
        entry: dict[str, Any] = {}
        for name, value in MEASURES.items():
            ours = [v for v in map(value, runs) if v is not None]
            base = [v for v in map(value, floor) if v is not None]
            if not ours:
                continue
            mine = statistics.median(ours)
            theirs = statistics.median(base) if base else None
            entry[name] = {
                "median": mine,
                "floor_median": theirs,
                "ratio": round(mine / theirs, 2) if theirs else None,
            }
        ratios[way] = entry
    return ratios


def _runs(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The medians of the last runs (this one included): on a shared 2-CPU machine one run says
    little, the spread over runs says more."""
    try:
        previous = json.loads(RESULTS.read_text()).get("runs") or []
    except (OSError, ValueError):
        previous = []
    current = [
        {
            "when": document["when"],
            "way": way,
            "passes": len(document["by_way"][way]),
            "loads": [f["load_avg_1m"] for f in document["by_way"][way]],
            **{name: m["median"] for name, m in measures.items()},
        }
        for way, measures in document["floor_ratios"].items()
    ]
    return [*previous, *current][-30:]


class _Bed:
    """The control plane and what every pass shares: the webhook's port and configurations,
    the placement driver."""

    def __init__(
        self,
        client: kube.KubeClient,
        cluster: Any,
        root: Path,
        *,
        port: int,
        config_name: str,
        publish: Callable[[bytes | None], Any],
        driver: str,
    ) -> None:
        self.client, self.cluster, self.root, self.port = client, cluster, root, port
        self.config_name, self.publish, self.driver = config_name, publish, driver

    def measure(self, n: int, way: str, baseline: str | None) -> dict[str, Any]:
        name, suffix, _ = way.partition(BASELINE_SUFFIX)
        tenant = f"bench-{re.sub(r'[^a-z0-9]', '-', way)}-{uuid.uuid4().hex[:6]}"
        _namespace(self.client, tenant, {LABEL: "on"})
        log_path = self.root / f"controller-{n}-{tenant}.log"
        floor = name == FLOOR
        flags = [] if floor else self._webhook_flags(name)
        with contextlib.ExitStack() as stack:
            noop = stack.enter_context(self._floor(n)) if floor else None
            started = time.monotonic()
            controller = stack.enter_context(
                _controller(self.cluster.kubeconfig, log_path, flags, baseline if suffix else None)
            )
            serving = "metrics on http" if floor else "webhook on https://"
            _wait("the controller serving", lambda: serving in log_path.read_text())
            start_s = round(time.monotonic() - started, 2)
            if noop is not None:
                ca = noop
            else:
                _wait("the caBundle published", lambda: _published(
                    self.client, self.config_name, _secret_bundle(self.client)))  # fmt: skip
                ca = _secret_bundle(self.client) or b""
            time.sleep(1.0)  # let the API server's webhook informer see the caBundle
            _wait("the metrics served", lambda: "metrics on http" in log_path.read_text())
            match = re.search(r"metrics on (http://\S+/metrics)", log_path.read_text())
            assert match is not None
            decisions_before = _text(match.group(1))
            figures = self._rounds(tenant, ca, floor)
            figures["memory"] = _memory(controller.pid)
            figures["start_to_serving_s"] = start_s
            decisions = histogram(_text(match.group(1)), DECISIONS, {"outcome": "placed"})
            before = histogram(decisions_before, DECISIONS, {"outcome": "placed"})
            figures["decision"] = {
                "p50_le_ms": bucket_quantile(decisions, before, 0.50),
                "p99_le_ms": bucket_quantile(decisions, before, 0.99),
                "share_within_ms": bucket_shares(decisions, before),
            }
            figures["log_errors"] = log_path.read_text().count("Traceback")
            if not floor:
                time.sleep(0.5)  # the last admission lines reach the log
                lines = _ADMISSION.findall(log_path.read_text())[-CONCURRENCY * ROUNDS :]
                figures["webhook"] = percentiles([float(ms) / 1e3 for _, ms in lines])
                figures["protocol"] = {"selected_for_h2_offer": _alpn_selected(self.port, ca)}
        for plural, api in (("pods", "v1"), ("resourceclaims", RESOURCE_API)):
            self.client.request("DELETE", kube.path(api, plural, namespace=tenant),
                                body={"gracePeriodSeconds": 0})  # fmt: skip
        print(f"{way}: API server p99 <= {figures['apiserver']['p99_le_ms']} ms, client p99 "
              f"{figures['client']['p99_ms']} ms, webhook p99 "
              f"{figures['webhook'].get('p99_ms')} ms, placement p99 "
              f"{figures['placement'].get('p99_ms')} ms, rss {figures['memory']['rss_mib']} MiB, "
              f"load {figures['load_avg_1m']}", flush=True)  # fmt: skip
        return figures

    def _webhook_flags(self, name: str) -> list[str]:
        flags = ["--webhook-port", str(self.port), "--webhook-bind", "127.0.0.1",
                 "--webhook-cert-ips", "127.0.0.1", "--webhook-namespace", SYSTEM_NS,
                 "--webhook-config-names", self.config_name,
                 "--webhook-cert-sync", "1s"]  # fmt: skip
        if name != "webhook":  # an earlier tree's way: <process>-<transport>
            process, _, transport = name.partition("-")
            flags += ["--webhook-process", process, "--webhook-transport", transport]
        return flags

    @contextlib.contextmanager
    def _floor(self, n: int) -> Iterator[bytes]:
        """hack/noop-webhook on the webhook's port with a certificate of its own, published
        into both configurations; yields its CA."""
        from controller.webhook import certs

        workdir = self.root / f"floor-{n}"
        workdir.mkdir()
        day = dt.timedelta(days=1)
        ca_pem, ca_key = certs.new_ca(day)
        cert, key = certs.new_serving(ca_pem, ca_key, certs.Names(("noop",), ("127.0.0.1",)), day)
        (workdir / "tls.crt").write_bytes(cert)
        (workdir / "tls.key").write_bytes(key)
        log_path = workdir / "noop-webhook.log"
        self.publish(ca_pem)
        with log_path.open("w") as out:
            server = subprocess.Popen(
                [_noop_webhook(), "-listen", f"127.0.0.1:{self.port}",
                 "-cert", str(workdir / "tls.crt"), "-key", str(workdir / "tls.key"),
                 "-mutate-patch", json.dumps(FLOOR_PATCH)],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            _wait("the floor serving", lambda: "noop-webhook on https://" in log_path.read_text())
            _wait("its CA published", lambda: _published(self.client, self.config_name, ca_pem))
            yield ca_pem
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)

    def _rounds(self, tenant: str, ca: bytes, floor: bool) -> dict[str, Any]:
        """A warm-up round, then ROUNDS measured rounds: the figures of the measured ones."""
        claims = kube.path(RESOURCE_API, "resourceclaims", namespace=tenant)
        watcher = _AllocationWatch(self.client, claims)
        try:
            self._round(tenant, "warm", watcher)  # connections, the template, caches
            api_before = _apiserver_metrics(self.client, self.cluster.server)
            floor_before = _floor_stats(self.port, ca) if floor else None
            samples: list[float] = []
            placed: list[float] = []
            errors = 0
            for r in range(ROUNDS):
                got, failed, waits = self._round(tenant, f"r{r}", watcher)
                samples += got
                placed += waits
                errors += failed
            api_after = _apiserver_metrics(self.client, self.cluster.server)
            floor_after = _floor_stats(self.port, ca) if floor else None
        finally:
            watcher.stop()
        labels = {"name": HOOK_NAME, "type": "admit", "operation": "CREATE"}
        metric = "apiserver_admission_webhook_admission_duration_seconds"
        before, after = (histogram(t, metric, labels) for t in (api_before, api_after))
        figures: dict[str, Any] = {
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "apiserver": {
                "p50_le_ms": bucket_quantile(after, before, 0.50),
                "p99_le_ms": bucket_quantile(after, before, 0.99),
                "count": (after[-1][1] - dict(before).get(float("inf"), 0.0)) if after else 0,
                "share_within_ms": bucket_shares(after, before),
            },
            "client": {**percentiles(samples), "errors": errors},
            "placement": {
                **(percentiles(placed) if placed else {}),
                "placed": len(placed),
                "of": PLACED * ROUNDS,
            },
            "webhook": {},
        }
        if floor_before is not None and floor_after is not None:
            durations = floor_after["durations_ms"].get(MUTATE_PATH, [])
            done = len(floor_before["durations_ms"].get(MUTATE_PATH, []))
            figures["webhook"] = percentiles([ms / 1e3 for ms in durations[done:]])
            figures["protocol"] = {
                "alpn_offered": _delta(floor_after["alpn_offered"], floor_before["alpn_offered"]),
                "http_versions": _delta(floor_after["protocols"], floor_before["protocols"]),
                "new_connections": floor_after["connections"] - floor_before["connections"],
            }
        return figures

    def _round(
        self, tenant: str, tag: str, watcher: _AllocationWatch
    ) -> tuple[list[float], int, list[float]]:
        """CONCURRENCY legacy pods and PLACED gated pods (their claims made first) created at
        once from a thread each: the legacy pods' create latencies, their failures, and the
        gated pods' creation-to-allocation times (waited for up to 60 s)."""
        for i in range(PLACED):
            self.client.create(watcher.path, _claim(f"{tag}-c{i}", tenant, self.driver))
        pods = kube.path("v1", "pods", namespace=tenant)
        jobs: list[dict[str, Any]] = [legacy_pod(f"{tag}-{i}") for i in range(CONCURRENCY)]
        jobs += [_gated_pod(f"{tag}-g{i}", f"{tag}-c{i}") for i in range(PLACED)]
        barrier = threading.Barrier(len(jobs))
        created: dict[str, float] = {}

        def one(pod: dict[str, Any]) -> float | None:
            barrier.wait()
            started = time.monotonic()
            try:
                self.client.create(pods, pod)
            except kube.KubeError as exc:
                print(f"create failed: {exc}", file=sys.stderr)
                return None
            claims = pod["spec"].get("resourceClaims")
            if claims:
                created[claims[0]["resourceClaimName"]] = started
            return time.monotonic() - started

        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            results = list(pool.map(one, jobs))[:CONCURRENCY]
        samples = [r for r in results if r is not None]
        waits = watcher.wait_for(created, timeout_s=60)
        return samples, len(results) - len(samples), waits


class _AllocationWatch:
    """When each claim of a namespace was first seen allocated (a watch from a thread)."""

    def __init__(self, client: kube.KubeClient, path: str) -> None:
        self.path = path
        self._client = client
        self._seen: dict[str, float] = {}
        self._stop = threading.Event()
        _, self._version = client.list_versioned(path)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self._client.watch(self.path, self._version, timeout_s=30):
                    obj = event.get("object") or {}
                    self._version = str(obj.get("metadata", {}).get("resourceVersion") or "")
                    name = str(obj.get("metadata", {}).get("name"))
                    if (obj.get("status") or {}).get("allocation"):
                        self._seen.setdefault(name, time.monotonic())
                    if self._stop.is_set():
                        return
            except kube.KubeError:
                time.sleep(0.1)

    def wait_for(self, created: dict[str, float], timeout_s: float) -> list[float]:
        deadline = time.monotonic() + timeout_s
        while not set(created) <= set(self._seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [self._seen[c] - t for c, t in created.items() if c in self._seen]

    def stop(self) -> None:
        self._stop.set()  # the watch ends at its timeout at the latest (daemon thread)


def _claim(name: str, namespace: str, driver: str) -> dict[str, Any]:
    """One GPU's 1 GiB and 5 % (many fit on a GPU: passes never run out of room)."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": driver, "count": 1,
            "capacity": {"requests": {"memory": "1Gi", "cores": "5"}}}}]}},
    }  # fmt: skip


def _gated_pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "tolerations": [{"operator": "Exists"}],  # the bench's nodes have no kubelet
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {"name": "c", "image": "x.invalid/none", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


@contextlib.contextmanager
def _controller(
    kubeconfig: Path, log_path: Path, flags: list[str], tree: str | None
) -> Iterator[subprocess.Popen[bytes]]:
    """`vgpu-dra controller` with `flags`, from `tree` when given (`python -m` imports from the
    working directory first)."""
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dra_driver.cli", "controller", "--kubeconfig",
             str(kubeconfig), "--health-address", "127.0.0.1:0",
             "--metrics-address", "127.0.0.1:0", *flags],
            stdout=out, stderr=subprocess.STDOUT, cwd=tree,
            env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        )  # fmt: skip
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _memory(pid: int) -> dict[str, Any]:
    """VmRSS and VmHWM (MiB) of the process and its children, summed, and per process."""
    pids = [pid]
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            pids += [int(c) for c in (task / "children").read_text().split()]
    per = {}
    for p in pids:
        with contextlib.suppress(OSError):
            status = dict(
                line.split(":", 1) for line in Path(f"/proc/{p}/status").read_text().splitlines()
            )
            per[p] = {k: round(int(status[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM")}
    return {
        "processes": len(per),
        "rss_mib": round(sum(v["VmRSS"] for v in per.values()), 1),
        "peak_mib": round(sum(v["VmHWM"] for v in per.values()), 1),
        "per_process": list(per.values()),
    }


def _namespace(client: kube.KubeClient, name: str, labels: dict[str, str]) -> None:
    client.create(
        kube.path("v1", "namespaces"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
    )
    _wait(f"the default ServiceAccount of {name}", lambda: _exists(
        client, kube.path("v1", "serviceaccounts", "default", namespace=name)))  # fmt: skip


def _published(client: kube.KubeClient, name: str, bundle: bytes | None) -> bool:
    """Both configurations trust `bundle` (a previous pass may have left another one there)."""
    if not bundle:
        return False
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        config = client.get(kube.path("admissionregistration.k8s.io/v1", plural, name))
        for hook in config.get("webhooks") or []:
            published = hook.get("clientConfig", {}).get("caBundle") or ""
            if base64.b64decode(published) != bundle:
                return False
    return True


def _secret_bundle(client: kube.KubeClient) -> bytes | None:
    """The CA bundle the controller keeps in its Secret (None before it wrote one)."""
    try:
        secret = client.get(kube.path("v1", "secrets", SECRET, namespace=SYSTEM_NS))
    except kube.NotFound:
        return None
    text = (secret.get("data") or {}).get("ca-bundle.crt")
    return base64.b64decode(text) if text else None


def _alpn_selected(port: int, bundle: bytes) -> str:
    """What the webhook selects when a client offers h2 and HTTP/1.1 (as the API server does
    for a loopback URL): an ALPN name, or "none (HTTP/1.1)"."""
    context = ssl.create_default_context(cadata=bundle.decode())
    context.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        return tls.selected_alpn_protocol() or "none (HTTP/1.1)"


def _noop_webhook() -> str:
    """The floor's binary (built on first use; hack/noop-webhook/build.sh caches it)."""
    script = Path(__file__).resolve().parent.parent / "hack" / "noop-webhook" / "build.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"hack/noop-webhook/build.sh failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def _floor_stats(port: int, ca_pem: bytes) -> dict[str, Any]:
    """The floor's GET /stats (its counts since it started)."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/stats", context=context) as answer:
        stats: dict[str, Any] = json.loads(answer.read())
    return stats


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _client(kubeconfig: Path) -> kube.KubeClient:
    """An admin client whose connection pool holds a connection per creating thread."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    configuration = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = CONCURRENCY + PLACED
    return kube.KubeClient(k8s.ApiClient(configuration))


def _apiserver_metrics(client: kube.KubeClient, server: str) -> str:
    """The API server's /metrics text (the admin may read it)."""
    headers = {"Accept": "text/plain", **client._auth_headers()}
    response = client.api_client.call_api("GET", server + "/metrics", header_params=headers)
    raw = response.read()
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


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
