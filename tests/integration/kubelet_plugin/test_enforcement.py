"""Node-side enforcement against a real tenant that bypasses the hook, on simulated GPUs.

The tenant runs "as a container" (`vgpu_testbed.container`: a private mount namespace with the
claim directory bind-mounted at /run/vgpu-dra/claims/<uid>, as the CDI spec does) but without the
hook's preload, and allocates past its 1 GiB cap by calling the simulated libcuda directly. The
enforcer runs in a second fresh interpreter (NVML must be loaded from the simulated node) with a
hand-made prepared plan for that claim, exactly as the plugin's thread would.

What this proves:
1. `enforce: kill`: the tenant is reported as running without the hook, reported over its cap
   and SIGKILLed through its host pid.
2. `enforce: report`: the same tenant is reported and left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.simulated import simulated_node_env
from tests.fixtures.tenants import claim_dir_spec, claim_plan

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[3]

TENANT = """
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(3 << 30)) == 0
print("allocated", flush=True)
time.sleep(120)
"""

ENFORCER = """
import json, sys, time
from dra_driver.nvml import PyNvml, session
from kubelet_plugin.enforcement import Enforcer, NvmlProcesses, REASON_OVER_CAP
from kubelet_plugin.plan import ClaimPlan

plan = ClaimPlan.model_validate_json(sys.argv[1])
reports = []

class Collect:
    def report(self, report):
        reports.append({"reason": report.reason, "pids": list(report.pids),
                        "message": report.message, "at": time.monotonic()})

with session(PyNvml()) as nvml:
    enforcer = Enforcer(sys.argv[2], lambda: {plan.uid: plan}, NvmlProcesses(nvml), [Collect()])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(r["reason"] == REASON_OVER_CAP for r in reports):
        enforcer.tick()
        time.sleep(0.05)
print(json.dumps(reports))
"""


@pytest.fixture
def node(tmp_path: Path) -> dict[str, str]:
    return simulated_node_env(tmp_path, root_for="the container runner (mount namespaces)")


@pytest.fixture
def tenant(node: dict[str, str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    from vgpu_testbed.container import container_command

    uid = str(uuid.uuid4())
    claim_dir = tmp_path / "state" / "claims" / uid
    claim_dir.mkdir(parents=True)
    proc = subprocess.Popen(
        container_command(claim_dir_spec(claim_dir, uid), ["gpu"], [sys.executable, "-c", TENANT]),
        env={**os.environ, **node},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "allocated"
    try:
        yield proc, uid
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def enforce(node: dict[str, str], tmp_path: Path, uid: str, mode: str) -> list[dict[str, Any]]:
    from vgpu_testbed.fakegpu import simulator as fakegpu

    gpu_uuid = fakegpu.load_profile("l4-2").gpus[0].uuid
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            ENFORCER,
            json.dumps(claim_plan(uid, gpu_uuid, GIB, enforce=mode)),
            str(tmp_path / "state"),
        ],
        env={**os.environ, **node},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reports: list[dict[str, Any]] = json.loads(done.stdout)
    return reports


def test_a_tenant_bypassing_the_hook_is_reported_and_killed(
    node: dict[str, str], tmp_path: Path, tenant: tuple[subprocess.Popen[str], str]
) -> None:
    proc, uid = tenant
    reports = enforce(node, tmp_path, uid, "kill")
    reasons = [r["reason"] for r in reports]
    assert reasons == ["GPUHookMissing", "GPUMemoryCapExceeded"]
    (pid,) = reports[0]["pids"]
    assert reports[1]["pids"] == [pid] and f"killed {pid}" in reports[1]["message"]
    assert "over its cap of 1024 MiB" in reports[1]["message"]
    assert proc.wait(timeout=30) == -signal.SIGKILL  # the container's (only) process died


def test_report_mode_leaves_the_tenant_running(
    node: dict[str, str], tmp_path: Path, tenant: tuple[subprocess.Popen[str], str]
) -> None:
    proc, uid = tenant
    reports = enforce(node, tmp_path, uid, "report")
    assert [r["reason"] for r in reports] == ["GPUHookMissing", "GPUMemoryCapExceeded"]
    assert "reported only" in reports[1]["message"]
    assert proc.poll() is None
