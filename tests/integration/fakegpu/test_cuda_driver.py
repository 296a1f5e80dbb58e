"""The fake CUDA driver used by real clients on a simulated `dgx-h100` node.

Every program runs as a separate process with the environment of
`vgpu_testbed.fakegpu.simulator.prepare_node(...)`: the fake `libcuda.so.1` / `libnvidia-ml.so.1`
are found by the ordinary dynamic loader through LD_LIBRARY_PATH; nothing is monkeypatched.

Proves:
1. cuda-python (`cuda.bindings.driver`) initialises through cuGetProcAddress_v2 (every ABI it
   asks for that we simulate is found), allocates 1 GiB on GPU 3, and NVML (pynvml, another
   process) sees that process using 1 GiB on GPU 3; cuda.core's pool allocations count too.
2. Allocation beyond the profile's memory fails with CUDA_ERROR_OUT_OF_MEMORY, in cuda-python and
   in a C program, and leaves nothing charged; managed memory may exceed the GPU, and NVML shows
   only its device-resident part.
3. A process launching kernels in a loop drives NVML utilisation near 100 %.
4. Two such processes on one GPU share its SMs fairly and keep it near 100 % busy.
5. A process SIGKILLed while holding memory disappears from NVML with its memory.
6. CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES select and reorder devices.
7. A GPU flagged lost makes CUDA calls on it fail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vgpu_testbed.fakegpu.simulator import load_profile, prepare_node, set_gpu_lost

REPO = Path(__file__).resolve().parents[3]
FAKEGPU = REPO / "hack" / "fakegpu"
LIB_DIR = FAKEGPU / "build" / "lib"
PROGRAMS = FAKEGPU / "build" / "cuda_programs"
GIB = 1 << 30


@dataclass
class Node:
    """A simulated dgx-h100 node: the environment every program of the test runs with."""

    env: dict[str, str]

    def run(self, argv: Sequence[str], timeout: float = 60, **extra: str) -> str:
        done = subprocess.run(
            list(argv),
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{argv}: rc={done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    def start(self, argv: Sequence[str], **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            list(argv),
            env={**self.env, **extra},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def python(self, code: str, timeout: float = 60, **extra: str) -> str:
        return self.run([sys.executable, "-c", code], timeout=timeout, **extra)

    def nvml(self) -> list[dict[str, Any]]:
        """What NVML reports per GPU, read by pynvml in a separate process."""
        if not (LIB_DIR / "libnvidia-ml.so.1").is_file():
            pytest.skip("the fake libnvidia-ml.so.1 is not built (hack/fakegpu src/nvml*.c)")
        return list(json.loads(self.python(NVML_SNAPSHOT)))


NVML_SNAPSHOT = """
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    procs = n.nvmlDeviceGetComputeRunningProcesses(h)
    out.append({
        "uuid": n.nvmlDeviceGetUUID(h),
        "used": mem.used,
        "total": mem.total,
        "util": n.nvmlDeviceGetUtilizationRates(h).gpu,
        "procs": {str(p.pid): p.usedGpuMemory for p in procs},
    })
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def built() -> None:
    subprocess.run(["make", "-s", "-C", str(FAKEGPU), "all"], check=True)
    if not (PROGRAMS / "cuda_spin").is_file():
        pytest.fail("hack/fakegpu `make all` did not build tests/cuda_programs/*.c")


@pytest.fixture
def node(built: None, tmp_path: Path) -> Iterator[Node]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
        **prepare_node(load_profile("dgx-h100"), tmp_path / "node.state"),
    }
    assert str(LIB_DIR) in env.get("LD_LIBRARY_PATH", ""), env
    yield Node(env)


def _devices(node: Node, **extra: str) -> list[tuple[str, int, str]]:
    """(uuid, total bytes, name) per CUDA ordinal, as cuda_list prints them."""
    lines = node.run([str(PROGRAMS / "cuda_list")], **extra).splitlines()
    if lines[0].startswith("count=0"):
        return []
    rows = [line.split(" ", 5) for line in lines[1:]]
    return [(row[1], int(row[3]), row[5]) for row in rows]


