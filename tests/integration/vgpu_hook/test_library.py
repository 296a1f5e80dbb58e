"""Properties of libvgpu.so itself and of real client libraries using it.

Proves: (1) only the hooks.def symbols, dlsym, dlvsym and dlmopen are exported; (2) no
constructor does work (.init_array holds only the compiler's frame_dummy) and no internal call
goes through the public dlsym; (3) a program without any GPU library, and a CUDA program
whose driver is missing, run normally under the hook; (4) cuda-python 13 (dlsym +
cuGetProcAddress_v2) sees the cap in cuMemGetInfo/cuDeviceTotalMem and gets
CUDA_ERROR_OUT_OF_MEMORY past it;
(5) pynvml and nvitop inside the container report total = cap and used = the claim's usage;
(6) the ASan+UBSan build of the hook runs every wrapper cleanly, also with a sanitizer
runtime that calls our dlsym while it initialises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.integration.vgpu_hook.conftest import (
    GIB,
    HOOK_DIR,
    HOOK_LIB,
    PROBE,
    UUIDS,
    Claim,
    Node,
    fake_has_nvml,
    field,
)

ASAN_HOOK = HOOK_DIR / "build" / "asan" / "libvgpu.so"


def _hooked_names() -> set[str]:
    text = (HOOK_DIR / "src" / "hooks.def").read_text()
    return set(re.findall(r"^HOOK_(?:CU|NVML)\((\w+)\)", text, re.M))


def test_exports_are_exactly_the_hook_list(built: None) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(HOOK_LIB)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert exported == _hooked_names() | {"dlsym", "dlvsym", "dlmopen"}


def test_no_constructor_work_and_no_public_dlsym_calls(built: None) -> None:
    headers = subprocess.run(
        ["objdump", "-h", str(HOOK_LIB)], capture_output=True, text=True, check=True
    ).stdout
    init = [line.split() for line in headers.splitlines() if ".init_array" in line]
    assert init and int(init[0][2], 16) == 8, "only frame_dummy may be in .init_array"
    asm = subprocess.run(
        ["objdump", "-d", str(HOOK_LIB)], capture_output=True, text=True, check=True
    ).stdout
    assert "<dlsym@plt>" not in asm


def test_non_gpu_program_and_missing_driver_are_unaffected(node: Node) -> None:
    claim = node.claim("c-plain", [f"device uuid={UUIDS[0]} memory={GIB} cores=30"])
    done = claim.run(["sh", "-c", "echo hello; cat /etc/ld.so.preload"])
    assert done.returncode == 0
    assert done.stdout.split() == ["hello", "/usr/local/vgpu-dra/lib/libvgpu.so"]
    done = claim.run([str(PROBE), "init"], LD_LIBRARY_PATH="/nonexistent")
    assert done.returncode == 2 and "dlopen failed" in done.stdout


CUDA_PYTHON = textwrap.dedent(
    """
    from cuda.bindings import driver as d
    assert d.cuInit(0)[0] == 0
    _, dev = d.cuDeviceGet(0)
    _, ctx = d.cuDevicePrimaryCtxRetain(dev)
    d.cuCtxSetCurrent(ctx)
    err, free, total = d.cuMemGetInfo()
    print("info", int(err), free, total)
    print("total", int(d.cuDeviceTotalMem(dev)[1]))
    e1, _ = d.cuMemAlloc(600 << 20)
    e2, _ = d.cuMemAlloc(600 << 20)
    e3, _ = d.cuMemAllocAsync(600 << 20, None)
    print("alloc", int(e1), int(e2), int(e3))
    """
)


def test_cuda_python_hits_the_cap(node: Node) -> None:
    claim = node.claim("c-cudapy", [f"device uuid={UUIDS[0]} memory={GIB} cores=0"])
    done = claim.run([sys.executable, "-c", CUDA_PYTHON])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"info 0 {GIB} {GIB}"
    assert lines[1] == f"total {GIB}"
    assert lines[2] == "alloc 0 2 2"


PYNVML = textwrap.dedent(
    f"""
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByUUID("{UUIDS[0]}")
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    print(m.total, m.used, m.free)
    """
)


def beside_300_mib(
    claim: Claim, command: str, *, hold_ms: int, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run the shell `command` in the claim's container while a probe there holds 300 MiB of
    device memory (allocated a second before the command starts, held for `hold_ms`)."""
    argv = ["sh", "-c", f"{PROBE} init alloc:314572800 sleep:{hold_ms} & sleep 1; {command}; wait"]
    return claim.run(argv, timeout=timeout, **env)


