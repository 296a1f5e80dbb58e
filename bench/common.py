"""What the benchmarks share, so each `*_bench.py` holds only its measurement: how a result
document is written (bench/results/<name>.json, echoed to stdout) and time-stamped, and for the
benchmarks that drive a real Preparer over gRPC with the test claim data (prepare, telemetry):
its node settings, the request for a set of claims and the latency percentiles they report."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.prepare import NodeSettings
from kubelet_plugin.proto import dra_v1_pb2
from tests.fixtures.prepare import node_settings as fixture_settings


def write_results(path: Path, document: Mapping[str, Any]) -> None:
    """Write `document` as the benchmark's JSON result at `path` and print it."""
    text = json.dumps(document, indent=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    print(text)


def utc_stamp() -> str:
    """The time a result was taken, as recorded in every result document."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def machine() -> dict[str, Any]:
    """What a result document records about the machine it was taken on."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def machine_at_start() -> dict[str, Any]:
    """The machine record of the benches that also note the load at their end
    (`load_average_at_end`, set by each when it finishes)."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg()[0],
    }


def node_settings(base: Path) -> NodeSettings:
    """Settings of a Preparer for the test node whose CDI specs and claim state live under base
    (claim dirs owned by group 0, as the plugin's default --claim-gid)."""
    return fixture_settings(base, claim_gid=0)


def percentiles(samples_s: Sequence[float]) -> dict[str, float]:
    """Latency figures (ms) of samples in seconds: n, p50/p90/p99 (nearest rank), max, mean."""
    ordered = sorted(samples_s)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)

    return {
        "n": len(ordered),
        "p50_ms": at(0.50),
        "p90_ms": at(0.90),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1] * 1e3, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1e3, 3),
    }


def request(refs: Sequence[ClaimRef]) -> list[dra_v1_pb2.Claim]:
    """The NodePrepare/NodeUnprepare request entries naming these claims."""
    return [dra_v1_pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
