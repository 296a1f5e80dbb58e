"""Memory caps enforced by the preloaded hook on the simulated GPU, run as a container runs.

Proves: every allocation path is counted and capped (through dlsym and through
cuGetProcAddress_v2 like the CUDA runtime / cuda-python); frees refund exactly; the claim's
processes share one cap; SIGKILL at any point frees the victim's share; fork and threads are
safe; cuMemGetInfo / cuDeviceTotalMem report the cap; no config = pass-through.
"""

from __future__ import annotations

import signal
import struct
import subprocess
import time
from collections.abc import Iterator

import pytest

from kubelet_plugin.region import Region
from tests.fixtures.probe import holding_memory
from tests.integration.vgpu_hook.conftest import GIB, HOOK_DIR, PROBE, UUIDS, Node, field
from vgpu_testbed.container import container_command

CAP = GIB
NULL_DRIVER = HOOK_DIR / "build" / "nulldrv"
MIB = 1 << 20


def _line(uuid: str = UUIDS[0], memory: int = CAP, extra: str = "") -> str:
    return f"device uuid={uuid} memory={memory} cores=0 policy=fixed oversubscribe=0 {extra}"


# step to allocate ~600 MiB by each path, and one more of the same that must exceed the cap
PATHS = {
    "cuMemAlloc_v2": "alloc:629145600",
    "cuMemAllocPitch_v2": "pitch:20480x30720",  # 600 MiB (+ row padding)
    "cuMemAllocManaged": "managed:629145600",
    "cuMemAllocAsync": "async:629145600",
    "cuMemAllocFromPoolAsync": "pool:629145600",
    "cuMemCreate": "vmm:629145600",
    "cuArrayCreate_v2": "array:12800x12288",  # float, 1 channel: 600 MiB
    "cuArray3DCreate_v2": "array3d:1280x1280x96",  # 600 MiB
    "cuMipmappedArrayCreate": "mipmap:11264x11264:3",  # ~605 MiB over 3 levels
}


@pytest.mark.parametrize("procaddr", [False, True], ids=["dlsym", "cuGetProcAddress"])
@pytest.mark.parametrize("path", list(PATHS))
def test_each_allocation_path_is_capped(node: Node, path: str, procaddr: bool) -> None:
    claim = node.claim("c-paths", [_line()])
    step = PATHS[path]
    out = claim.probe("init", step, step, "info", "freeall", "info", procaddr=procaddr)
    assert field(out[1], "rc") == 0, out
    assert field(out[2], "rc") == 2, f"second {path} should be CUDA_ERROR_OUT_OF_MEMORY: {out}"
    used = CAP - field(out[3], "free")
    assert 600 * MIB <= used <= 640 * MIB, out
    assert out[4] == "freeall failures=0"
    assert field(out[5], "free") == CAP, "frees must refund exactly what was charged"


def test_legacy_v1_abi_through_procaddress(node: Node) -> None:
    claim = node.claim("c-v1", [_line()])
    out = claim.probe("init", "alloc1:629145600", "alloc1:629145600", procaddr=True)
    rcs = [field(line, "rc") for line in out[1:]]
    # Either the fake simulates the 32-bit ABI (then it is capped), or it answers
    # CUDA_ERROR_NOT_SUPPORTED (801, its generated stub) and nothing is charged, or it lacks it.
    assert rcs in ([0, 2], [801, 801], [500, 500]), out


def test_meminfo_and_total_report_the_cap(node: Node) -> None:
    claim = node.claim("c-info", [_line()])
    out = claim.probe("init", "total", "info", "alloc:104857600", "info")
    assert field(out[1], "bytes") == CAP
    assert (field(out[2], "free"), field(out[2], "total")) == (CAP, CAP)
    assert field(out[4], "free") == CAP - 100 * MIB


def test_unconfigured_is_pass_through(node: Node) -> None:
    claim = node.claim("c-none", None)
    out = claim.probe("init", "total", "alloc:2147483648", "info")
    assert field(out[1], "bytes") == 40 * GIB
    assert field(out[2], "rc") == 0
    assert field(out[3], "total") == 40 * GIB