@pytest.mark.skipif(not fake_has_nvml(), reason="the simulated NVML is not built yet")
def test_pynvml_inside_shows_the_cap(node: Node) -> None:
    claim = node.claim("c-nvml", [f"device uuid={UUIDS[0]} memory={GIB} cores=0"])
    holder = beside_300_mib(claim, f"{sys.executable} -c '{PYNVML}'", hold_ms=3000)
    assert holder.returncode == 0, holder.stderr
    total, used, free = map(int, holder.stdout.splitlines()[-1].split())
    assert total == GIB
    assert used == 300 << 20
    assert free == GIB - (300 << 20)


@pytest.mark.skipif(not fake_has_nvml(), reason="the simulated NVML is not built yet")
def test_nvitop_inside_shows_the_capped_gpu(node: Node) -> None:
    """A monitoring tool users run in a pod (nvitop's one-shot mode, `nvidia-smi`-like) sees one
    GPU whose total is the claim's 1 GiB cap and whose used memory is the claim's usage."""
    claim = node.claim("c-nvitop", [f"device uuid={UUIDS[0]} memory={GIB} cores=0"])
    done = beside_300_mib(
        claim,
        f"{sys.executable} -m nvitop --once --no-unicode",
        hold_ms=4000,
        timeout=120,
        COLUMNS="200",
        LINES="100",
        TERM="xterm",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # One device row (only the claim's GPU is visible), reading used / total = usage / cap; the
    # physical 40 GiB total never shows.
    assert re.findall(r"\|\s+([\d.]+[MG]iB) / ([\d.]+[MG]iB) \|", out) == [
        ("300.0MiB", "1024MiB")
    ], out
    assert "40960MiB" not in out and "40.00GiB" not in out, out
    assert re.search(r"\b300\.0MiB .*cuda_probe init alloc", out), out  # the process row


def _runtime(name: str) -> str:
    path = subprocess.run(
        ["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return os.path.realpath(path)


def test_every_path_under_address_sanitizer(node: Node) -> None:
    """The ASan+UBSan build of the hook runs every wrapper (all allocation paths, frees, info,
    launches with the limiter, threads, fork) without a sanitizer report or leak. The claim's
    spec mounts the ASan build as the container's libvgpu.so (so /etc/ld.so.preload loads it);
    the sanitizer runtimes come through LD_PRELOAD, which the loader handles first, because a
    sanitizer runtime must be loaded before everything else."""
    claim = node.claim("c-asan", [f"device uuid={UUIDS[0]} memory={GIB} cores=30"], hook=ASAN_HOOK)
    env = dict(
        LD_PRELOAD=f"{_runtime('libasan.so')} {_runtime('libubsan.so')}",
        ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:exitcode=66",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
        VGPU_LOG_LEVEL="error",
    )
    steps = [
        "init",
        "alloc:629145600",
        "alloc:629145600",
        "pitch:1000x1000",
        "managed:100000",
        "async:4096",
        "pool:4096",
        "array:100x100",
        "array3d:10x10x10",
        "mipmap:64x64:3",
        "info",
        "infonull",
        "total",
        "launch:200:216",
        "forkalloc:4096",
        "threads:4:1048576",
        "run:1:216:0",
        "freeall",
        "info",
    ]
    for procaddr in ([], ["-p"]):
        done = claim.run([str(PROBE), *procaddr, *steps], timeout=120, **env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "ERROR: AddressSanitizer" not in done.stderr
        assert "runtime error" not in done.stderr
        lines = done.stdout.splitlines()
        assert field(lines[2], "rc") == 2  # the cap still holds under ASan
        assert lines[-2] == "freeall failures=0"
