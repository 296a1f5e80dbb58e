"""`vgpu-dra status`: what the cluster's GPUs hold, as a kubectl-like table or JSON.

Why: an operator's first question is "which GPU has room, and who is on it". The answer is
already in the API: ResourceSlices say what each node offers (GPUs with their memory and cores
capacity), allocated ResourceClaims say who holds what (consumed memory and cores per device,
pods in `reservedFor`). This module reads both through `dra_driver.kube` (any cluster, from a
kubeconfig) and adds live usage (memory held, utilisation) from the kubelet plugins' `/metrics`:
found by itself (`dra_driver.metrics_endpoints`: the chart's plugin pods through the API
server), or given with `--metrics-endpoint NODE=URL` (the test bed's `vgpu-dra dev-cluster gpus`
gives its plugins' URLs so).

Layers: `collect` (I/O) -> `build_status` (pure: slices + claims + live samples -> `Status`) ->
`render_table` / `render_json` (pure). Only the newest generation of each pool counts, as for
the scheduler.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from dra_driver import kube, names
from dra_driver.allocator import QuantityError, format_quantity, parse_quantity
from dra_driver.metrics_endpoints import (
    Endpoint,
    from_plugin_pods,
    url_endpoint,
)

JSON = dict[str, Any]
FULL_CORES = 100
SCRAPERS = 16  # nodes whose metrics are read at once


@dataclass
class ClaimShare:
    """One claim's hold on one GPU."""

    namespace: str
    claim: str
    node: str
    device: str
    memory: int
    cores: int
    pods: list[str] = field(default_factory=list)
    memory_used: int | None = None  # live, from the node's metrics
    utilization: float | None = None  # live, 0..1


@dataclass
class GpuStatus:
    node: str
    device: str
    uuid: str
    product: str
    memory_total: int
    cores_total: int = FULL_CORES
    memory_allocated: int = 0
    cores_allocated: int = 0
    claims: int = 0
    memory_used: int | None = None  # live physical usage (NVML through the node's metrics)
    utilization: float | None = None  # live, 0..1

    @property
    def memory_free(self) -> int:
        return max(0, self.memory_total - self.memory_allocated)

    @property
    def cores_free(self) -> int:
        return max(0, self.cores_total - self.cores_allocated)


@dataclass
class Status:
    gpus: list[GpuStatus]
    claims: list[ClaimShare]
    live_nodes: list[str] = field(default_factory=list)  # nodes whose metrics were read
    errors: list[str] = field(default_factory=list)  # metrics endpoints that did not answer


# ---- pure ----------------------------------------------------------------------------------


def _quantity(value: Any, default: int) -> int:
    try:
        return parse_quantity(str(value)) if value is not None else default
    except QuantityError:
        return default


def _newest_pools(slices: Iterable[JSON]) -> list[JSON]:
    newest: dict[tuple[str, str], int] = {}
    items = list(slices)
    for obj in items:
        pool = obj["spec"]["pool"]
        key = (obj["spec"].get("nodeName") or "", pool["name"])
        newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
    return [
        obj
        for obj in items
        if int(obj["spec"]["pool"].get("generation") or 0)
        == newest[(obj["spec"].get("nodeName") or "", obj["spec"]["pool"]["name"])]
    ]


