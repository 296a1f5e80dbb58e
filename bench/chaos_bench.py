"""Faults of the whole system under churn (issue 29): `python -m bench chaos`.

A private test bed (vgpu_testbed.faults.bed: a real control plane, two real nodes, dgx-h100 and
a10-pcie, each a real kubelet, containerd and runc in its own namespaces with simulated GPUs and
the kubelet plugin; two controller replicas on one Lease behind one webhook address) runs a
steady churn of mixed pods (shares, whole GPUs, two-GPU NVLink claims, policy-path pods,
webhook-translated vgpu-manager pods, template and named claims: vgpu_testbed.faults.churn)
while faults are injected one at a time (`--repeats` times each), then in pairs. Recovery per
fault is the time from the fault's end (the kill, or the heal of a fault that lasts) until a
canary pod of each kind the fault touches runs (vgpu_testbed.faults.run); the invariants
(vgpu_testbed.faults.invariants) are checked every 5 s from the API and the nodes' files, and at
the end every pod is deleted and each node must be left with an empty checkpoint and no claim
file. docs/reliability.md reads the result.

Options: `--short` (the e2e suite's three faults), `--repeats N` (default 2), `--no-pairs`,
`--no-long-partition` (skip the 5-minute partition), `--only NAME[,NAME]` (fault names),
`--no-binding-conditions` (the plugin's default; the bed otherwise publishes devices with binding
conditions, as docs/scheduling.md advises with the controller installed), `--out PATH` (default
bench/results/chaos.json).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine_at_start, utc_stamp, write_results
from vgpu_testbed.faults import catalogue
from vgpu_testbed.faults import run as fault_run
from vgpu_testbed.faults.bed import BINDING_CONDITIONS, ChaosBed

RESULTS = Path(__file__).parent / "results" / "chaos.json"
NODES = ("node-1", "node-2")  # node-1 (8 GPUs) is the busy one: the plugin steps aim there


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench chaos")
    parser.add_argument("--short", action="store_true")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-pairs", action="store_true")
    parser.add_argument("--no-long-partition", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument(
        "--no-binding-conditions",
        action="store_true",
        help="the plugin's default: no binding conditions (both paths may double-book the API)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv or [])
    started = time.monotonic()
    document: dict[str, Any] = {
        "benchmark": "chaos",
        "machine": machine_at_start(),
        "bed": {
            "nodes": {"node-1": "dgx-h100 (8 GPUs, NVLink)", "node-2": "a10-pcie (4 GPUs)"},
            "runtime": "real (kubelet, containerd, runc per node)",
            "controllers": 2,
            "churn": "one pod every 2 s, each running 10-30 s",
        },
    }
    if args.short:
        plan = catalogue.short(NODES)
        repeats = 1
    else:
        first = catalogue.singles(long_partition=not args.no_long_partition, nodes=NODES)
        later = catalogue.singles(long_partition=False, nodes=NODES)
        plan = first + later * (args.repeats - 1)
        repeats = 1
        if not args.no_pairs:
            plan += catalogue.pairs(NODES)
    if args.only:
        wanted = set(args.only.split(","))
        plan = [s for s in plan if {f.name for f in s} <= wanted]
    with tempfile.TemporaryDirectory(prefix="chaos-", dir="/tmp") as tmp:
        plugin_args = () if args.no_binding_conditions else BINDING_CONDITIONS
        document["bed"]["plugin_args"] = list(plugin_args)
        bed = ChaosBed.start(
            Path(tmp) / "c", plugin_args=plugin_args, say=lambda m: print(m, flush=True)
        )
        try:
            result = fault_run.run(bed, plan, repeats=repeats, say=lambda m: print(m, flush=True))
        finally:
            bed.stop()
    document.update(result)
    document["seconds_total"] = round(time.monotonic() - started, 1)
    document["machine"]["load_average_at_end"] = os.getloadavg()[0]
    document["time"] = utc_stamp()
    write_results(args.out, document)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
