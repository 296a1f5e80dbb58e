"""Fault injection on a simulated node, seen through pynvml, and the `vgpu-dra fakegpu` CLI.

Proves:
1. An XID injected with `vgpu-dra fakegpu inject xid` (another process) reaches a pynvml event
   set registered for XidCriticalError on that GPU, with the right device and XID; an idle wait
   times out.
2. `inject lost` makes NVML calls on that GPU fail with GPU_IS_LOST (and raises XID 79); other
   GPUs keep working; `--clear` recovers it. The Python API (`set_gpu_lost`) does the same.
3. `inject removed` hides the GPU from processes that start later; `inject added` restores it.
4. `fakegpu status` reports processes and memory; `fakegpu env` prints a usable environment;
   bad input (unknown GPU, missing node, missing XID) fails with a clear message, exit code 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.fakegpu.nvml_node import SimNode, build_fakegpu
from vgpu_testbed.fakegpu import simulator as fakegpu


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build_fakegpu()


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "fakegpu", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


WAIT_XID = """
import json, sys, pynvml as n
n.nvmlInit()
s = n.nvmlEventSetCreate()
for i in range(n.nvmlDeviceGetCount()):
    n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(i), n.nvmlEventTypeXidCriticalError, s)
try:
    n.nvmlEventSetWait_v2(s, 100)
    idle = "event"
except n.NVMLError_Timeout:
    idle = "timeout"
print("registered", flush=True)
e = n.nvmlEventSetWait_v2(s, 20000)
print(json.dumps({"idle": idle, "uuid": n.nvmlDeviceGetUUID(e.device), "type": e.eventType,
                  "xid": e.eventData}))
"""


def test_injected_xid_reaches_an_event_set(tmp_path: Path) -> None:
    node = SimNode.create("dgx-h100", tmp_path)
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAIT_XID],
        env=node.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiter.stdout is not None
        assert waiter.stdout.readline().strip() == "registered"
        uuid5 = node.profile.gpus[5].uuid
        cli("inject", "xid", uuid5, "48", "--state", str(node.state))
        out, err = waiter.communicate(timeout=30)
    finally:
        waiter.kill()
    assert waiter.returncode == 0, err
    event = json.loads(out)
    assert event == {"idle": "timeout", "uuid": uuid5, "type": 8, "xid": 48}
    assert fakegpu.gpu_status(node.state)["gpus"][5]["xid_seq"] == 1


LOST_PROBE = """
import json, pynvml as n
n.nvmlInit()
out = {}
for i in (1, 2):
    try:
        h = n.nvmlDeviceGetHandleByIndex(i)
        out[i] = n.nvmlDeviceGetMemoryInfo(h).total
    except n.NVMLError_GpuIsLost:
        out[i] = "lost"
print(json.dumps(out))
"""


def test_lost_gpu_errors_and_recovers(tmp_path: Path) -> None:
    node = SimNode.create("a100-2x4", tmp_path)
    total = node.profile.gpus[2].memory_bytes
    cli("inject", "lost", "2", "--state", str(node.state))
    assert node.python(LOST_PROBE) == {"1": total, "2": "lost"}
    status = fakegpu.gpu_status(node.env)
    assert status["gpus"][2]["lost"] is True
    assert status["gpus"][2]["xid_seq"] == 1  # XID 79 raised when it fell off the bus
    cli("inject", "lost", "2", "--clear", "--state", str(node.state))
    assert node.python(LOST_PROBE) == {"1": total, "2": total}
    fakegpu.set_gpu_lost(node.env, 1, True)
    assert node.python(LOST_PROBE) == {"1": "lost", "2": total}
    fakegpu.set_gpu_lost(node.env, 1, False)


COUNT = """
import json, pynvml as n
n.nvmlInit()
print(json.dumps([n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i))
                  for i in range(n.nvmlDeviceGetCount())]))
"""


def test_removed_gpu_disappears_and_comes_back(tmp_path: Path) -> None:
    node = SimNode.create("l4-2", tmp_path)
    uuids = [g.uuid for g in node.profile.gpus]
    assert node.python(COUNT) == uuids
    cli("inject", "removed", "0", "--state", str(node.state))
    assert node.python(COUNT) == uuids[1:]
    fakegpu.set_gpu_removed(node.state, 0, False)
    assert node.python(COUNT) == uuids


def test_status_shows_processes_and_memory(tmp_path: Path) -> None:
    node = SimNode.create("dgx-h100", tmp_path)
    with node.holding(1, 5 << 30) as proc:
        status = fakegpu.gpu_status(node.state)
        gpu1 = status["gpus"][1]
        assert gpu1["memory_used"] == 5 << 30
        assert gpu1["processes"] == [{"pid": proc.pid, "memory_used": 5 << 30, "utilization": 0}]
        text = cli("status", "--state", str(node.state)).stdout
        assert f"pid {proc.pid}: 5120 MiB" in text
        assert "gpu 1 NVIDIA H100 80GB HBM3" in text
    deadline = time.monotonic() + 10
    while fakegpu.gpu_status(node.state)["gpus"][1]["processes"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fakegpu.gpu_status(node.state)["gpus"][1]["memory_used"] == 0


def test_env_prints_a_working_environment(tmp_path: Path) -> None:
    state = tmp_path / "shell.state"
    out = cli("env", "l4-2", "--state", str(state)).stdout
    script = out + "\n" + f"{sys.executable} -c '{COUNT.strip()}'"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "GPU-ae852fd9-4ea9-5f60-b41c-d4f020bd10cd" in done.stdout
    assert (state.parent / "shell.state.profile").stat().st_mode & 0o077 == 0


def test_list_and_show() -> None:
    listing = cli("list").stdout
    assert "dgx-h100     8x NVIDIA H100 80GB HBM3" in listing
    shown = cli("show", "a100-2x4").stdout
    assert "NVLink 1x4, 2x4, 3x4" in shown
    sim = cli("show", "l4-2", "--sim").stdout
    assert "gpu.count=2" in sim


def test_bad_input_is_reported(tmp_path: Path) -> None:
    node = SimNode.create("l4-2", tmp_path)
    done = cli("inject", "xid", "7", "48", "--state", str(node.state), check=False)
    assert done.returncode == 1 and "GPU '7'" in done.stderr and "l4-2" in done.stderr
    done = cli("inject", "xid", "0", "--state", str(node.state), check=False)
    assert done.returncode == 1 and "positive XID" in done.stderr
    done = cli("status", "--state", str(tmp_path / "nowhere.state"), check=False)
    assert done.returncode == 1 and "no simulated node" in done.stderr
    done = cli("show", "dgx-h999", check=False)
    assert done.returncode == 1 and "no such profile" in done.stderr


def test_prepare_node_keeps_state_for_the_same_profile_only(tmp_path: Path) -> None:
    node = SimNode.create("l4-2", tmp_path)
    fakegpu.inject_xid(node.state, 1, 13)
    fakegpu.prepare_node(node.profile, node.state)  # same profile: same node
    assert fakegpu.gpu_status(node.state)["gpus"][1]["xid_seq"] == 1
    fakegpu.prepare_node(fakegpu.load_profile("a10-pcie"), node.state)  # another machine
    status = fakegpu.gpu_status(node.state)
    assert status["node"] == "a10-pcie" and status["gpus"][1]["xid_seq"] == 0
