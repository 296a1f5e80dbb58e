"""MIG on the simulated GPUs, through pynvml and the fake CUDA driver in separate processes.

Proves:
1. Mode change rules: a MIG-capable GPU starts disabled; enabling it while a CUDA process holds
   memory on it leaves the change pending (activation status IN_USE); once that process is gone
   the retry applies it.
2. Instances created by one process (pynvml) are seen by another: GPU instances with their
   placements, MIG device handles by index and by MIG UUID, name, memory, attributes.
3. Placement validity on A100 40 GB: the public profile table, possible placements, overlap and
   the full-GPU profile refused while slices are taken.
4. CUDA with CUDA_VISIBLE_DEVICES=MIG-<uuid> (NVIDIA_VISIBLE_DEVICES the same) enumerates the
   instance as device 0 with its memory and SM count, and is capped by the instance's memory.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.fakegpu.nvml_node import PROGRAMS, SimNode, build_fakegpu

MIB = 1 << 20
NVML_ERROR_IN_USE = 19


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build_fakegpu()


def run_program(node: SimNode, argv: list[str], **extra: str) -> list[str]:
    done = subprocess.run(
        argv, env={**node.env, **extra}, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


@contextmanager
def holding(node: SimNode, ordinal: int, nbytes: int, **extra: str) -> Iterator[None]:
    """A CUDA process (cuda_hold) holding nbytes on CUDA device `ordinal` of its view until the
    block ends; killed and reaped afterwards."""
    proc = subprocess.Popen(
        [str(PROGRAMS / "cuda_hold"), str(ordinal), str(nbytes)],
        env={**node.env, **extra},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        yield
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


ENABLE = """
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex({gpu})
before = list(n.nvmlDeviceGetMigMode(h))
status = n.nvmlDeviceSetMigMode(h, 1)
print(json.dumps({{"before": before, "status": status, "after": list(n.nvmlDeviceGetMigMode(h))}}))
"""

CREATE = """
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex({gpu})
info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
gi = n.nvmlDeviceCreateGpuInstance(h, info.id)
ci = n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
small = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
gi1 = n.nvmlDeviceCreateGpuInstance(h, small.id)
n.nvmlGpuInstanceCreateComputeInstance(gi1, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
p = n.nvmlGpuInstanceGetInfo(gi).placement
print(json.dumps({{"profile": info.id, "placement": [p.start, p.size]}}))
"""

LIST = """
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex({gpu})
v = lambda x: getattr(x, "value", x)  # some pynvml versions return ctypes integers
out = []
for i in range(v(n.nvmlDeviceGetMaxMigDeviceCount(h))):
    try:
        m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
    except n.NVMLError_NotFound:
        break
    uuid = n.nvmlDeviceGetUUID(m)
    again = n.nvmlDeviceGetHandleByUUID(uuid)
    attrs = n.nvmlDeviceGetAttributes(m)
    out.append({{
        "uuid": uuid,
        "same_by_uuid": n.nvmlDeviceGetUUID(again) == uuid,
        "name": n.nvmlDeviceGetName(m),
        "gi": v(n.nvmlDeviceGetGpuInstanceId(m)),
        "ci": v(n.nvmlDeviceGetComputeInstanceId(m)),
        "is_mig": v(n.nvmlDeviceIsMigDeviceHandle(m)),
        "parent": n.nvmlDeviceGetUUID(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)),
        "total": n.nvmlDeviceGetMemoryInfo(m).total,
        "used": n.nvmlDeviceGetMemoryInfo(m).used,
        "sms": attrs.multiprocessorCount,
        "gi_slices": attrs.gpuInstanceSliceCount,
    }})