def build_status(
    slices: Iterable[JSON],
    claims: Iterable[JSON],
    *,
    driver: str = names.DEFAULT_DRIVER_NAME,
    live: Mapping[str, Sequence[tuple[str, Mapping[str, str], float]]] | None = None,
) -> Status:
    """The status from listed objects; `live` maps node -> its metrics samples."""
    gpus: dict[tuple[str, str], GpuStatus] = {}
    for obj in _newest_pools(s for s in slices if s["spec"].get("driver") == driver):
        node = obj["spec"].get("nodeName") or obj["spec"]["pool"]["name"]
        for device in obj["spec"].get("devices") or []:
            attrs = device.get("attributes") or {}
            capacity = device.get("capacity") or {}
            gpus[(node, device["name"])] = GpuStatus(
                node=node,
                device=device["name"],
                uuid=str((attrs.get("uuid") or {}).get("string", "")),
                product=str((attrs.get("productName") or {}).get("string", "")),
                memory_total=_quantity((capacity.get(names.CAPACITY_MEMORY) or {}).get("value"), 0),
                cores_total=_quantity(
                    (capacity.get(names.CAPACITY_CORES) or {}).get("value"), FULL_CORES
                ),
            )
    shares: list[ClaimShare] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        pods = [
            str(r.get("name"))
            for r in status.get("reservedFor") or []
            if r.get("resource") == "pods"
        ]
        per_device: dict[tuple[str, str], ClaimShare] = {}
        for result in results:
            if result.get("driver") != driver or result.get("adminAccess"):
                continue
            node, device = str(result.get("pool", "")), str(result.get("device", ""))
            gpu = gpus.get((node, device))
            consumed = result.get("consumedCapacity") or {}
            whole = gpu.memory_total if gpu is not None else 0
            memory = _quantity(consumed.get(names.CAPACITY_MEMORY), whole)
            cores = _quantity(consumed.get(names.CAPACITY_CORES), 0)
            share = per_device.get((node, device))
            if share is None:
                share = per_device[(node, device)] = ClaimShare(
                    namespace=str(meta.get("namespace", "")),
                    claim=str(meta.get("name", "")),
                    node=node,
                    device=device,
                    memory=0,
                    cores=0,
                    pods=pods,
                )
            share.memory += memory
            share.cores += cores
        for (node, device), share in per_device.items():
            gpu = gpus.get((node, device))
            if gpu is not None:
                gpu.memory_allocated += share.memory
                gpu.cores_allocated += share.cores
                gpu.claims += 1
            shares.append(share)
    result_status = Status(
        gpus=sorted(gpus.values(), key=lambda g: (g.node, _natural(g.device))),
        claims=sorted(shares, key=lambda s: (s.namespace, s.claim, s.node, _natural(s.device))),
    )
    for node, samples in (live or {}).items():
        _apply_live(result_status, node, samples)
        result_status.live_nodes.append(node)
    return result_status


def _natural(name: str) -> tuple[str, int]:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def _apply_live(
    status: Status, node: str, samples: Sequence[tuple[str, Mapping[str, str], float]]
) -> None:
    gpus = {g.device: g for g in status.gpus if g.node == node}
    claims = {(c.namespace, c.claim, c.device): c for c in status.claims if c.node == node}
    for name, labels, value in samples:
        if labels.get("node", node) != node:
            continue
        gpu = gpus.get(labels.get("device", ""))
        if name == "vgpu_dra_gpu_memory_used_bytes" and gpu is not None:
            gpu.memory_used = max(0, int(value))
        elif name == "vgpu_dra_gpu_utilization_ratio" and gpu is not None:
            gpu.utilization = min(1.0, max(0.0, value))
        elif name in ("vgpu_dra_claim_memory_used_bytes", "vgpu_dra_claim_utilization_ratio"):
            share = claims.get(
                (labels.get("namespace", ""), labels.get("claim", ""), labels.get("device", ""))
            )
            if share is None:
                continue
            if name == "vgpu_dra_claim_memory_used_bytes":
                share.memory_used = max(0, int(value))
            else:
                share.utilization = min(1.0, max(0.0, value))


# ---- rendering -----------------------------------------------------------------------------

_RED, _YELLOW, _GREEN, _BOLD, _RESET = "\033[31m", "\033[33m", "\033[32m", "\033[1m", "\033[0m"