def test_bad_memory_value_fails_closed(node: Node) -> None:
    claim = node.claim("c-bad", [f"device uuid={UUIDS[0]} memory=lots cores=0"])
    done = claim.run([str(PROBE), "init", "alloc:1024"])
    assert "alloc rc=2" in done.stdout
    assert "memory='lots'" in done.stderr  # the log names the field and value


def test_processes_of_a_claim_share_one_cap(node: Node) -> None:
    claim = node.claim("c-share", [_line()])
    holder = claim.start([str(PROBE), "init", "alloc:629145600", "ready", "sleep:5000"])
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().startswith("init rc=0")
        assert holder.stdout.readline().startswith("alloc rc=0")
        assert holder.stdout.readline().strip() == "ready"
        out = claim.probe("init", "info", "alloc:629145600", "alloc:314572800")
        assert field(out[1], "free") == CAP - 600 * MIB
        assert field(out[2], "rc") == 2
        assert field(out[3], "rc") == 0
    finally:
        holder.kill()
        holder.wait()


def test_sigkill_during_use_releases_the_share_quickly(node: Node) -> None:
    claim = node.claim("c-kill", [_line()])
    victim = claim.start([str(PROBE), "init", "alloc:943718400", "ready", "sleep:30000"])
    assert victim.stdout is not None
    for _ in range(3):
        victim.stdout.readline()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    start = time.monotonic()
    out = claim.probe("init", "alloc:943718400")
    assert field(out[1], "rc") == 0, "the dead process's usage must be reclaimed"
    assert time.monotonic() - start < 5  # includes namespace setup and process start


