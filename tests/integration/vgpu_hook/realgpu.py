"""The hook's overhead and compute-cap accuracy on a real NVIDIA GPU (GPU 0 of this machine).

Shared by tests/integration/vgpu_hook/test_real_gpu.py (marked `gpu`) and bench/hook_bench.py (which
records the figures under "real_gpu" when VGPU_DRA_REAL_GPU=1), in the same shape as the
simulated runs. The hook is preloaded with LD_PRELOAD and finds its claim through
VGPU_DRA_CLAIMS_DIR (no container: a GPU machine need not allow mount namespaces); the programs
are the same as on the simulated GPU, whose modules are real PTX (an empty kernel for
hook_bench, kernels spinning on %globaltimer for cuda_probe).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.fixtures.regions import budget_kept_fresh

REPO = Path(__file__).resolve().parents[3]
HOOK_LIB = REPO / "vgpu_hook" / "build" / "libvgpu.so"
HOOK_BENCH = REPO / "vgpu_hook" / "build" / "hook_bench"
PROBE = REPO / "vgpu_hook" / "build" / "cuda_probe"
RUNS = 5


def gpu0_uuid() -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


@contextmanager
def claim_dir(uuid: str, cores: int, *, budget: int | None = None) -> Iterator[Path]:
    """A claims directory holding one claim on `uuid`; with `budget`, a governor stand-in
    keeps that rate fresh in its region."""
    with tempfile.TemporaryDirectory(prefix="vgpu-real-") as root:
        claim = Path(root) / "c1"
        claim.mkdir()
        (claim / "vgpu.conf").write_text(
            f"version 1\nclaim c1\ndevice uuid={uuid} memory=1Ti cores={cores}\n"
        )
        if budget is None:
            yield Path(root)
            return
        with budget_kept_fresh(claim / "region", uuid, budget):
            yield Path(root)


def _bench(env: dict[str, str], iterations: int) -> dict[str, float]:
    out = subprocess.run(
        [str(HOOK_BENCH), str(iterations)], env=env, capture_output=True, text=True, check=True
    ).stdout
    result: dict[str, float] = json.loads([x for x in out.splitlines() if x.startswith("{")][-1])
    return result


def overhead(iterations: int = 200_000) -> dict[str, Any]:
    """Per-call cost with and without the hook on the real driver (minimum of RUNS runs)."""
    uuid = gpu0_uuid()
    base_env = dict(os.environ, HOOK_BENCH_SETTLE_MS="300", VGPU_LOG_LEVEL="error")
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "idle": [], "active": []}
    with (
        claim_dir(uuid, 0) as idle_dir,
        claim_dir(uuid, 50, budget=10**15) as active_dir,
    ):
        for _ in range(RUNS):
            runs["plain"].append(_bench(base_env, iterations))
            for key, root in (("idle", idle_dir), ("active", active_dir)):
                env = dict(base_env, LD_PRELOAD=str(HOOK_LIB), VGPU_DRA_CLAIMS_DIR=str(root))
                runs[key].append(_bench(env, iterations))
    best = {
        key: {k: round(min(r[k] for r in rs), 1) for k in rs[0] if k.endswith("_ns")}
        for key, rs in runs.items()
    }
    return {
        "without_hook_ns": best["plain"],
        "with_hook_limiter_idle_ns": best["idle"],
        "with_hook_limiter_active_ns": best["active"],
        "added_ns": {
            "cuLaunchKernel_limiter_idle": round(
                best["idle"]["cuLaunchKernel_ns"] - best["plain"]["cuLaunchKernel_ns"], 1
            ),
            "cuLaunchKernel_limiter_active": round(
                best["active"]["cuLaunchKernel_ns"] - best["plain"]["cuLaunchKernel_ns"], 1
            ),
        },
    }


def accuracy(cap: int, seconds: float = 6.0, settle_s: float = 2.0) -> dict[str, float]:
    """One tenant capped at `cap` (in-process controller) launching 20 us kernels back to back;
    NVML's GPU utilisation sampled every 100 ms; MAE over 0.5 s windows after `settle_s`."""
    import pynvml

    uuid = gpu0_uuid()
    with claim_dir(uuid, cap) as root:
        env = dict(
            os.environ,
            LD_PRELOAD=str(HOOK_LIB),
            VGPU_DRA_CLAIMS_DIR=str(root),
            PROBE_KERNEL="busy__ns20000",
            VGPU_LOG_LEVEL="error",
        )
        tenant = subprocess.Popen(
            [str(PROBE), "init", f"run:{int(seconds) + 2}:216:0"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            series: list[float] = []
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                time.sleep(0.1)
                if time.monotonic() - start >= settle_s:
                    series.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        finally:
            pynvml.nvmlShutdown()
            tenant.communicate(timeout=seconds + 60)
    windows = [sum(series[i : i + 5]) / 5 for i in range(0, len(series) - 4, 5)]
    return {
        "cap": cap,
        "mean_util": round(sum(series) / len(series), 2) if series else float("nan"),
        "mae": round(sum(abs(w - cap) for w in windows) / len(windows), 2)
        if windows
        else float("nan"),
    }
