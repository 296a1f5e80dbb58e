"""Soak (issue 29): hours of churn on the fault run's bed, and whether anything grows.
`python -m bench soak --minutes N` (default 120; `--sample-s` 30, `--out`; `--rejudge PATH`
judges the series of an earlier result again).

The bed is the fault run's (vgpu_testbed.faults.bed: a real control plane, two real nodes with the
kubelet plugin, two controller replicas, the webhook) and so is the churn (vgpu_testbed.faults.
churn: one pod every 2 s, each running 10-30 s, of every kind), without faults. Every
`--sample-s` seconds: resident memory, open file descriptors and threads of each node's kubelet
plugin and of both controller replicas (and, for context, of kube-apiserver and etcd), the size of
each plugin's checkpoint (snapshot + journal; a saw tooth, the journal compacted every 1,024
records) and the claims it holds, and the API objects the churn, the plugin and the
controller leave (pods, claims, templates, slices, Events, Leases). The invariants of the fault
run are checked all along, and at the end every pod is deleted and the nodes must be clean.

Each series gets a least-squares slope over the run after a warm-up (the first tenth, at least
2 minutes: caches filling, the first templates, the Python allocator reaching its working set)
and a verdict: flat when the growth the slope predicts over the measured window is under a floor
or 5 % of the mean (vgpu_testbed.faults.sampling.FLOORS). Writes bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import machine_at_start, utc_stamp, write_results
from vgpu_testbed.cluster import controller as bed_controller
from vgpu_testbed.faults import sampling
from vgpu_testbed.faults.bed import CONTROLLERS, ChaosBed
from vgpu_testbed.faults.churn import Churn
from vgpu_testbed.faults.invariants import Checker
from vgpu_testbed.faults.run import drain_and_check

RESULTS = Path(__file__).parent / "results" / "soak.json"
# Everyone's Events (the kubelet's, kube-scheduler's: Scheduled, Started, Killing...) live for the
# API server's --event-ttl (1 h), so their count grows for the first hour of any churn: reported,
# not judged. The plugin's and the controller's own Events (`events_vgpu_dra`) are judged.
NOT_JUDGED = ("objects.events_tenant", "objects.events_system")
JUDGED = ("plugin-node-1", "plugin-node-2", *CONTROLLERS)  # what must stay flat
CONTEXT = ("kube-apiserver", "etcd")  # reported, not judged


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench soak")
    parser.add_argument("--minutes", type=float, default=120.0)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--rejudge", type=Path, help="judge the series of an earlier result again, write --out"
    )
    return parser.parse_args(argv)


def pids(bed: ChaosBed) -> dict[str, Callable[[], int | None]]:
    def record(name: str) -> Callable[[], int | None]:
        return lambda: r.pid if (r := bed.record(name)) is not None else None

    found: dict[str, Callable[[], int | None]] = {}
    for name, node in bed.nodes.items():
        found[f"plugin-{name}"] = lambda n=node: n.inner_pid(n.plugin_process)
    for name in (*CONTROLLERS, *CONTEXT):
        found[name] = record(name)
    return found


def sample(bed: ChaosBed, watched: dict[str, Callable[[], int | None]]) -> dict[str, Any]:
    point: dict[str, Any] = {}
    for name, pid in watched.items():
        point[name] = sampling.process_stats(pid())
    point["checkpoint_kib"] = {
        name: sampling.checkpoint_kib(node.paths.state_dir) for name, node in bed.nodes.items()
    }
    point["checkpoint_claims"] = {
        name: sampling.checkpoint_claims(node.paths.state_dir) for name, node in bed.nodes.items()
    }
    point["objects"] = sampling.api_objects(bed.client, bed.namespace, bed_controller.NAMESPACE)
    return point


def judge(times: list[float], points: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    keep = [i for i, t in enumerate(times) if t >= warmup_s]
    ts = [times[i] for i in keep]
    verdicts: dict[str, Any] = {}
    for name in (*JUDGED, *CONTEXT):
        for metric in ("rss_mib", "fds", "threads"):
            values = [
                float(points[i][name][metric]) if points[i][name] else float("nan") for i in keep
            ]
            verdicts[f"{name}.{metric}"] = sampling.judge(metric, ts, values)
    for node in points[0]["checkpoint_kib"]:
        values = [float(points[i]["checkpoint_kib"][node]) for i in keep]
        verdicts[f"checkpoint.{node}.kib"] = sampling.judge("checkpoint_kib", ts, values)
        claims = [float(points[i].get("checkpoint_claims", {}).get(node, "nan")) for i in keep]
        verdicts[f"checkpoint.{node}.claims"] = sampling.judge("objects", ts, claims)
    for kind in points[0]["objects"]:
        values = [float(points[i]["objects"].get(kind, float("nan"))) for i in keep]
        verdicts[f"objects.{kind}"] = sampling.judge("objects", ts, values)
    return verdicts


def verdicts_of(times: list[float], points: list[dict[str, Any]]) -> dict[str, Any]:
    """The judgement of a run's series: warm-up excluded, each series' verdict, and whether
    every judged one is flat."""
    warmup_s = max(120.0, 0.1 * (times[-1] if times else 0.0))
    verdicts = judge(times, points, warmup_s)
    for name in NOT_JUDGED:
        if name in verdicts:
            verdicts[name]["judged"] = False
    judged = {
        k: v
        for k, v in verdicts.items()
        if v.get("judged", True)
        and (k.split(".")[0] in JUDGED or k.startswith(("checkpoint.", "objects.")))
    }
    return {
        "minutes_run": round(times[-1] / 60, 1) if times else 0,
        "warmup_excluded_s": warmup_s,
        "all_flat": all(v.get("flat") is not False for v in judged.values()),
        "not_flat": sorted(k for k, v in judged.items() if v.get("flat") is False),
        "verdicts": verdicts,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse(argv or [])
    if args.rejudge:
        earlier = json.loads(args.rejudge.read_text())
        series = earlier["series"]
        earlier.update(verdicts_of(series["t_s"], series["points"]))
        write_results(args.out, earlier)
        return
    started = time.monotonic()
    document: dict[str, Any] = {
        "benchmark": "soak",
        "machine": machine_at_start(),
        "minutes_asked": args.minutes,
        "sample_s": args.sample_s,
    }
    times: list[float] = []
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="soak-", dir="/tmp") as tmp:
        bed = ChaosBed.start(Path(tmp) / "c", say=lambda m: print(m, flush=True))
        churn = Churn(bed.client, bed.namespace, interval_s=2.0)
        checker = Checker(bed)
        watched = pids(bed)
        try:
            churn.start()
            checker.start()
            t0 = time.monotonic()
            deadline = t0 + args.minutes * 60
            while time.monotonic() < deadline:
                times.append(round(time.monotonic() - t0, 1))
                points.append(sample(bed, watched))
                plugin = points[-1]["plugin-node-1"] or {}
                print(
                    f"[{times[-1] / 60:6.1f} min] plugin-node-1 {plugin}, "
                    f"objects {points[-1]['objects']}",
                    flush=True,
                )
                time.sleep(max(0.0, t0 + len(times) * args.sample_s - time.monotonic()))
            drained = drain_and_check(bed, churn)
            churn.stop()
            checker.stop()
            summary = churn.summary()
            invariants = checker.report()
        finally:
            churn.stop()
            checker.stop()
            bed.stop()
    document.update(verdicts_of(times, points))
    document.update(
        {
            "churn": summary,
            "invariants": invariants,
            "final_drain": drained,
            "series": {"t_s": times, "points": points},
            "seconds_total": round(time.monotonic() - started, 1),
        }
    )
    document["machine"]["load_average_at_end"] = os.getloadavg()[0]
    document["time"] = utc_stamp()
    write_results(args.out, document)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
