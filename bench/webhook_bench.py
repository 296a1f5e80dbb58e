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
Target (issue 11): p99 <= 10 ms inside the webhook. Writes bench/results/webhook.json (`figures`:
the last `child` pass; `by_process`: every pass with its load average), with the headline
figures of the last twenty passes under `runs`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
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
CONCURRENCY = 200
ROUNDS = 3
MODES = ("inline", "child")  # --webhook-process: the controller's threads, or its own process
PASSES = 3  # per way, alternating
TARGETS = {"webhook_p99_ms": 10.0}
LABEL = "vgpu-dra.bench/webhook"
HOOK_NAME = "legacy-pods.vgpu.dra.dev"
_ADMISSION = re.compile(r'msg="admission mutate Pod [^"]*: (\w+) in ([\d.]+) ms"')


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


def main() -> None:
    from vgpu_testbed.cluster.control_plane import Cluster
    from vgpu_testbed.cluster.flags import free_ports
    from vgpu_testbed.cluster.webhook import register_webhooks

    root = Path(tempfile.mkdtemp(prefix="vgpu-bench-webhook-"))
    cluster = Cluster.start(root / "cluster", ("a10-pcie",), die_with_parent=True)
    client = _client(cluster.kubeconfig)
    by_process: dict[str, Any] = {}
    try:
        system_ns = "vgpu-dra-system"
        _namespace(client, system_ns, {})
        (port,) = free_ports(1)
        values = {"webhook": {"namespaceSelector": {"matchLabels": {LABEL: "on"}}}}
        configs = register_webhooks(cluster, port, None, namespace=system_ns, values=values)
        config_name = configs[0]["metadata"]["name"]
        # Alternating, so that neither way always runs on the more loaded machine.
        for n, mode in enumerate(MODES * PASSES):
            by_process.setdefault(mode, []).append(
                _measure(client, cluster, root / f"controller-{n}-{mode}.log", mode,
                         port=port, system_ns=system_ns, config_name=config_name)
            )  # fmt: skip
    finally:
        client.close()
        keep = os.environ.get("VGPU_BENCH_KEEP") is not None
        cluster.stop(keep_logs=keep)
        if keep:
            print("kept", root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    child = by_process["child"][-1]
    document: dict[str, Any] = {
        "benchmark": "webhook",
        "when": utc_stamp(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m": child["load_avg_1m"],
        },
        "setup": {
            "concurrency": CONCURRENCY,
            "rounds": ROUNDS,
            "pods": CONCURRENCY * ROUNDS,
            "passes_per_way": PASSES,
        },
        "targets": TARGETS,
        "met": {"webhook_p99_ms": child["webhook"]["p99_ms"] <= TARGETS["webhook_p99_ms"]},
        # The default (the webhook in its own process), last pass.
        "figures": {k: v for k, v in child.items() if k != "load_avg_1m"},
        # Each pass of each way, in the order they ran: `inline` = the controller's own threads
        # (--webhook-process inline, the old way), `child` = `vgpu-dra webhook` as its child.
        "by_process": by_process,
    }
    document["runs"] = _runs(document)
    write_results(RESULTS, document)


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
) -> dict[str, Any]:
    """One controller (webhook served `mode`), a warm-up round and ROUNDS measured rounds in a
    fresh tenant namespace, whose pods are deleted afterwards (so passes start alike)."""
    tenant = f"bench-{mode}-{uuid.uuid4().hex[:6]}"
    _namespace(client, tenant, {LABEL: "on"})
    controller: subprocess.Popen[bytes] | None = None
    try:
        with log_path.open("w") as out:
            controller = subprocess.Popen(
                [sys.executable, "-m", "dra_driver.cli", "controller",
                 "--kubeconfig", str(cluster.kubeconfig), "--health-address", "127.0.0.1:0",
                 "--webhook-port", str(port), "--webhook-bind", "127.0.0.1",
                 "--webhook-cert-ips", "127.0.0.1", "--webhook-namespace", system_ns,
                 "--webhook-config-names", config_name, "--webhook-cert-sync", "1s",
                 "--webhook-process", mode],
                stdout=out, stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
            )  # fmt: skip
        _wait("the webhook serving", lambda: "webhook on https://" in log_path.read_text())
        _wait("the caBundle published", lambda: _published(client, config_name))
        time.sleep(1.0)  # let the API server's webhook informer see the caBundle
        # Connections, the template (a new shape: one create for 200 admissions), caches.
        _, warm_errors = _create_round(client, tenant, "warm", CONCURRENCY)
        warm_lines = len(_admissions(log_path.read_text()))
        metrics_before = _apiserver_metrics(client, cluster.server)
        hook_before = _webhook_metrics(client, system_ns, port)
        client_samples: list[float] = []
        errors = 0
        for n in range(ROUNDS):
            samples, failed = _create_round(client, tenant, f"r{n}", CONCURRENCY)
            client_samples += samples
            errors += failed
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
    print(f"{mode}: webhook p50 {figures['webhook']['p50_ms']} ms p99 "
          f"{figures['webhook']['p99_ms']} ms, load {load}", flush=True)  # fmt: skip
    return {"load_avg_1m": load, **figures}


def _published(client: kube.KubeClient, name: str) -> bool:
    """The mutating configuration carries a caBundle (the webhook published its CA)."""
    config = client.get(
        kube.path("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", name)
    )
    return all(h.get("clientConfig", {}).get("caBundle") for h in config.get("webhooks") or [])


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
            "process": mode,
            "load_avg_1m": figures["load_avg_1m"],
            "webhook_p50_ms": figures["webhook"]["p50_ms"],
            "webhook_p99_ms": figures["webhook"]["p99_ms"],
            "apiserver_p99_le_ms": figures["apiserver"]["p99_le_ms"],
            "client_errors": figures["client"]["errors"],
        }
        for mode, passes in document["by_process"].items()
        for figures in passes
    ]
    return [*previous, *current][-20:]


def _figures(
    apiserver: tuple[str, str],
    webhook: tuple[str, str],
    admissions: list[tuple[str, float]],
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
            **percentiles([ms / 1e3 for _, ms in admissions]),
            "decisions": sorted({d for d, _ in admissions}),
            "histogram_p50_le_ms": bucket_quantile(own_after, own_before, 0.50),
            "histogram_p99_le_ms": bucket_quantile(own_after, own_before, 0.99),
        },
        "apiserver": {
            "p50_le_ms": bucket_quantile(api_after, api_before, 0.50),
            "p99_le_ms": bucket_quantile(api_after, api_before, 0.99),
            "count": api_count,
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

    secret = client.get(kube.path("v1", "secrets", "vgpu-dra-webhook-tls", namespace=namespace))
    context = ssl.create_default_context(
        cadata=base64.b64decode(secret["data"]["ca-bundle.crt"]).decode()
    )
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context) as answer:
        return str(answer.read().decode())


def _admissions(text: str) -> list[tuple[str, float]]:
    return [(m.group(1), float(m.group(2))) for m in _ADMISSION.finditer(text)]


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
