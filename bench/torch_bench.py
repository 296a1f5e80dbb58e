"""PyTorch under vgpu_hook on simulated GPUs. Writes bench/results/torch.json.

Measured with torch 2.15 from PyPI, unmodified (`make torch`), its CUDA runtime being the
simulator's libcudart.so.13, every program inside a claim through vgpu_testbed.container (the
hook preloaded by /etc/ld.so.preload, as in a container) on the hook tests' simulated A100:
- compute-cap accuracy: one tenant per cap 10/30/50/70 % running a loop of torch elementwise
  kernels (`x.add_(1)` on 442,368 floats: 432 blocks, 4 waves of the simulated driver's default
  20 us kernel), measured exactly like the driver-API bench (tests/integration/vgpu_hook/
  computecap.py: the simulated NVML sampled every 100 ms, mean absolute error of 0.5 s windows
  from the cap after settling), with the hook's in-process controller and with the node
  governor, under realistic NVML sampling. Target (bench/hook_bench.py's): MAE <= 1 point.
- the hook's overhead on a loop of small torch kernels: time per `x.add_(1)` on 1,024 floats
  (1 block; VGPU_SIM_KERNEL_NS=VGPU_SIM_LAUNCH_NS=100: 0.2 us of simulated GPU time, so the loop
  is bound by torch's and the launch path's CPU time, not by the simulated GPU) inside a claim
  with the hook (cores=0: the limiter idle) against the same loop without the hook, as a
  ratio. Best (minimum) of RUNS runs each.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from bench.common import write_results
from bench.hook_bench import _bench_node
from tests.integration.frameworks.torchenv import CHECKS, torch_python
from tests.integration.vgpu_hook import conftest as hook_env
from tests.integration.vgpu_hook.computecap import run_tenants

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "torch.json"
CAPS = (10, 30, 50, 70)
SECONDS = 6.0
SETTLE_S = 4.0  # torch's import and CUDA start take 1.5-3 s of the sampler's first seconds
RUNS = 5
LOOP_S = 3.0
SMALL_KERNEL_NS = "100"  # and VGPU_SIM_LAUNCH_NS: 0.2 us of simulated GPU time per kernel


def _per_launch_us(stdout: str) -> float:
    m = re.search(r"per_launch_us=([0-9.]+)", stdout)
    if m is None:
        raise RuntimeError(f"no per_launch_us in {stdout!r}")
    return float(m.group(1))


def _overhead(node: hook_env.Node, python: Path) -> dict[str, Any]:
    argv = [str(python), "-W", "ignore", str(CHECKS), "--compute", str(LOOP_S), "--numel", "1024"]
    small = {"VGPU_SIM_KERNEL_NS": SMALL_KERNEL_NS, "VGPU_SIM_LAUNCH_NS": SMALL_KERNEL_NS}
    env = dict(node.env, **small)
    claim = node.claim(
        "torch-overhead", [f"device uuid={hook_env.UUIDS[0]} memory={1 << 34} cores=0"]
    )
    hooked, plain = [], []
    for _ in range(RUNS):
        done = claim.run(argv, timeout=120, **small)
        if done.returncode != 0:
            raise RuntimeError(f"hooked loop failed: {done.stderr}")
        hooked.append(_per_launch_us(done.stdout))
        done = subprocess.run(
            argv, check=False, env=env, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"plain loop failed: {done.stderr}")
        plain.append(_per_launch_us(done.stdout))
    best_hooked, best_plain = min(hooked), min(plain)
    return {
        "kernel": "x.add_(1) on 1024 float32 (1 block)",
        "simulated_kernel_ns": int(SMALL_KERNEL_NS),
        "simulated_launch_ns": int(SMALL_KERNEL_NS),
        "loop_seconds": LOOP_S,
        "with_hook_us_per_launch": hooked,
        "without_hook_us_per_launch": plain,
        "best_with_hook_us": best_hooked,
        "best_without_hook_us": best_plain,
        "ratio_with_to_without": round(best_hooked / best_plain, 3),
    }


def _accuracy(node: hook_env.Node, python: Path, sampling: str) -> dict[str, Any]:
    argv = [str(python), "-W", "ignore", str(CHECKS), "--compute", str(SECONDS + 6)]
    table: dict[str, Any] = {"sampling": sampling, "seconds": SECONDS, "settle_s": SETTLE_S}
    for governor in (False, True):
        table["governor" if governor else "in_process"] = [
            run_tenants(
                node,
                [cap],
                seconds=SECONDS + SETTLE_S - 2.0,
                governor=governor,
                sampling=sampling,
                settle_s=SETTLE_S,
                tenant_argv=argv,
            )[0]
            for cap in CAPS
        ]
    return table


def main() -> None:
    python = torch_python()
    if python is None:
        raise RuntimeError("the torch environment is not installed: make torch")
    with _bench_node() as node:
        result: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "conditions": {"load_average_at_start": list(os.getloadavg())},
            "torch": subprocess.run(
                [str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip(),
            "target": {"mae_points_max_realistic": 1.0},
            "compute_cap_accuracy": _accuracy(node, python, "realistic"),
            "overhead_small_kernels": _overhead(node, python),
        }
        result["conditions"]["load_average_at_end"] = list(os.getloadavg())
        write_results(RESULTS, result)
        acc = result["compute_cap_accuracy"]
        for mode in ("in_process", "governor"):
            print(mode, [(r["cap"], r["mean_util"], r["mae"]) for r in acc[mode]])
        print("overhead ratio:", result["overhead_small_kernels"]["ratio_with_to_without"])
