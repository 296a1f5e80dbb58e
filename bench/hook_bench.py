"""vgpu_hook overhead, start-up and compute-cap accuracy. Writes bench/results/hook.json.

Measured (each with-hook run goes through vgpu_testbed.container, i.e. the hook is preloaded
by /etc/ld.so.preload from a CDI spec exactly as in a container):
- per-call cost of cuLaunchKernel (limiter idle: cores=0; limiter active: cores=50 with the
  budget not yet binding), a cuMemAlloc+cuMemFree pair and cuMemGetInfo, with and without the
  hook, on two drivers: a null driver (vgpu_hook/build/nulldrv, returns at once, so the
  difference is the hook's own cost) and the simulated driver (hack/fakegpu, realistic but
  its own microseconds of work make the difference noisy). Best (minimum) of 5 runs each:
  the machine is shared, and the minimum is the run least disturbed by other load.
- start-up: 500 processes of one container initialising CUDA and allocating at once.
- compute-cap accuracy (needs the simulated NVML): mean absolute error of the measured SM
  utilisation from the cap at 10/30/50/70 % for one tenant, and two tenants capped 30/70.
Target: <= 30 ns added per launch with the limiter idle.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.integration.vgpu_hook import conftest as hook_env
from tests.integration.vgpu_hook.computecap import measure_accuracy
from vgpu_testbed.container import run_in_container

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "hook.json"
HOOK_BENCH = REPO / "vgpu_hook" / "build" / "hook_bench"
NULL_DRIVER = REPO / "vgpu_hook" / "build" / "nulldrv"
RUNS = 5


def _parse(stdout: str) -> dict[str, float]:
    line = [x for x in stdout.splitlines() if x.startswith("{")][-1]
    result: dict[str, float] = json.loads(line)
    return result


def _best(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in runs[0] if k.endswith("_ns")]
    return {k: round(min(r[k] for r in runs), 1) for k in keys}


def _overhead(node: hook_env.Node, driver_dir: Path, iterations: int) -> dict[str, Any]:
    env = dict(
        node.env, LD_LIBRARY_PATH=str(driver_dir), VGPU_SIM_LAUNCH_NS="0", VGPU_SIM_KERNEL_NS="0"
    )
    uuid = hook_env.UUIDS[0]
    if driver_dir == NULL_DRIVER:
        uuid = "GPU-11111111-1111-1111-1111-111111111111"  # what the null driver reports
    mem = 1 << 40
    idle = node.claim(f"idle-{driver_dir.name}", [f"device uuid={uuid} memory={mem} cores=0"])
    active = node.claim(f"active-{driver_dir.name}", [f"device uuid={uuid} memory={mem} cores=50"])
    argv = [str(HOOK_BENCH), str(iterations)]
    plain, with_idle, with_active = [], [], []
    for _ in range(RUNS):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        plain.append(_parse(done.stdout))
        for claim, sink in ((idle, with_idle), (active, with_active)):
            run = run_in_container(claim.spec, claim.device_names, argv, base_env=env)
            assert run.returncode == 0, run.stderr
            sink.append(_parse(run.stdout))
    base, hooked_idle, hooked_active = _best(plain), _best(with_idle), _best(with_active)
    return {
        "without_hook_ns": base,
        "with_hook_limiter_idle_ns": hooked_idle,
        "with_hook_limiter_active_ns": hooked_active,
        "added_ns": {
            "cuLaunchKernel_limiter_idle": round(
                hooked_idle["cuLaunchKernel_ns"] - base["cuLaunchKernel_ns"], 1
            ),
            "cuLaunchKernel_limiter_active": round(
                hooked_active["cuLaunchKernel_ns"] - base["cuLaunchKernel_ns"], 1
            ),
            "cuMemAlloc_cuMemFree_pair": round(
                hooked_idle["cuMemAlloc_cuMemFree_pair_ns"] - base["cuMemAlloc_cuMemFree_pair_ns"],
                1,
            ),
            "cuMemGetInfo": round(hooked_idle["cuMemGetInfo_ns"] - base["cuMemGetInfo_ns"], 1),
        },
    }


def _startup(node: hook_env.Node, processes: int) -> dict[str, Any]:
    claim = node.claim("startup", [f"device uuid={hook_env.UUIDS[0]} memory={1 << 34} cores=30"])
    script = (
        'start=$(date +%s%N); i=0; while [ $i -lt "$N" ]; do '
        '"$PROBE" init alloc:1048576 & i=$((i+1)); done; wait; '
        'echo "elapsed_ns=$(( $(date +%s%N) - start ))"'
    )
    argv = ["sh", "-c", script]
    env = dict(node.env, N=str(processes), PROBE=str(hook_env.PROBE))
    hooked = run_in_container(claim.spec, claim.device_names, argv, base_env=env, timeout=300)
    plain = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)

    def summary(out: str) -> dict[str, Any]:
        elapsed = int(out.rsplit("elapsed_ns=", 1)[1].split(maxsplit=1)[0])
        return {"seconds": round(elapsed / 1e9, 3), "ok": out.count("alloc rc=0")}

    return {
        "processes": processes,
        "with_hook": summary(hooked.stdout),
        "without_hook": summary(plain.stdout),
    }


def main() -> None:
    subprocess.run(["make", "-s", "-C", str(REPO / "vgpu_hook")], check=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "hack" / "fakegpu")], check=True)
    root = Path(tempfile.mkdtemp(prefix="hook-bench-"))
    try:
        profile = root / "profile.txt"
        profile.write_text(hook_env._profile_text())
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "VGPU_SIM_STATE": str(root / "node.state"),
            "VGPU_SIM_PROFILE": str(profile),
            "LD_LIBRARY_PATH": str(hook_env.FAKE_LIB_DIR),
            "VGPU_LOG_LEVEL": "error",
            "PYTHONPATH": str(REPO),
        }
        node = hook_env.Node(root, env)
        result: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "target": {"cuLaunchKernel_limiter_idle_added_ns_max": 30},
            "overhead_null_driver": _overhead(node, NULL_DRIVER, 2_000_000),
            "overhead_simulated_driver": _overhead(node, hook_env.FAKE_LIB_DIR, 100_000),
            "startup": _startup(node, 500),
        }
        if hook_env.fake_has_nvml():
            result["compute_cap_accuracy"] = measure_accuracy(node, seconds=6.0)
        else:
            result["compute_cap_accuracy"] = "not measured: the simulated NVML is not built"
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        added = result["overhead_null_driver"]["added_ns"]["cuLaunchKernel_limiter_idle"]
        print(f"launch overhead (limiter idle): {added} ns (target <= 30)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        time.sleep(0)
