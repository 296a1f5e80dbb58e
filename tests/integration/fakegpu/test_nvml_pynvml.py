"""pynvml (nvidia-ml-py) against the fake libnvidia-ml.so.1 on simulated nodes.

Proves, each in a separate process loading the library through LD_LIBRARY_PATH:
1. `dgx-h100` enumerates exactly as its profile: count, names, UUIDs, memory, PCI bus ids, NUMA
   nodes, compute capability, cores, MIG capability, driver/CUDA versions.
2. NVLink: every GPU of `dgx-h100` reaches every other over NVLink (remote PCI info of each
   active link resolves to a peer's bus id; P2P NVLink status OK); `a100-2x4` forms two islands
   with no NVLink and no NVLink P2P between them; `a10-pcie` has no NVLink at all.
3. Topology: common ancestor and nearest GPUs follow NUMA placement; CPU affinity is disjoint
   per NUMA node.
4. NVIDIA_VISIBLE_DEVICES gives the container's view (subset, reindexed).
5. A process holding memory through the fake CUDA driver shows in GetMemoryInfo and
   GetComputeRunningProcesses (all struct versions pynvml uses), and is gone once killed.
6. A process launching kernels in a loop shows as ~100 % GPU utilisation and as the only
   per-process utilisation sample (GetProcessUtilization), with a wall-clock timestamp.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.fakegpu.nvml_node import PROGRAMS, SimNode, build_fakegpu


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build_fakegpu()


@contextmanager
def spinning(node: SimNode, *, seconds: int) -> Iterator[subprocess.Popen[str]]:
    """`cuda_spin` keeps GPU 0 of `node` busy with 100 us kernels for `seconds` while the block
    runs (the process); the block's end waits for it to finish."""
    spin = PROGRAMS / "cuda_spin"
    if not spin.is_file():
        pytest.skip("the fake CUDA driver's test programs are not built")
    proc = subprocess.Popen(
        [str(spin), "0", str(seconds)],
        env={**node.env, "CUDA_SPIN_KERNEL": "spin__ns100000", "VGPU_SIM_LAUNCH_NS": "0"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        proc.communicate(timeout=30)


@pytest.fixture
def dgx(tmp_path: Path) -> Iterator[SimNode]:
    yield SimNode.create("dgx-h100", tmp_path)


ENUMERATE = """
import json, pynvml as n
n.nvmlInit()
gpus = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    mem2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    try:
        mig = list(n.nvmlDeviceGetMigMode(h))
    except n.NVMLError_NotSupported:
        mig = None
    links = []
    for link in range(18):
        try:
            if n.nvmlDeviceGetNvLinkState(h, link):
                links.append(n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
        except n.NVMLError_NotSupported:
            break
        except n.NVMLError_InvalidArgument:
            break
    gpus.append({
        "index": n.nvmlDeviceGetIndex(h),
        "name": n.nvmlDeviceGetName(h),
        "uuid": n.nvmlDeviceGetUUID(h),
        "serial": n.nvmlDeviceGetSerial(h),
        "total": mem.total, "used": mem.used, "free": mem.free, "total2": mem2.total,
        "bus": n.nvmlDeviceGetPciInfo(h).busId,
        "numa": n.nvmlDeviceGetNumaNodeId(h),
        "cc": list(n.nvmlDeviceGetCudaComputeCapability(h)),
        "cores": n.nvmlDeviceGetNumGpuCores(h),
        "arch": n.nvmlDeviceGetArchitecture(h),
        "mig": mig,
        "minor": n.nvmlDeviceGetMinorNumber(h),
        "links": links,
    })
print(json.dumps({
    "driver": n.nvmlSystemGetDriverVersion(),
    "cuda": n.nvmlSystemGetCudaDriverVersion_v2(),
    "gpus": gpus,
}))
"""


def test_dgx_h100_enumerates_exactly_as_its_profile(dgx: SimNode) -> None:
    seen = dgx.python(ENUMERATE)
    assert seen["driver"] == "580.95.05" and seen["cuda"] == 13000
    assert len(seen["gpus"]) == 8
    for i, (got, want) in enumerate(zip(seen["gpus"], dgx.profile.gpus, strict=True)):
        assert got["index"] == i
        assert got["name"] == "NVIDIA H100 80GB HBM3"
        assert got["uuid"] == want.uuid and got["serial"] == want.serial
        assert got["total"] == got["total2"] == want.memory_bytes == 85520809984
        assert got["used"] == 0 and got["free"] == got["total"]
        assert got["bus"] == want.pci_bus_id
        assert got["numa"] == (0 if i < 4 else 1)
        assert got["cc"] == [9, 0] and got["cores"] == 132 * 128
        assert got["arch"] == 9  # NVML_DEVICE_ARCH_HOPPER
        assert got["mig"] == [0, 0] and got["minor"] == i


def test_dgx_h100_every_pair_is_nvlinked(dgx: SimNode) -> None:
    gpus = dgx.python(ENUMERATE)["gpus"]
    bus_of = [g["bus"] for g in gpus]
    for i, g in enumerate(gpus):
        assert len(g["links"]) == 14  # 7 peers x 2 links
        assert sorted(set(g["links"])) == sorted(b for j, b in enumerate(bus_of) if j != i)


P2P_MATRIX = """
import json, pynvml as n
n.nvmlInit()
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
# pynvml defines NVML_P2P_CAPS_INDEX_READ as a tuple (0,): use the ABI values.
READ, NVLINK = 0, 2
def p2p(a, b, idx):
    return n.nvmlDeviceGetP2PStatus(a, b, idx)
print(json.dumps({
    "nvlink": [[p2p(a, b, NVLINK) if a is not b else -1 for b in hs]
               for a in hs],
    "read": [[p2p(a, b, READ) if a is not b else -1 for b in hs]
             for a in hs],
    "ancestor": [[n.nvmlDeviceGetTopologyCommonAncestor(a, b) for b in hs] for a in hs],
    "near_node": [sorted(n.nvmlDeviceGetIndex(x) for x in
                         n.nvmlDeviceGetTopologyNearestGpus(a, n.NVML_TOPOLOGY_NODE)) for a in hs],
    "cpus": [list(n.nvmlDeviceGetCpuAffinity(a, 4)) for a in hs],
}))
"""


def test_a100_2x4_islands(tmp_path: Path) -> None:
    node = SimNode.create("a100-2x4", tmp_path)
    gpus = node.python(ENUMERATE)["gpus"]
    bus_of = [g["bus"] for g in gpus]
    for i, g in enumerate(gpus):
        island = range(0, 4) if i < 4 else range(4, 8)
        assert len(g["links"]) == 12
        assert sorted(set(g["links"])) == sorted(bus_of[j] for j in island if j != i)
    m = node.python(P2P_MATRIX)
    for a in range(8):
        for b in range(8):
            if a == b:
                continue
            same_island = (a < 4) == (b < 4)
            assert (m["nvlink"][a][b] == 0) == same_island, (a, b)  # 0 = NVML_P2P_STATUS_OK
            assert m["ancestor"][a][b] in ((20, 40) if same_island else (50,))
    assert m["near_node"][0] == [1, 2, 3]
    assert m["near_node"][5] == [4, 6, 7]
    cpus0, cpus4 = m["cpus"][0], m["cpus"][4]
    assert any(cpus0) and any(cpus4)
    if sum(bin(w).count("1") for w in cpus0 + cpus4) > 1:  # more than one host CPU
        assert all(x & y == 0 for x, y in zip(cpus0, cpus4, strict=True))


def test_a10_pcie_has_no_nvlink(tmp_path: Path) -> None:
    node = SimNode.create("a10-pcie", tmp_path)
    gpus = node.python(ENUMERATE)["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA A10"] * 4
    assert all(g["links"] == [] for g in gpus)
    assert [g["numa"] for g in gpus] == [0, 0, 1, 1]
    assert all(g["mig"] is None for g in gpus)  # not MIG-capable
    m = node.python(P2P_MATRIX)
    assert m["nvlink"][0][1] != 0
    assert m["read"][0][1] == 0  # PCIe P2P inside one NUMA node
    assert m["read"][0][2] != 0  # not across the CPU interconnect


def test_container_view_follows_nvidia_visible_devices(dgx: SimNode) -> None:
    uuid6 = dgx.profile.gpus[6].uuid
    seen = dgx.python(ENUMERATE, NVIDIA_VISIBLE_DEVICES=f"{uuid6},2")
    assert [g["uuid"] for g in seen["gpus"]] == [uuid6, dgx.profile.gpus[2].uuid]
    assert [g["index"] for g in seen["gpus"]] == [0, 1]


HOLDER = """
import ctypes, json, os, sys
# The fake CUDA driver's job, done through the same shared state: reserve device memory.
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(3)
procs3 = n.nvmlDeviceGetComputeRunningProcesses_v3(h)
procs2 = n.nvmlDeviceGetComputeRunningProcesses_v2(h)
mem = n.nvmlDeviceGetMemoryInfo(h)
print(json.dumps({
    "used": mem.used, "free": mem.free,
    "v3": {str(p.pid): p.usedGpuMemory for p in procs3},
    "v2": {str(p.pid): p.usedGpuMemory for p in procs2},
    "graphics": len(n.nvmlDeviceGetGraphicsRunningProcesses(h)),
}))
"""


def test_memory_held_by_a_process_is_reported(dgx: SimNode) -> None:
    with dgx.holding(3, 3 << 30) as proc:
        seen = dgx.python(HOLDER)
        assert seen["used"] == 3 << 30
        assert seen["free"] == dgx.profile.gpus[3].memory_bytes - (3 << 30)
        assert seen["v3"] == {str(proc.pid): 3 << 30} == seen["v2"]
        assert seen["graphics"] == 0
    after = dgx.python(HOLDER)
    assert after["used"] == 0 and after["v3"] == {}


PROCESS_UTIL = """
import json, time, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
time.sleep(0.5)
# As a poller does: samples since its previous look, here 0.3 s ago (the loop runs throughout).
samples = n.nvmlDeviceGetProcessUtilization(h, int((time.time() - 0.3) * 1e6))
print(json.dumps({
    "gpu": n.nvmlDeviceGetUtilizationRates(h).gpu,
    "samples": {str(s.pid): s.smUtil for s in samples},
    "stamp_s": max(s.timeStamp for s in samples) / 1e6,
    "now_s": time.time(),
}))
"""


def test_kernel_loop_shows_in_per_process_utilisation(dgx: SimNode) -> None:
    with spinning(dgx, seconds=3) as proc:
        seen = dgx.python(PROCESS_UTIL)
    assert seen["gpu"] >= 90
    assert list(seen["samples"]) == [str(proc.pid)]
    assert seen["samples"][str(proc.pid)] >= 80
    assert abs(seen["now_s"] - seen["stamp_s"]) < 2  # CLOCK_REALTIME microseconds


PERIODIC_POLL = """
import json, time, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
time.sleep(0.3)
last, polls = int(time.time() * 1e6), []
for _ in range(40):  # 2 s of polls every 50 ms, each asking for samples since the last one
    time.sleep(0.05)
    try:
        samples = n.nvmlDeviceGetProcessUtilization(h, last)
    except n.NVMLError_NotFound:
        polls.append(None)
        continue
    last = max(s.timeStamp for s in samples)
    polls.append({"stamp": last, "util": {str(s.pid): s.smUtil for s in samples}})
print(json.dumps({"polls": polls, "period_us": n.nvmlDeviceGetEncoderUtilization(h)[1]}))
"""


def test_realistic_sampling_reports_per_driver_period(dgx: SimNode) -> None:
    """VGPU_SIM_UTIL_SAMPLING=realistic: a 50 ms poller gets one new sample per 200 ms driver
    period (NOT_FOUND in between), stamped at period ends that are a period (+- jitter) apart,
    each with the busy share of its period."""
    sampling = {
        "VGPU_SIM_UTIL_SAMPLING": "realistic",
        "VGPU_SIM_UTIL_PERIOD_US": "200000",
        "VGPU_SIM_UTIL_JITTER_US": "20000",
    }
    with spinning(dgx, seconds=4) as proc:
        seen = dgx.python(PERIODIC_POLL, **sampling)
    polls = seen["polls"]
    fresh = [p for p in polls if p is not None]
    assert seen["period_us"] == 200000
    assert 7 <= len(fresh) <= 12, polls  # 2 s / 0.2 s, never one per poll
    assert polls.count(None) >= 25, polls
    stamps = [p["stamp"] for p in fresh]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    # Consecutive samples are whole periods apart (one, or more if a poll was delayed).
    for gap in gaps:
        periods = round(gap / 200000)
        assert periods >= 1 and abs(gap - periods * 200000) <= 20000 + 1000, gaps
    assert all(p["util"].get(str(proc.pid), 0) >= 90 for p in fresh[1:]), fresh