def _wait_ready(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(("ready", "started")), line + (proc.stderr.read() if proc.stderr else "")
    return line


# ---- 1. cuda-python through cuGetProcAddress, seen by NVML -------------------------------------

CUDA_PYTHON_HOLD = """
import sys
from cuda.bindings import driver as d
def ok(ret):
    err, *rest = ret
    assert err == d.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest
ok(d.cuInit(0))
dev = ok(d.cuDeviceGet(3))
ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(ctx))
ptr = ok(d.cuMemAlloc(1 << 30))
free, total = ok(d.cuMemGetInfo())
print("ready", int(ptr), free, total, flush=True)
sys.stdin.readline()
"""


def test_cuda_python_allocates_on_gpu3_and_nvml_sees_it(node: Node) -> None:
    proc = node.start([sys.executable, "-c", CUDA_PYTHON_HOLD])
    try:
        _, ptr, free, total = _wait_ready(proc).split()
        assert int(ptr) != 0
        assert int(total) - int(free) == GIB  # cuMemGetInfo sees its own allocation
        gpus = node.nvml()
        assert gpus[3]["procs"] == {str(proc.pid): GIB}
        assert gpus[3]["used"] >= GIB
        assert all(str(proc.pid) not in g["procs"] for i, g in enumerate(gpus) if i != 3)
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    assert str(proc.pid) not in node.nvml()[3]["procs"]


def test_cuda_python_launches_kernels(node: Node) -> None:
    code = """
from cuda.bindings import driver as d
def ok(ret):
    err, *rest = ret
    assert err == d.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest
ok(d.cuInit(0))
ctx = ok(d.cuCtxCreate(None, 0, ok(d.cuDeviceGet(0))))
mod = ok(d.cuModuleLoadData(b"simulated image"))
fn = ok(d.cuModuleGetFunction(mod, b"work__ns2000000"))
blocker = ok(d.cuModuleGetFunction(mod, b"block__ns100000000"))
stream = ok(d.cuStreamCreate(0))
start, stop = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
# The blocker places the events and the kernel back to back on the simulated timeline.
ok(d.cuLaunchKernel(blocker, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0))
ok(d.cuEventRecord(start, stream))
ok(d.cuLaunchKernel(fn, 132 * 3, 1, 1, 128, 1, 1, 0, stream, 0, 0))
ok(d.cuEventRecord(stop, stream))
ok(d.cuEventSynchronize(stop))
print(ok(d.cuEventElapsedTime(start, stop)))
"""
    elapsed_ms = float(node.python(code).strip())
    assert 6.0 <= elapsed_ms <= 6.01  # 3 waves x 2 ms + the 2 us launch cost


# The driver functions cuda-python looks up that cuda.h does not declare: the graphics-interop
# (cudaGL.h, cudaEGL.h, cudaVDPAU.h) and profiler (cudaProfiler.h) headers, outside the simulator.
INTEROP = re.compile(
    r"cu(GL|GraphicsGL|EGL|GraphicsEGL|GraphicsResourceGetMappedEgl|EventCreateFromEGLSync"
    r"|VDPAU|GraphicsVDPAU|Profiler)\w*"
)


def test_cuda_python_finds_every_abi_it_asks_for(node: Node) -> None:
    """Every cuda.h entry point cuda-python resolves is found (simulated, or a NOT_SUPPORTED
    stub), at every ABI version it asks for; only the interop headers' functions are missing."""
    done = subprocess.run(
        [sys.executable, "-c", "from cuda.bindings import driver as d; print(d.cuInit(0))"],
        env={**node.env, "VGPU_SIM_CUDA_TRACE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "CUDA_SUCCESS" in done.stdout
    missing = re.findall(r"cuGetProcAddress\((\w+), \d+\): (.*)", done.stderr)
    assert missing  # the trace works: the interop functions are reported
    for name, why in missing:
        assert why == "not simulated" and INTEROP.fullmatch(name), (name, why)


def test_cuda_core_allocates_from_the_device_pool(node: Node) -> None:
    code = """
import sys
from cuda.core import Device
dev = Device(3)
dev.set_current()
stream = dev.create_stream()
buf = dev.allocate(1 << 30, stream=stream)
print("ready", flush=True)
sys.stdin.readline()
buf.close(stream)
stream.sync()
"""
    proc = node.start([sys.executable, "-c", code])
    try:
        _wait_ready(proc)
        assert node.nvml()[3]["procs"] == {str(proc.pid): GIB}
    finally:
        out, err = proc.communicate("\n", timeout=30)
    assert proc.returncode == 0, out + err
    assert node.nvml()[3]["procs"] == {}


# ---- 2. Out of memory ---------------------------------------------------------------------------


def test_allocation_beyond_profile_memory_fails(node: Node) -> None:
    total = _devices(node)[3][1]
    code = f"""
from cuda.bindings import driver as d
d.cuInit(0)
err, ctx = d.cuCtxCreate(None, 0, 3)
assert err == d.CUresult.CUDA_SUCCESS
err, _ = d.cuMemAlloc({total} + 1)
print(err.name)
err, half = d.cuMemAlloc({total // 2})
assert err == d.CUresult.CUDA_SUCCESS, err
err, _ = d.cuMemAlloc({total - total // 2} + 1)
print(err.name)
err, free, tot = d.cuMemGetInfo()
print(free, tot)
"""
    lines = node.python(code).splitlines()
    assert lines[0] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert lines[1] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert lines[2] == f"{total - total // 2} {total}"  # the failures charged nothing


MANAGED_OVERSUBSCRIBE = """
import sys
from cuda.bindings import driver as d
def ok(ret):
    err, *rest = ret
    assert err == d.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest
ok(d.cuInit(0))
ctx = ok(d.cuCtxCreate(None, 0, 3))
total = ok(d.cuDeviceTotalMem(3))
ok(d.cuMemAlloc(total - (8 << 30)))
managed = ok(d.cuMemAllocManaged(2 * total, d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
err, _ = d.cuMemAlloc(1)
free, _ = ok(d.cuMemGetInfo())
print("ready", int(managed), err.name, free, flush=True)
sys.stdin.readline()
"""


def test_managed_memory_oversubscribes_and_nvml_shows_the_resident_part(node: Node) -> None:
    """Managed memory may be twice the GPU; only what fitted in free device memory (8 GiB here)
    is device-resident, which is what NVML shows; device memory is still refused."""
    total = _devices(node)[3][1]
    proc = node.start(
        [sys.executable, "-c", MANAGED_OVERSUBSCRIBE], VGPU_SIM_HOST_MEMORY=str(4 * total)
    )
    try:
        _, ptr, err, free = _wait_ready(proc).split()
        assert int(ptr) != 0
        assert err == "CUDA_ERROR_OUT_OF_MEMORY"  # the GPU is full
        assert int(free) == 0
        assert node.nvml()[3]["procs"] == {str(proc.pid): total}
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0


def test_c_program_out_of_memory_exit(node: Node) -> None:
    total = _devices(node)[3][1]
    done = subprocess.run(
        [str(PROGRAMS / "cuda_hold"), "3", str(total + 1)],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=30,
        input="\n",
        check=False,
    )
    assert done.returncode == 3
    assert "CUDA_ERROR_OUT_OF_MEMORY" in done.stdout


# ---- 3./4. Utilisation ----------------------------------------------------------------------

# Each cuda_spin launch is one 100 us wave with no fixed cost: busy time = launches x 100 us.
# Bounds leave room for a loaded 2-core CI machine descheduling a loop longer than its 20 ms
# launch queue (bench/fakegpu_cuda_bench.py records the figures).
SPIN_ENV = {"CUDA_SPIN_KERNEL": "spin__ns100000", "VGPU_SIM_LAUNCH_NS": "0"}
LAUNCH_S = 100e-6


def _spin(node: Node, gpu: int, seconds: float) -> subprocess.Popen[str]:
    return node.start([str(PROGRAMS / "cuda_spin"), str(gpu), str(seconds)], **SPIN_ENV)


def _sample_util(node: Node, gpu: int, seconds: float) -> list[int]:
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(int(node.nvml()[gpu]["util"]))
        time.sleep(0.2)
    return samples


def _spin_result(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    last = out.strip().splitlines()[-1]
    return {k: float(v) for k, v in (kv.split("=") for kv in last.split())}


def test_kernel_loop_keeps_the_gpu_busy(node: Node) -> None:
    result = _spin_result(_spin(node, 2, 1.5))
    assert result["launches"] * LAUNCH_S >= 0.9 * result["seconds"], result


def test_kernel_loop_drives_nvml_utilisation_near_100(node: Node) -> None:
    node.nvml()  # skips when NVML is not built
    spin = _spin(node, 2, 4)
    _wait_ready(spin)
    time.sleep(0.5)
    samples = _sample_util(node, 2, 2.0)
    _spin_result(spin)
    assert sum(samples) / len(samples) >= 85, samples
    assert node.nvml()[5]["util"] == 0  # an idle GPU stays idle


def test_two_processes_share_the_sms(node: Node) -> None:
    spins = [_spin(node, 1, 2) for _ in range(2)]
    for spin in spins:
        _wait_ready(spin)
    a, b = (_spin_result(s) for s in spins)
    # Same kernels, same time: each got a fair share, and together they kept the GPU busy.
    share = a["launches"] / (a["launches"] + b["launches"])
    assert 0.4 <= share <= 0.6, (a, b)
    busy = (a["launches"] + b["launches"]) * LAUNCH_S / max(a["seconds"], b["seconds"])
    assert 0.85 <= busy <= 1.02, (a, b)


def test_two_processes_show_near_100_in_nvml(node: Node) -> None:
    node.nvml()  # skips when NVML is not built
    spins = [_spin(node, 1, 4) for _ in range(2)]
    for spin in spins:
        _wait_ready(spin)
    time.sleep(0.5)
    samples = _sample_util(node, 1, 2.0)
    for spin in spins:
        _spin_result(spin)
    assert sum(samples) / len(samples) >= 85, samples


# ---- 5. SIGKILL ---------------------------------------------------------------------------------


def test_sigkilled_process_memory_is_released_in_nvml(node: Node) -> None:
    before = node.nvml()[3]["used"]
    hold = node.start([str(PROGRAMS / "cuda_hold"), "3", str(4 * GIB)])
    _wait_ready(hold)
    gpus = node.nvml()
    assert gpus[3]["procs"] == {str(hold.pid): 4 * GIB}
    assert gpus[3]["used"] == before + 4 * GIB
    hold.send_signal(signal.SIGKILL)
    hold.wait(timeout=30)
    gpus = node.nvml()
    assert gpus[3]["procs"] == {}
    assert gpus[3]["used"] == before


# ---- 6. Visibility ------------------------------------------------------------------------------


def test_visible_devices_select_and_reorder(node: Node) -> None:
    every = _devices(node)
    assert len(every) == 8
    uuids = [d[0] for d in every]
    assert [d[0] for d in _devices(node, CUDA_VISIBLE_DEVICES="3,1")] == [uuids[3], uuids[1]]
    assert [d[0] for d in _devices(node, CUDA_VISIBLE_DEVICES=uuids[6])] == [uuids[6]]
    assert [d[0] for d in _devices(node, CUDA_VISIBLE_DEVICES=uuids[6][:12] + ",0")] == [
        uuids[6],
        uuids[0],
    ]
    # An invalid entry ends the list.
    assert [d[0] for d in _devices(node, CUDA_VISIBLE_DEVICES="2,99,4")] == [uuids[2]]
    assert _devices(node, CUDA_VISIBLE_DEVICES="") == []
    # The container view first, then CUDA_VISIBLE_DEVICES indexes into it.
    view = {"NVIDIA_VISIBLE_DEVICES": f"{uuids[5]},2"}
    assert [d[0] for d in _devices(node, **view)] == [uuids[5], uuids[2]]
    assert [d[0] for d in _devices(node, CUDA_VISIBLE_DEVICES="1", **view)] == [uuids[2]]
    assert _devices(node, CUDA_VISIBLE_DEVICES="3", **view) == []


# ---- 7. Lost GPU --------------------------------------------------------------------------------


def _set_lost(node: Node, gpu: int, on: bool) -> None:
    """Flag a GPU lost through the simulator's control API (the node operator's view)."""
    set_gpu_lost(node.env, gpu, on)


def test_lost_gpu_fails_cuda_calls(node: Node) -> None:
    hold = node.start([str(PROGRAMS / "cuda_hold"), "4", str(GIB), "free"])
    _wait_ready(hold)
    _set_lost(node, 4, True)
    try:
        done = subprocess.run(
            [str(PROGRAMS / "cuda_hold"), "4", "1024"],
            env=node.env,
            capture_output=True,
            text=True,
            input="\n",
            timeout=30,
            check=False,
        )
        assert done.returncode == 3
        assert "CUDA_ERROR_DEVICE_UNAVAILABLE" in done.stdout
        # Other GPUs are unaffected, and the holder may still free its memory.
        node.run([str(PROGRAMS / "cuda_hold"), "5", "1024", "free"], timeout=30)
        hold.communicate("\n", timeout=30)
        assert hold.returncode == 0
    finally:
        _set_lost(node, 4, False)
        if hold.poll() is None:
            hold.kill()
    node.run([str(PROGRAMS / "cuda_hold"), "4", "1024", "free"], timeout=30)
