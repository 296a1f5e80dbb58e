"""Cost and fidelity of the fake CUDA driver (hack/fakegpu libcuda.so.1) on a simulated dgx-h100.

Setup: `make -C hack/fakegpu all`, a fresh node from `vgpu_testbed.fakegpu.simulator.prepare_node`
in a temporary directory; every figure comes from separate processes that load the fake library
through LD_LIBRARY_PATH, as real clients do.

Measured:
- `calls`: ns per call of the hot paths (hack/fakegpu/tests/cuda_programs/cuda_bench.c): an
  enqueued launch, a launch + stream synchronisation round trip, a 4 KiB alloc + free, cuMemGetInfo,
  cuGetProcAddress_v2 (median of 5 rounds);
- `solo`: one `cuda_spin` loop of 100 us kernels for 2 s: the GPU busy fraction it achieves
  (launches x 100 us / wall time), without and with a synchronisation after every launch;
- `pair`: two such loops on one GPU: each one's share of the launches and the busy fraction.
No targets: these are figures to watch. Writes bench/results/fakegpu_cuda.json.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import utc_stamp, write_results
from vgpu_testbed.fakegpu.simulator import load_profile, prepare_node

REPO = Path(__file__).resolve().parents[1]
FAKEGPU = REPO / "hack" / "fakegpu"
PROGRAMS = FAKEGPU / "build" / "cuda_programs"
RESULTS = Path(__file__).parent / "results" / "fakegpu_cuda.json"
KERNEL_S = 100e-6
SPIN_ENV = {"CUDA_SPIN_KERNEL": "spin__ns100000", "VGPU_SIM_LAUNCH_NS": "0"}


def _spin_args(gpu: int, seconds: float, sync_every: int) -> list[str]:
    # BLOCKS = 132 (one wave on an H100), then how often to synchronise.
    return [str(PROGRAMS / "cuda_spin"), str(gpu), str(seconds), "132", str(sync_every)]


def _parse_spin(out: str) -> dict[str, float]:
    last = out.strip().splitlines()[-1]
    return {k: float(v) for k, v in (kv.split("=") for kv in last.split())}


def _spin(env: dict[str, str], gpu: int, seconds: float, sync_every: int) -> dict[str, float]:
    out = subprocess.run(
        _spin_args(gpu, seconds, sync_every),
        env={**env, **SPIN_ENV},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    r = _parse_spin(out)
    return {"launches": r["launches"], "busy": round(r["launches"] * KERNEL_S / r["seconds"], 3)}


def _pair(env: dict[str, str], gpu: int, seconds: float) -> dict[str, Any]:
    procs = [
        subprocess.Popen(
            _spin_args(gpu, seconds, 0),
            env={**env, **SPIN_ENV},
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [_parse_spin(p.communicate()[0]) for p in procs]
    total = sum(r["launches"] for r in results)
    wall = max(r["seconds"] for r in results)
    return {
        "shares": [round(r["launches"] / total, 3) for r in results],
        "busy": round(total * KERNEL_S / wall, 3),
    }


def main(argv: Sequence[str] = ()) -> None:
    subprocess.run(["make", "-s", "-C", str(FAKEGPU), "all"], check=True)
    with tempfile.TemporaryDirectory(prefix="fakegpu-bench-") as tmp:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **prepare_node(load_profile("dgx-h100"), Path(tmp) / "node.state"),
        }
        calls_out = subprocess.run(
            [str(PROGRAMS / "cuda_bench"), "0", "20000"],
            env={**env, "VGPU_SIM_LAUNCH_NS": "0"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        results = {
            "benchmark": "fakegpu_cuda",
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "load_1m": round(os.getloadavg()[0], 2),
            },
            "calls": json.loads(calls_out),
            "solo": {
                "no_sync": _spin(env, 1, 2.0, 0),
                "sync_every_launch": _spin(env, 2, 2.0, 1),
            },
            "pair": _pair(env, 3, 2.0),
            "time": utc_stamp(),
        }
    write_results(RESULTS, results)


if __name__ == "__main__":
    main(sys.argv[1:])