print(json.dumps({{"parent": n.nvmlDeviceGetUUID(h), "devices": out}}))
"""


def test_mode_change_waits_for_an_idle_gpu(tmp_path: Path) -> None:
    node = SimNode.create("dgx-h100", tmp_path)
    with holding(node, 2, 256 * MIB):
        busy = node.python(ENABLE.format(gpu=2))
    assert busy == {"before": [0, 0], "status": NVML_ERROR_IN_USE, "after": [0, 1]}
    # The holder was killed: the retry finds the GPU idle (the dead process is reaped).
    idle = node.python(ENABLE.format(gpu=2))
    assert idle == {"before": [0, 1], "status": 0, "after": [1, 1]}


def test_instances_are_shared_between_processes_and_cuda_sees_one(tmp_path: Path) -> None:
    node = SimNode.create("dgx-h100", tmp_path)
    assert node.python(ENABLE.format(gpu=1))["status"] == 0
    created = node.python(CREATE.format(gpu=1))
    # 3g.40gb: profile id 9; the simulator places it at the highest free start (4, 4 slices).
    assert created == {"profile": 9, "placement": [4, 4]}
    listed = node.python(LIST.format(gpu=1))
    devices = listed["devices"]
    assert [(d["gi"], d["ci"]) for d in devices] == [(1, 0), (2, 0)]
    big, small = devices
    assert big["name"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert small["name"] == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert big["total"] == 40448 * MIB and big["sms"] == 60 and big["gi_slices"] == 3
    assert small["total"] == 9984 * MIB and small["sms"] == 16
    for d in devices:
        assert d["uuid"].startswith("MIG-") and d["same_by_uuid"] and d["is_mig"] == 1
        assert d["parent"] == listed["parent"]

    # CUDA confined to the 3g.40gb instance: one device, the instance's memory and SMs.
    mig = big["uuid"]
    lines = run_program(
        node, [str(PROGRAMS / "cuda_list")], CUDA_VISIBLE_DEVICES=mig, NVIDIA_VISIBLE_DEVICES=mig
    )
    assert lines[0] == "count=1"
    ordinal, uuid, _bus, total, sms, name = lines[1].split(" ", 5)
    assert ordinal == "0" and int(total) == 40448 * MIB and int(sms) == 60
    assert uuid[4:] == mig[4:]  # the UUID's bytes are the MIG device's
    assert name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"

    # Memory a CUDA process holds on the instance shows on that MIG device only.
    with holding(node, 0, 1024 * MIB, CUDA_VISIBLE_DEVICES=mig, NVIDIA_VISIBLE_DEVICES=mig):
        during = node.python(LIST.format(gpu=1))["devices"]
    assert [d["used"] for d in during] == [1024 * MIB, 0]


def test_a100_placements(tmp_path: Path) -> None:
    node = SimNode.create("a100-2x4", tmp_path)
    assert node.python(ENABLE.format(gpu=0))["status"] == 0
    out = node.python("""
import ctypes, json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
table = {}
for index in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
    try:
        info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
    except n.NVMLError_NotSupported:
        continue
    v2 = n.nvmlDeviceGetGpuInstanceProfileInfoV(h, index)
    count = ctypes.c_uint(0)
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(count))
    placements = (n.c_nvmlGpuInstancePlacement_t * count.value)()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, placements, ctypes.byref(count))
    starts = [p.start for p in placements]
    table[v2.name.decode() if isinstance(v2.name, bytes) else v2.name] = [
        info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount, starts]
# pynvml hands the placement to C as is: pass a pointer, as the C prototype wants.
at = lambda start, size: ctypes.byref(n.c_nvmlGpuInstancePlacement_t(start, size))
four = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 5, at(0, 4))
errors = []
for profile, start, size in ((9, 0, 4), (0, 0, 8), (14, 2, 2)):
    try:
        n.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile, at(start, size))
        errors.append("created")
    except n.NVMLError as e:
        errors.append(str(e))
left = getattr(left := n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19), "value", left)
print(json.dumps({"table": table, "errors": errors, "left_1g": left}))
""")
    assert out["table"] == {
        "MIG 1g.5gb": [19, 1, 7, 14, [0, 1, 2, 3, 4, 5, 6]],
        "MIG 1g.5gb+me": [20, 1, 1, 14, [0, 1, 2, 3, 4, 5, 6]],
        "MIG 1g.10gb": [15, 1, 4, 14, [0, 2, 4, 6]],
        "MIG 2g.10gb": [14, 2, 3, 28, [0, 2, 4]],
        "MIG 3g.20gb": [9, 3, 2, 42, [0, 4]],
        "MIG 4g.20gb": [5, 4, 1, 56, [0]],
        "MIG 7g.40gb": [0, 7, 1, 98, [0]],
    }
    # 4g.20gb holds slices 0-3: 3g at 0 and the whole GPU overlap it, 2g at 2 too.
    assert out["errors"] == ["Insufficient resources"] * 3
    assert out["left_1g"] == 3  # slices 4, 5, 6 (3 compute slices left)