def _mem(value: int | None) -> str:
    """Bytes for people: exact quantities as Kubernetes writes them (80Gi), else one decimal."""
    if value is None:
        return "-"
    exact = format_quantity(value)
    if len(exact) <= 6:
        return exact
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value >= unit:
            return f"{value / unit:.1f}{suffix}"
    return str(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _free_colour(free: int, total: int) -> str:
    if total <= 0 or free <= 0:
        return _RED
    return _YELLOW if free / total < 0.2 else _GREEN


def _table(rows: list[list[tuple[str, str]]], header: list[str], colour: bool) -> list[str]:
    """Left-aligned columns, two spaces apart; a cell is (text, ANSI colour or "")."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))

    def line(cells: list[tuple[str, str]]) -> str:
        out = []
        for i, (text, code) in enumerate(cells):
            padded = text.ljust(widths[i]) if i < len(cells) - 1 else text
            out.append(f"{code}{padded}{_RESET}" if colour and code else padded)
        return "  ".join(out).rstrip()

    head = line([(h, _BOLD) for h in header])
    return [head, *(line(row) for row in rows)]


def render_table(status: Status, *, wide: bool = False, colour: bool = False) -> str:
    header = ["NODE", "GPU", "MEMORY", "ALLOCATED", "FREE", "CORES FREE", "CLAIMS"]
    header += ["USED", "UTIL"]
    if wide:
        header += ["PRODUCT", "UUID"]
    rows = []
    for g in status.gpus:
        row = [
            (g.node, ""),
            (g.device, ""),
            (_mem(g.memory_total), ""),
            (_mem(g.memory_allocated), ""),
            (_mem(g.memory_free), _free_colour(g.memory_free, g.memory_total)),
            (f"{g.cores_free}%", _free_colour(g.cores_free, g.cores_total)),
            (str(g.claims), ""),
            (_mem(g.memory_used), ""),
            (_pct(g.utilization), ""),
        ]
        if wide:
            row += [(g.product, ""), (g.uuid, "")]
        rows.append(row)
    lines = _table(rows, header, colour) if rows else ["No GPUs published by vgpu-dra."]
    claim_header = ["NAMESPACE", "CLAIM", "NODE", "GPU", "MEMORY", "CORES", "USED", "UTIL"]
    if wide:
        claim_header.append("PODS")
    claim_rows = []
    for c in status.claims:
        row = [
            (c.namespace, ""),
            (c.claim, ""),
            (c.node, ""),
            (c.device, ""),
            (_mem(c.memory), ""),
            (f"{c.cores}%" if c.cores else "-", ""),
            (_mem(c.memory_used), ""),
            (_pct(c.utilization), ""),
        ]
        if wide:
            row.append((",".join(c.pods) or "-", ""))
        claim_rows.append(row)
    lines.append("")
    lines += _table(claim_rows, claim_header, colour) if claim_rows else ["No allocated claims."]
    for error in status.errors:
        lines.append(f"warning: {error}")
    return "\n".join(lines) + "\n"


def render_json(status: Status) -> str:
    gpus = [
        {**asdict(g), "memory_free": g.memory_free, "cores_free": g.cores_free} for g in status.gpus
    ]
    document = {
        "gpus": gpus,
        "claims": [asdict(c) for c in status.claims],
        "live_nodes": status.live_nodes,
        "errors": status.errors,
    }
    return json.dumps(document, indent=2) + "\n"


# ---- I/O -----------------------------------------------------------------------------------


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Exposition text, parsed with Prometheus' text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def fetch_metrics(url: str, timeout_s: float = 5.0) -> list[tuple[str, dict[str, str], float]]:
    """One scrape of a plugin's /metrics, parsed with Prometheus' text parser."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse_metrics(response.read().decode())


def collect(
    client: kube.KubeClient, *, driver: str, endpoints: Mapping[str, str | Endpoint]
) -> Status:
    """The status; `endpoints` maps node -> its plugin's /metrics URL or an `Endpoint`."""
    slices = client.list(
        kube.path(kube.RESOURCE_API, "resourceslices"), field_selector=f"spec.driver={driver}"
    )
    claims = client.list(kube.path(kube.RESOURCE_API, "resourceclaims"))
    live: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    errors: list[str] = []

    def scrape(item: tuple[str, str | Endpoint]) -> None:
        node, given = item
        endpoint = url_endpoint(given) if isinstance(given, str) else given
        try:
            live[node] = parse_metrics(endpoint.fetch())
        except (OSError, ValueError, kube.KubeError) as exc:
            errors.append(f"metrics of {node} ({endpoint.where}) unavailable: {exc}")

    # One node after the other would take minutes on a large cluster (a round trip each).
    with ThreadPoolExecutor(max_workers=SCRAPERS) as pool:
        list(pool.map(scrape, sorted(endpoints.items())))
    errors.sort()
    status = build_status(slices, claims, driver=driver, live=dict(sorted(live.items())))
    status.errors = errors
    return status


def discover(
    client: kube.KubeClient, *, driver: str, explicit: Mapping[str, str | Endpoint]
) -> tuple[dict[str, str | Endpoint], list[str]]:
    """Every node's metrics endpoint: the chart's plugin pods, overridden by the explicit ones;
    plus a warning when the pods cannot be listed."""
    found: dict[str, str | Endpoint] = {}
    warnings: list[str] = []
    try:
        found.update(from_plugin_pods(client, driver))
    except kube.KubeError as exc:
        warnings.append(f"cannot look for the kubelet plugins' metrics (list pods): {exc}")
    found.update(explicit)
    return found, warnings


def _endpoint(text: str) -> tuple[str, str]:
    node, sep, url = text.partition("=")
    if not sep or not node or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(
            f"expected NODE=URL (e.g. node-1=http://127.0.0.1:9402/metrics), got {text!r}"
        )
    return node, url


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vgpu-dra status",
        description="GPUs, claims, allocated and free memory/cores per GPU (and live usage "
        "where a node's metrics endpoint is given).",
    )
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (env KUBECONFIG); default: in-cluster credentials",
    )
    parser.add_argument("--driver-name", default=names.DEFAULT_DRIVER_NAME)
    parser.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table")
    parser.add_argument(
        "--metrics-endpoint",
        action="append",
        type=_endpoint,
        default=[],
        metavar="NODE=URL",
        help="a kubelet plugin's /metrics URL, for live usage (repeatable); overrides the "
        "endpoint found for that node",
    )
    parser.add_argument(
        "--no-discover",
        action="store_true",
        help="read live figures only from the --metrics-endpoint URLs",
    )
    parser.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="auto = on a TTY"
    )
    return parser


