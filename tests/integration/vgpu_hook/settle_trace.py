"""Repeat one settling case on the simulated GPU and keep the trace of the slow runs.

A debugging aid for the controllers (docs/vgpu-hook.md "Settling"), not a test:
`python -m tests.integration.vgpu_hook.settle_trace <governor|in_process> <fixed|balance>
<exact|realistic> RUNS OUT_DIR` runs the case RUNS times (as bench/hook_bench.py does) and
writes, per run, its settling figures and, into OUT_DIR/run-<i>.json, the truth sampled every
50 ms, each claim's region every 3 ms (rate, cost, the controller's state) and the governor's
step log (OUT_DIR "-": no trace, the runs as the bench makes them). Prints one line per run
with the load average.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.hook_bench import _bench_node
from tests.integration.vgpu_hook.computecap import run_tenants


def main() -> None:
    mode, policy, sampling, runs, out = sys.argv[1:6]
    out_dir = None if out == "-" else Path(out)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    caps = [30] if policy == "fixed" else [30, 70]
    with _bench_node() as node:
        for i in range(int(runs)):
            settling: dict[str, float] = {}
            trace: dict[str, Any] | None = None if out_dir is None else {}
            load = os.getloadavg()
            run_tenants(
                node,
                caps,
                seconds=3 if policy == "fixed" else 4,
                governor=mode == "governor",
                policy=policy,
                sampling=sampling,
                interval=0.05,
                settle_s=1.0 if policy == "fixed" else 1.5,
                settling=settling,
                trace=trace,
            )
            if out_dir is not None and trace is not None:
                trace.update(settling=settling, load=load, caps=caps)
                (out_dir / f"run-{i}.json").write_text(json.dumps(trace))
            print(json.dumps({"run": i, "load": load, **settling}), flush=True)


if __name__ == "__main__":
    main()
