"""Processes in PID namespaces - containers - seen through the simulated driver's real clients.

A tenant runs as a container's process does: pid 1 of a PID namespace of its own, with its own
/proc (`unshare --pid --fork --mount-proc`, what runc sets up around a container's process). The
real driver answers every caller with pids of the machine's root namespace; the simulator answers
each caller with the pids of *its* namespace (docs/simulated-gpus.md, "Processes in PID
namespaces"), which is the same thing for the node (the plugin runs in the node's namespace) and
lets tools inside a container name their own processes.

Proves:
1. From the node's namespace, NVML (pynvml) lists a container's tenant under its pid there, with
   its memory, and that pid is the tenant's in the node's /proc; `vgpu-dra fakegpu status` too.
   Inside the container, NVML lists the tenant as pid 1 (nvmlSystemGetProcessName names it from
   the container's /proc) and not the node's own processes, whose memory it still counts; its
   queries free nothing of the node's. A container killed with its namespace is freed, by the
   first reader, even one in a sibling namespace that never could see it.
2. A kernel loop inside a container shows in per-process utilisation under its node pid, and
   under pid 1 inside; the GPU's utilisation is the same from both.
3. Host > node > container, with node-side enforcement: the kubelet plugin's enforcer, run in a
   node namespace (`kubelet_plugin.enforcement.Enforcer` over NVML, as the plugin's thread runs
   it), finds the container's tenant by its node pid, attributes it to its claim through that
   pid's mountinfo, reports it as running without the hook and over its cap, and kills it; the
   host's NVML meanwhile names the same process by its host pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fakegpu.nvml_node import PROGRAMS, REPO, SimNode, build_fakegpu
from vgpu_testbed.fakegpu import simulator as fakegpu

MIB = 1 << 20
GIB = 1 << 30

# A container's process isolation, minus the image: a PID namespace with its own /proc (in a
# private mount namespace, so nothing leaks to the host's mounts). Killing unshare kills the
# namespace's init, and with it the namespace.
CONTAINER = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    if os.geteuid() != 0:
        pytest.skip("PID namespaces (unshare --pid) need root")
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("unshare and nsenter (util-linux) are needed")
    build_fakegpu()


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode.create("l4-2", tmp_path)


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def descendant(pid: int, marker: str, timeout: float = 10) -> int:
    """The pid, in this namespace, of the process under `pid` that runs `python -c CODE` with
    `marker` in CODE (its parents' command lines may carry CODE too, as an argument)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        todo = [pid]
        while todo:
            p = todo.pop()
            try:
                argv = Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace").split("\0")
                if len(argv) > 2 and argv[1] == "-c" and marker in argv[2]:
                    return p
                todo += children(p)
            except (FileNotFoundError, ProcessLookupError):
                continue
        time.sleep(0.05)
    raise AssertionError(f"no process with {marker!r} under {pid}")


@contextmanager
def contained(node: SimNode, argv: list[str]) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`argv` as pid 1 of a container-like namespace; yields it and its pid in ours once it
    printed its first line (the programs print "ready ..." when they hold their memory)."""
    proc = subprocess.Popen(
        [*CONTAINER, *argv],
        env=node.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        (pid,) = children(proc.pid)  # unshare --fork's child, which exec'd argv
        yield proc, pid
    finally:
        proc.kill()  # unshare, and so (--kill-child) the namespace
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        proc.wait()


def python_in(
    node: SimNode, code: str, *, pidns_of: int | None = None, new_ns: bool = False
) -> Any:
    """Run `code` (prints one JSON document) in this namespace, inside the PID and mount
    namespaces of process `pidns_of` (its container, /proc included), or in a new one."""
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    if pidns_of is not None:
        argv = ["nsenter", f"--target={pidns_of}", "--pid", "--mount", "--", *argv]
    elif new_ns:
        argv = [*CONTAINER, *argv]
    done = subprocess.run(
        argv, env=node.env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


LIST = """
import json, os, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
procs = n.nvmlDeviceGetComputeRunningProcesses(h)
print(json.dumps({
    "me": os.getpid(),
    "used": n.nvmlDeviceGetMemoryInfo(h).used,
    "procs": {str(p.pid): p.usedGpuMemory for p in procs},
    "names": {str(p.pid): n.nvmlSystemGetProcessName(p.pid) for p in procs},
}))
"""


def test_node_and_container_each_see_their_own_pids(node: SimNode) -> None:
    hold = str(PROGRAMS / "cuda_hold")
    with node.holding(0, 256 * MIB) as host_holder:
        with contained(node, [hold, "0", str(300 * MIB)]) as (tenant, pid):
            # The node: both, under the node's pids; the tenant's is cuda_hold in our /proc.
            seen = python_in(node, LIST)
            assert seen["procs"] == {str(host_holder.pid): 256 * MIB, str(pid): 300 * MIB}
            assert seen["used"] == 556 * MIB
            assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == hold.encode()
            status = fakegpu.gpu_status(node.state)["gpus"][0]
            assert {p["pid"]: p["memory_used"] for p in status["processes"]} == {
                host_holder.pid: 256 * MIB,
                pid: 300 * MIB,
            }
            assert status["memory_used"] == 556 * MIB

            # The container: itself as pid 1, named from its own /proc; the node's holder is not
            # its to see, but its memory is on the GPU.
            inside = python_in(node, LIST, pidns_of=pid)
            assert inside["me"] != 1 and inside["procs"] == {"1": 300 * MIB}
            assert inside["names"] == {"1": "cuda_hold"}  # its /proc/1/comm
            assert inside["used"] == 556 * MIB
            # Its queries reaped nothing alive.
            assert python_in(node, LIST)["procs"] == seen["procs"]

            # Killed with its namespace: freed by the next reader, here a sibling container's.
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            sibling = python_in(node, LIST, new_ns=True)
            assert sibling["procs"] == {} and sibling["used"] == 256 * MIB
            assert tenant.wait(timeout=10) is not None
        assert python_in(node, LIST)["procs"] == {str(host_holder.pid): 256 * MIB}


UTIL = """
import json, time, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
time.sleep(0.5)
samples = n.nvmlDeviceGetProcessUtilization(h, int((time.time() - 0.3) * 1e6))
print(json.dumps({
    "gpu": n.nvmlDeviceGetUtilizationRates(h).gpu,
    "samples": {str(s.pid): s.smUtil for s in samples},
}))
"""


def test_kernel_loop_in_a_container_is_attributed_in_both_views(node: SimNode) -> None:
    spin = str(PROGRAMS / "cuda_spin")
    env = {**node.env, "CUDA_SPIN_KERNEL": "spin__ns100000", "VGPU_SIM_LAUNCH_NS": "0"}
    node = SimNode(node.profile, node.state, env)
    # cuda_spin prints only at its end: wrap it so that the namespace reports once it runs.
    argv = ["sh", "-c", f'echo ready; exec "{spin}" 0 4 >/dev/null']
    with contained(node, argv) as (_, sh_pid):
        outside = python_in(node, UTIL)
        inside = python_in(node, UTIL, pidns_of=sh_pid)
    assert outside["gpu"] >= 90 and inside["gpu"] >= 90
    assert list(outside["samples"]) == [str(sh_pid)] and outside["samples"][str(sh_pid)] >= 80
    assert list(inside["samples"]) == ["1"] and inside["samples"]["1"] >= 80


# ---- node-side enforcement from a node namespace -----------------------------------------------

TENANT = """
# pidns-tenant: allocates past its claim's cap, bypassing the hook (no preload), then waits.
import ctypes, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(3 << 30)) == 0
print("allocated", flush=True)
time.sleep(120)
"""

# The node (pid 1 of its namespace, its own /proc) starts the container below itself, then
# runs the plugin's enforcer over its own NVML, as the plugin's enforcement thread does.
NODE = """
import json, os, subprocess, sys, time
from dra_driver.nvml import PyNvml, session
from kubelet_plugin.enforcement import Enforcer, NvmlProcesses, REASON_OVER_CAP
from kubelet_plugin.plan import ClaimPlan

