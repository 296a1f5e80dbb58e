"""Cost and fidelity of the simulated GPU node's shared state and of the fake NVML.

Setup: `make -C hack/fakegpu bench-programs`, a fresh `a100-2x4` node from
`vgpu_testbed.fakegpu.simulator.prepare_node` in a temporary directory; every figure comes from
separate processes (hack/fakegpu/tests/bench_simstate.c, pynvml in a child interpreter).

Measured:
- `state_ns`: ns per call of the state's hot paths: submit work, reserve+release 4 KiB, memory
  in use with 9 live processes on the GPU (liveness checks included), utilisation query;
- `attach_storm`: N processes attach and reserve memory at the same moment (the start-up storm
  that takes a peer's shared region ~1 minute with hundreds of processes): wall ms until all
  are done, and failures;
- `utilisation`: work offered at 25/50/90 % duty cycle (1 ms period) for 1 s: the utilisation
  the state reports over NVML's 1/6 s window and over 1 s, next to the exact busy fraction of
  what was submitted (fidelity of the accounting, not of a real GPU);
- `nvml_us`: us per pynvml call against the fake library (memory info, utilisation, running
  processes, UUID), median of 5 rounds of 2000 calls.
No targets: figures to watch. Writes bench/results/fakegpu_state.json.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import write_results
from vgpu_testbed.fakegpu.simulator import load_profile, prepare_node

REPO = Path(__file__).resolve().parents[1]
FAKEGPU = REPO / "hack" / "fakegpu"
PROGRAM = FAKEGPU / "build" / "bench" / "simstate"
RESULTS = Path(__file__).parent / "results" / "fakegpu_state.json"

NVML_TIMING = """
import json, time, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(1)
calls = {
    "memory_info": lambda: n.nvmlDeviceGetMemoryInfo(h),
    "utilization_rates": lambda: n.nvmlDeviceGetUtilizationRates(h),
    "compute_processes": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
    "uuid": lambda: n.nvmlDeviceGetUUID(h),
}
out = {}
for name, call in calls.items():
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(2000):
            call()
        rounds.append((time.perf_counter() - t0) / 2000 * 1e6)
    out[name] = sorted(rounds)[2]
print(json.dumps(out))
"""


def _kv(out: str) -> dict[str, float]:
    pairs = (kv.split("=") for line in out.splitlines() for kv in line.split())
    return {k: float(v) for k, v in pairs}


def _run(env: dict[str, str], *args: str) -> dict[str, float]:
    done = subprocess.run(
        [str(PROGRAM), *args], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return _kv(done.stdout)


def main() -> None:
    subprocess.run(["make", "-s", "-C", str(FAKEGPU), "bench-programs"], check=True)
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-") as tmp:
        env = {**os.environ, **prepare_node(load_profile("a100-2x4"), Path(tmp) / "n.state")}
        ops = min((_run(env, "ops") for _ in range(3)), key=lambda r: r["submit_work_ns"])
        storms = {str(n): _run(env, "storm", str(n)) for n in (50, 200)}
        duty = {str(p): _run(env, "duty", str(p)) for p in (25, 50, 90)}
        nvml = json.loads(
            subprocess.run(
                [sys.executable, "-c", NVML_TIMING],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            ).stdout
        )
    result: dict[str, Any] = {
        "benchmark": "fakegpu_state",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_1m": round(os.getloadavg()[0], 2),
        },
        "state_ns": ops,
        "attach_storm": {
            n: {"wall_ms": r["wall_ms"], "failed": int(r["failed"])} for n, r in storms.items()
        },
        "utilisation": {
            p: {
                "offered_1s": r["offered_1s"],
                "reported_window": r["util_window"],
                "expected_window": r["expected_window"],
                "reported_1s": r["util_1s"],
            }
            for p, r in duty.items()
        },
        "utilisation_max_abs_error_points": round(
            max(
                max(
                    abs(r["util_window"] - r["expected_window"]),
                    abs(r["util_1s"] - r["expected_1s"]),
                )
                for r in duty.values()
            ),
            2,
        ),
        "nvml_us": {k: round(v, 2) for k, v in nvml.items()},
        "nvml_us_median": round(statistics.median(nvml.values()), 2),
    }
    write_results(RESULTS, result)


if __name__ == "__main__":
    main()