def test_sigkill_storm_during_allocation(node: Node) -> None:
    """Processes killed at random points of alloc/free loops never leak or block the cap."""
    claim = node.claim("c-storm", [_line()])
    steps = [str(PROBE), "init"] + ["alloc:104857600", "free"] * 400
    procs = [
        subprocess.Popen(
            container_command(claim.spec, claim.device_names, steps),
            env=node.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(4)
    ]
    time.sleep(0.8)
    for p in procs:
        p.kill()
        p.wait()
    out = claim.probe("init", "alloc:1073741824")
    assert field(out[1], "rc") == 0


def test_fork_child_gets_its_own_slot(node: Node) -> None:
    """A child that outlives its parent must not keep the parent's usage alive."""
    claim = node.claim("c-fork", [_line()])
    out = claim.probe("init", "alloc:943718400", "forkhold:4000", "info")
    assert field(out[3], "free") == CAP - 900 * MIB
    # The parent exited (normally, without freeing); its child still runs for ~4 s.
    out = claim.probe("init", "alloc:943718400")
    assert field(out[1], "rc") == 0


def test_fork_child_allocates_in_its_own_slot(node: Node) -> None:
    """A forked child is charged in its own slot against the shared cap; when it dies without
    freeing, its share comes back (reports within 200 ms, allocations at once)."""
    claim = node.claim("c-forkalloc", [_line()])
    out = claim.probe(
        "init",
        "alloc:629145600",
        "forkalloc:314572800",
        "sleep:300",
        "info",
        "forkalloc:419430400",
    )
    assert out[2] == f"child rc=0 free={CAP - 900 * MIB}"
    assert field(out[4], "free") == CAP - 600 * MIB
    assert out[5] == f"child rc=0 free={CAP - 1000 * MIB}"


def test_normal_exit_releases_the_share_immediately(node: Node) -> None:
    claim = node.claim("c-exit", [_line()])
    claim.probe("init", "alloc:943718400")  # exits without freeing
    out = claim.probe("init", "info")
    assert field(out[1], "free") == CAP


def test_threads_never_exceed_the_cap(node: Node) -> None:
    claim = node.claim("c-threads", [_line()])
    out = claim.probe("init", "threads:16:104857600", "info")
    assert field(out[1], "allocations") == 10  # exactly floor(1 GiB / 100 MiB)
    assert field(out[2], "free") == CAP - 1000 * MIB


def test_two_gpus_each_capped_and_reordering_respected(node: Node) -> None:
    lines = [_line(UUIDS[0], CAP), _line(UUIDS[1], 2 * CAP)]
    claim = node.claim("c-multi", lines, gpus=(0, 1))
    out = claim.probe("-d", "1", "init", "uuid", "total")
    assert UUIDS[1].lower() in out[1].lower()
    assert field(out[2], "bytes") == 2 * CAP
    # CUDA_VISIBLE_DEVICES=1,0 makes GPU 1 ordinal 0: the cap follows the UUID.
    done = claim.run([str(PROBE), "init", "uuid", "total"], CUDA_VISIBLE_DEVICES="1,0")
    lines_out = done.stdout.splitlines()
    assert UUIDS[1].lower() in lines_out[1].lower(), done.stdout + done.stderr
    assert field(lines_out[2], "bytes") == 2 * CAP


def test_meminfo_accepts_one_null_pointer(node: Node) -> None:
    claim = node.claim("c-null", [_line()])
    out = claim.probe("init", "infonull")
    assert field(out[1], "rc") == 0 and field(out[1], "total") == CAP
    assert field(out[1], "rc2") == 0 and field(out[1], "free") == CAP
    assert field(out[1], "rc3") == 1  # both NULL: CUDA_ERROR_INVALID_VALUE, no crash


NULL_UUID = "GPU-11111111-1111-1111-1111-111111111111"  # what the null driver reports


def test_oversubscription_falls_back_to_managed_within_the_cap(node: Node) -> None:
    """The same fallback against the null driver, which refuses device memory at a set size and
    grants any managed memory (the hook alone, no simulated memory model involved)."""
    claim = node.claim(
        "c-oversub", [f"device uuid={NULL_UUID} memory={4 * GIB} cores=0 oversubscribe=1"]
    )
    done = claim.run(
        [str(PROBE), "init", "alloc:1073741824", "alloc:2684354560", "info", "alloc:1073741824"],
        LD_LIBRARY_PATH=str(NULL_DRIVER),
        NULLDRV_DEVICE_BYTES=str(2 * GIB),
        VGPU_LOG_LEVEL="info",
    )
    out = done.stdout.splitlines()
    assert field(out[1], "rc") == 0  # 1 GiB on the device
    assert field(out[2], "rc") == 0, done.stderr  # 2.5 GiB: device refuses, managed fallback
    assert field(out[3], "free") == 4 * GIB - GIB - 2560 * MIB  # both count against the cap
    assert field(out[4], "rc") == 2  # 4.5 GiB > cap
    assert "oversubscribed into managed memory" in done.stderr
    with Region(str(claim.dir / "region")) as region:
        assert region.layout.devices[0].oversub_allocs == 1


def test_oversubscription_off_means_out_of_memory(node: Node) -> None:
    claim = node.claim("c-nooversub", [f"device uuid={NULL_UUID} memory={4 * GIB} cores=0"])
    done = claim.run(
        [str(PROBE), "init", "alloc:2684354560", "info"],
        LD_LIBRARY_PATH=str(NULL_DRIVER),
        NULLDRV_DEVICE_BYTES=str(2 * GIB),
    )
    out = done.stdout.splitlines()
    assert field(out[1], "rc") == 2
    assert field(out[2], "free") == 4 * GIB  # the refused charge was refunded


OVERSUB_CAP = 8 * GIB
FILLER = 36 * GIB  # another tenant leaves 4 GiB of the 40 GiB GPU free


def _oversub_line(oversubscribe: int) -> str:
    return (
        f"device uuid={UUIDS[0]} memory={OVERSUB_CAP} cores=0 policy=fixed "
        f"oversubscribe={oversubscribe}"
    )


@pytest.fixture
def filled_gpu(node: Node) -> Iterator[None]:
    """An uncapped process (no vgpu.conf) holding 36 GiB of the 40 GiB simulated GPU."""
    other = node.claim("c-filler", None)
    with holding_memory(other.spec, other.device_names, FILLER, node.env):
        yield


# 2 GiB fits in the 4 GiB the GPU has free; 3 GiB more does not (2 GiB left); 4 GiB more would
# cross the 8 GiB cap.
OVERSUB_STEPS = ["init", "alloc:2147483648", "alloc:3221225472", "info", "alloc:4294967296"]


def test_oversubscription_on_the_simulated_gpu(node: Node, filled_gpu: None) -> None:
    """The simulated driver grants managed memory beyond free device memory (the excess is
    host-resident), so the hook's fallback runs against a GPU that is really full."""
    claim = node.claim("c-oversub-sim", [_oversub_line(1)])
    done = claim.run(
        [str(PROBE), *OVERSUB_STEPS], VGPU_LOG_LEVEL="info", VGPU_SIM_HOST_MEMORY=str(16 * GIB)
    )
    out = done.stdout.splitlines()
    assert field(out[1], "rc") == 0, done.stderr  # 2 GiB of device memory
    assert field(out[2], "rc") == 0, done.stderr  # device full: managed fallback
    assert field(out[3], "free") == OVERSUB_CAP - 5 * GIB  # both count against the cap
    assert field(out[4], "rc") == 2  # 9 GiB > 8 GiB cap: still out of memory
    assert "3221225472 bytes" in done.stderr
    assert "oversubscribed into managed memory" in done.stderr
    with Region(str(claim.dir / "region")) as region:
        assert region.layout.devices[0].oversub_allocs == 1
    # Only the device-resident part was ever charged to the GPU: the filler's 36 GiB is intact
    # and the process's memory went back at exit.
    probe = node.claim("c-after", None).probe("init", "info")
    assert field(probe[1], "free") == 40 * GIB - FILLER


def test_no_oversubscription_on_the_simulated_gpu_is_out_of_memory(
    node: Node, filled_gpu: None
) -> None:
    claim = node.claim("c-nooversub-sim", [_oversub_line(0)])
    done = claim.run([str(PROBE), *OVERSUB_STEPS], VGPU_LOG_LEVEL="info")
    out = done.stdout.splitlines()
    assert field(out[1], "rc") == 0, done.stderr
    assert field(out[2], "rc") == 2  # the GPU has 2 GiB free: the driver refuses 3 GiB
    assert field(out[3], "free") == 2 * GIB  # cap - 2 GiB, bounded by the GPU's free memory
    assert "oversubscribed into" not in done.stderr
    with Region(str(claim.dir / "region")) as region:
        assert region.layout.devices[0].oversub_allocs == 0


def test_many_processes_starting_together_share_the_cap_exactly(node: Node) -> None:
    """60 processes start at once, each wants 20 MiB and holds it: exactly floor(cap/20 MiB)
    succeed, whatever the interleaving of their start-up and allocation. (60: the simulated
    GPU has 64 process slots per GPU.)"""
    claim = node.claim("c-crowd", [_line()])
    script = (
        'i=0; while [ $i -lt 60 ]; do "$PROBE" init alloc:20971520 sleep:2500 & '
        "i=$((i+1)); done; wait"
    )
    done = claim.run(["sh", "-c", script], timeout=120, PROBE=str(PROBE))
    assert done.stdout.count("init rc=0") == 60, done.stderr[-2000:]
    assert done.stdout.count("alloc rc=0") == CAP // (20 * MIB)
    assert done.stdout.count("alloc rc=2") == 60 - CAP // (20 * MIB)
    assert done.stderr.count("refused") == 60 - CAP // (20 * MIB)  # all refusals are ours


def test_unusable_region_falls_back_to_per_process_caps(node: Node) -> None:
    claim = node.claim("c-noregion", [_line()])
    # A region of another layout version (the plugin creates the file; its header says v99).
    with open(claim.dir / "region", "r+b") as region:
        region.write(struct.pack("<IIIII", 0x55504756, 99, 0, 1, 1))  # magic version size n ready
    done = claim.run([str(PROBE), "init", "alloc:629145600", "alloc:629145600"])
    out = done.stdout.splitlines()
    assert [field(x, "rc") for x in out[1:]] == [0, 2]  # still capped within the process
    assert "caps are enforced per process only" in done.stderr


def test_legacy_32bit_reporting_shows_the_cap(node: Node) -> None:
    claim = node.claim("c-legacy", [f"device uuid={NULL_UUID} memory={GIB} cores=0"])
    done = claim.run(
        [str(PROBE), "init", "alloc:104857600", "legacyinfo"], LD_LIBRARY_PATH=str(NULL_DRIVER)
    )
    line = done.stdout.splitlines()[-1]
    assert field(line, "rc") == 0 and field(line, "rc2") == 0, line
    assert field(line, "total") == GIB and field(line, "devtotal") == GIB
    assert field(line, "free") == GIB - 100 * MIB
