"""What a soak watches over time, and whether it stays flat: a process's resident memory, open
file descriptors and threads (from /proc), the kubelet plugin's checkpoint size, and the API
objects the plugin and the controller make; least-squares slopes of each series.

Used by bench/soak_bench.py. A series is judged flat when the growth its fitted line predicts
over the whole measured window stays under a floor (`FLOORS`: what noise and caches make) or
5 % of its mean, whichever is larger.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver import kube
from dra_driver.kube import RESOURCE_API, KubeClient
from kubelet_plugin.checkpoint import COMPACT_AFTER, CheckpointError, CheckpointJournal

# Growth over the window that still counts as flat, per kind of series. The checkpoint's files
# grow by one journal line per prepare and unprepare (up to ~0.7 KiB each) until the journal is
# compacted every COMPACT_AFTER records: a saw tooth whose teeth are that high.
FLOORS = {
    "rss_mib": 4.0,
    "fds": 5.0,
    "threads": 2.0,
    "checkpoint_kib": COMPACT_AFTER * 0.7,
    "objects": 10.0,
}


def process_stats(pid: int | None) -> dict[str, float] | None:
    """RSS (MiB), open fds and threads of a live process; None when it is gone."""
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kib = int(fields.get("VmRSS", "0 kB").split()[0])
    return {
        "rss_mib": round(rss_kib / 1024, 2),
        "fds": float(fds),
        "threads": float(int(fields.get("Threads", "0").strip())),
    }


def checkpoint_kib(state_dir: Path) -> float:
    total = 0
    for name in ("checkpoint.json", "checkpoint.log"):
        with contextlib.suppress(OSError):
            total += (state_dir / name).stat().st_size
    return round(total / 1024, 2)


def checkpoint_claims(state_dir: Path) -> float:
    """Claims the checkpoint holds (what it describes, whatever the size of its files)."""
    try:
        return float(len(CheckpointJournal(str(state_dir)).load()))
    except (OSError, CheckpointError):
        return float("nan")


def api_objects(client: KubeClient, namespace: str, system_ns: str) -> dict[str, float]:
    """Counts of the objects the churn, the plugin and the controller leave in the API."""

    def count(path: str, **selectors: str) -> float:
        try:
            return float(len(client.list(path, **selectors)))
        except kube.KubeError:
            return float("nan")

    def ours() -> float:
        """Events the plugin and the controller wrote (their reportingComponent)."""
        try:
            events = client.list(kube.path("v1", "events", namespace=namespace))
        except kube.KubeError:
            return float("nan")
        return float(
            sum(1 for e in events if str(e.get("reportingComponent", "")).startswith("vgpu-dra"))
        )

    return {
        "pods": count(kube.path("v1", "pods", namespace=namespace)),
        "resourceclaims": count(kube.path(RESOURCE_API, "resourceclaims", namespace=namespace)),
        "resourceclaimtemplates": count(
            kube.path(RESOURCE_API, "resourceclaimtemplates", namespace=namespace)
        ),
        "resourceslices": count(kube.path(RESOURCE_API, "resourceslices")),
        "events_tenant": count(kube.path("v1", "events", namespace=namespace)),
        "events_vgpu_dra": ours(),
        "events_system": count(kube.path("v1", "events", namespace=system_ns)),
        "leases_system": count(kube.path("coordination.k8s.io/v1", "leases", namespace=system_ns)),
    }


def slope_per_hour(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of values against time, in units per hour (0 for < 3 points)."""
    points = [(t, v) for t, v in zip(times_s, values, strict=True) if not math.isnan(v)]
    if len(points) < 3:
        return 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600.0


def judge(kind: str, times_s: Sequence[float], values: Sequence[float]) -> dict[str, Any]:
    """Slope, the growth it predicts over the window, and whether that is flat."""
    finite = [v for v in values if not math.isnan(v)]
    if len(finite) < 3:
        return {"slope_per_hour": None, "flat": None, "n": len(finite)}
    slope = slope_per_hour(times_s, values)
    window_h = (times_s[-1] - times_s[0]) / 3600.0
    growth = slope * window_h
    mean = statistics.fmean(finite)
    limit = max(FLOORS[kind], 0.05 * abs(mean))
    return {
        "first": finite[0],
        "last": finite[-1],
        "min": min(finite),
        "max": max(finite),
        "mean": round(mean, 2),
        "slope_per_hour": round(slope, 3),
        "growth_over_window": round(growth, 3),
        "flat_limit": round(limit, 3),
        "flat": growth <= limit,
        "n": len(finite),
    }
