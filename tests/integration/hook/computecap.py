"""Compute-cap accuracy runs on the simulated GPU (shared by the tests and bench/hook_bench.py).

Tenants are cuda_probe processes launching kernels back to back inside containers whose
claims carry `cores=<cap>`; a sampler process (same simulated node) reads NVML every 100 ms:
GPU utilisation and per-process SM utilisation. Optionally the sampler also runs the node
governor (kubelet_plugin.governor, given the claims' caps as the plugin's prepared plans would
give them), otherwise the hooks' in-process controller acts.

Result per tenant: mean utilisation and the mean absolute error from the cap over 0.5 s
windows, after a settling period.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from kubelet_plugin.region import POLICY_BALANCE, POLICY_FIXED
from tests.integration.hook.conftest import PROBE, UUIDS, Node
from vgpu_testbed.container import container_command

SETTLE_S = 2.0
WINDOW_S = 0.5
KERNEL = "busy__ns20000"  # 20 us per wave of 108 blocks
BLOCKS = "216"
_POLICY_CODES = {"fixed": POLICY_FIXED, "balance": POLICY_BALANCE}


def _sampler_main(uuid: str, seconds: float, state_dir: str, caps_json: str) -> None:
    """Runs in a child process with the simulated node's env; prints JSON lines.

    With a state dir, also runs the governor over the claims in `caps_json` ({uid: [[uuid,
    cores, policy]]}), which stands in for the plugin's prepared plans.
    """
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    stop = threading.Event()
    if state_dir:
        from kubelet_plugin.governor import CappedDevice, Governor, NvmlUtilSource

        caps = {
            uid: [CappedDevice(u, int(cores), int(policy)) for u, cores, policy in devices]
            for uid, devices in json.loads(caps_json).items()
        }
        governor = Governor(state_dir, NvmlUtilSource(), lambda: caps)
        threading.Thread(target=governor.run, args=(stop,), daemon=True).start()
    end = time.monotonic() + seconds
    last_us = time.time_ns() // 1000
    while time.monotonic() < end:
        time.sleep(0.1)
        device = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, last_us)
        except pynvml.NVMLError:
            samples = []
        last_us = time.time_ns() // 1000
        pids: dict[int, int] = {}
        for s in samples:
            pids[int(s.pid)] = pids.get(int(s.pid), 0) + int(s.smUtil)
        print(json.dumps({"t": time.monotonic(), "device": device, "pids": pids}), flush=True)
    stop.set()


def run_tenants(
    node: Node,
    caps: Sequence[int],
    *,
    seconds: float,
    governor: bool,
    policy: str = "fixed",
    sync_every_launch: bool = False,
    settle_s: float = SETTLE_S,
    delays_ms: Sequence[int] | None = None,
) -> list[dict[str, float]]:
    """Run one tenant per cap on GPU 0 at once; per tenant: mean util and MAE from its cap."""
    tag = f"{'gov' if governor else 'hook'}-{'-'.join(map(str, caps))}-{time.monotonic_ns()}"
    claims = [
        node.claim(
            f"cc-{tag}-{i}",
            [f"device uuid={UUIDS[0]} memory={1 << 34} cores={cap} policy={policy}"],
        )
        for i, cap in enumerate(caps)
    ]
    env = dict(node.env, PROBE_KERNEL=KERNEL)
    # Tenants outlive the sampler, so every sample is taken while all of them run.
    run_step = f"run:{int(seconds) + 2}:{BLOCKS}:{1 if sync_every_launch else 0}"
    delays = list(delays_ms) if delays_ms is not None else [0] * len(caps)
    tenants = [
        subprocess.Popen(
            container_command(
                c.spec, c.device_names, [str(PROBE), "init", f"sleep:{delay}", run_step]
            ),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c, delay in zip(claims, delays, strict=True)
    ]
    sampler = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.hook.computecap",
            UUIDS[0],
            str(seconds),
            str(node.state_dir) if governor else "",
            json.dumps(
                {
                    c.uid: [[UUIDS[0], cap, _POLICY_CODES[policy]]]
                    for c, cap in zip(claims, caps, strict=True)
                }
            ),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    )
    outputs = [t.communicate(timeout=seconds + 60) for t in tenants]
    for t, (out, err) in zip(tenants, outputs, strict=True):
        if t.returncode != 0 or "run launches=" not in out:
            raise RuntimeError(f"tenant {t.pid} failed ({t.returncode}): {out} {err}")
    if sampler.returncode != 0:
        raise RuntimeError(f"sampler failed: {sampler.stderr}")
    rows = [json.loads(line) for line in sampler.stdout.splitlines() if line.startswith("{")]
    start = rows[0]["t"] + settle_s if rows else 0.0
    rows = [r for r in rows if r["t"] >= start and r["t"] <= rows[-1]["t"] - 0.3]
    results = []
    for tenant, cap in zip(tenants, caps, strict=True):
        if len(caps) == 1:
            series = [float(r["device"]) for r in rows]
        else:
            series = [float(r["pids"].get(str(tenant.pid), 0)) for r in rows]
        per = max(1, int(WINDOW_S / 0.1))
        windows = [sum(series[i : i + per]) / per for i in range(0, len(series) - per + 1, per)]
        mean = sum(series) / len(series) if series else float("nan")
        mae = sum(abs(w - cap) for w in windows) / len(windows) if windows else float("nan")
        results.append({"cap": cap, "mean_util": round(mean, 2), "mae": round(mae, 2)})
    return results


def measure_accuracy(node: Node, *, seconds: float) -> dict[str, Any]:
    table: dict[str, Any] = {"window_s": WINDOW_S, "settle_s": SETTLE_S, "seconds": seconds}
    for governor in (False, True):
        mode = "governor" if governor else "in_process"
        table[mode] = {
            "single": [
                run_tenants(node, [cap], seconds=seconds, governor=governor)[0]
                for cap in (10, 30, 50, 70)
            ],
            "pair_30_70": run_tenants(node, [30, 70], seconds=seconds, governor=governor),
        }
    return table


if __name__ == "__main__":
    _sampler_main(sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4])