plan = ClaimPlan.model_validate_json(sys.argv[1])
container = json.loads(sys.argv[3])
tenant = subprocess.Popen(container, stdout=subprocess.PIPE, text=True)
assert tenant.stdout.readline().strip() == "allocated"
children = open(f"/proc/{tenant.pid}/task/{tenant.pid}/children").read()
(node_pid,) = [int(p) for p in children.split()]
with session(PyNvml()) as nvml:
    listed = {str(p.pid): p.used_bytes for p in nvml.running_processes(nvml.device_by_index(0))}
    print(json.dumps({"node_pid": node_pid, "listed": listed,
                      "cmdline": open(f"/proc/{node_pid}/cmdline").read()}), flush=True)
    sys.stdin.readline()  # the host looks meanwhile
    reports = []
    class Collect:
        def report(self, report):
            reports.append({"reason": report.reason, "pids": list(report.pids),
                            "message": report.message})
    enforcer = Enforcer(sys.argv[2], lambda: {plan.uid: plan}, NvmlProcesses(nvml), [Collect()])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(r["reason"] == REASON_OVER_CAP for r in reports):
        enforcer.tick()
        time.sleep(0.05)
try:
    tenant.wait(timeout=10)
except subprocess.TimeoutExpired:
    tenant.kill()
# The container's init was the tenant: gone with its namespace when killed.
print(json.dumps({"reports": reports, "alive": os.path.exists(f"/proc/{node_pid}")}), flush=True)
"""


def test_enforcement_in_the_node_namespace_kills_a_container_tenant(
    node: SimNode, tmp_path: Path
) -> None:
    from tests.fixtures.tenants import claim_dir_spec, claim_plan
    from vgpu_testbed.container import container_command

    uid = str(uuid.uuid4())
    claim_dir = tmp_path / "state" / "claims" / uid
    claim_dir.mkdir(parents=True)
    tenant_argv = [
        *CONTAINER,
        *container_command(claim_dir_spec(claim_dir, uid), ["gpu"], [sys.executable, "-c", TENANT]),
    ]
    plan = claim_plan(uid, node.profile.gpus[0].uuid, GIB, enforce="kill")
    env = {**os.environ, **node.env}
    proc = subprocess.Popen(
        [
            *CONTAINER,
            sys.executable,
            "-c",
            NODE,
            json.dumps(plan),
            str(tmp_path / "state"),
            json.dumps(tenant_argv),
        ],
        env=env,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line, "the node script ended early"
        first = json.loads(line)
        node_pid = first["node_pid"]
        # The node's NVML: the tenant under its node pid (a small number of the node's own
        # namespace), which is the tenant in the node's /proc.
        assert first["listed"] == {str(node_pid): 3 * GIB}
        assert "pidns-tenant" in first["cmdline"]
        # The host's NVML: the same process under its host pid.
        host_pid = descendant(proc.pid, "pidns-tenant")
        assert python_in(node, LIST)["procs"] == {str(host_pid): 3 * GIB}

        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    reports = result["reports"]
    assert [r["reason"] for r in reports] == ["GPUHookMissing", "GPUMemoryCapExceeded"]
    assert reports[0]["pids"] == [node_pid] and reports[1]["pids"] == [node_pid]
    assert f"killed {node_pid}" in reports[1]["message"]
    assert not result["alive"]
    assert python_in(node, LIST)["procs"] == {}