def main(
    argv: Sequence[str],
    stdout: TextIO | None = None,
    *,
    endpoints: Mapping[str, str | Endpoint] | None = None,
) -> int:
    """`vgpu-dra status`; `endpoints` are explicit ones given by a caller (the test bed's
    `dev-cluster gpus`), as `--metrics-endpoint` flags are (those win over them)."""
    args = build_parser().parse_args(list(argv))
    out = stdout or sys.stdout
    kubeconfig = args.kubeconfig
    try:
        client = kube.KubeClient.from_kubeconfig(kubeconfig)
    except Exception as exc:  # the client raises several unrelated types for bad configs
        print(f"vgpu-dra status: cannot load Kubernetes credentials: {exc}", file=sys.stderr)
        return 1
    try:
        explicit: dict[str, str | Endpoint] = {**(endpoints or {}), **dict(args.metrics_endpoint)}
        found: dict[str, str | Endpoint] = dict(explicit)
        warnings: list[str] = []
        if not args.no_discover:
            found, warnings = discover(client, driver=args.driver_name, explicit=explicit)
        status = collect(client, driver=args.driver_name, endpoints=found)
        status.errors = warnings + status.errors
    except kube.KubeError as exc:
        print(f"vgpu-dra status: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.output == "json":
        out.write(render_json(status))
        return 0
    colour = args.color == "always" or (
        args.color == "auto" and out.isatty() and "NO_COLOR" not in os.environ
    )
    out.write(render_table(status, wide=args.output == "wide", colour=colour))
    return 0
