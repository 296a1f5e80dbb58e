"""The simulated libraries export the whole public surface of the official headers.

Proves, against cuda.h and nvml.h of CUDA 12 and 13 (from the venv's NVIDIA wheels):
1. the committed lists of unsimulated entry points (src/*_unsimulated.def) are what
   gen_unsimulated.py derives from the headers and our hand-written tables today (and a list
   with one entry missing is reported stale);
2. libcuda.so.1 exports exactly the functions cuda.h declares, legacy, versioned (`_v2`...) and
   per-thread (`_ptds`/`_ptsz`) names included; libnvidia-ml.so.1 exports exactly the functions
   nvml.h declares plus our own `vgpusim_*` fault-injection calls;
3. a program built on the official headers that links unsimulated calls (cuMemcpy2D,
   cuMemPrefetchAsync, cuPointerGetAttributes, cuIpcGetMemHandle, cuLinkCreate, nvmlUnitGetCount,
   nvmlDeviceGetAccountingStats) loads, gets NOT_SUPPORTED from each, finds the same answer
   through cuGetProcAddress, and keeps working with the simulated calls around them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.integration.fakegpu.nvml_node import FAKEGPU, SimNode, build_fakegpu

GENERATOR = FAKEGPU / "gen_unsimulated.py"
SITE = Path(sysconfig.get_paths()["purelib"])
CUDA_INCLUDE = SITE / "nvidia" / "cu13" / "include"
NVML_INCLUDE = SITE / "nvidia" / "nvml_dev" / "include"
LIB = FAKEGPU / "build" / "lib"


@pytest.fixture(scope="module", autouse=True)
def _headers_and_build() -> None:
    for header in (CUDA_INCLUDE / "cuda.h", NVML_INCLUDE / "nvml.h"):
        if not header.is_file():
            pytest.skip(f"official {header.name} not installed at {header.parent} (make venv)")
    build_fakegpu()


def _generator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATOR), f"--site={SITE}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _public(api: str) -> set[str]:
    done = _generator(f"--print-public={api}")
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def _exports(lib: str) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(LIB / lib)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_committed_stub_lists_are_current() -> None:
    done = _generator("--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_stale_list_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "fakegpu"
    for part in ("src", "include"):
        shutil.copytree(FAKEGPU / part, copy / part)
    shutil.copy(GENERATOR, copy / GENERATOR.name)
    stubs = copy / "src" / "nvml_unsimulated.def"
    text = stubs.read_text()
    assert "NVML_STUB(nvmlUnitGetCount)\n" in text
    stubs.write_text(text.replace("NVML_STUB(nvmlUnitGetCount)\n", ""))
    done = subprocess.run(
        [sys.executable, str(copy / GENERATOR.name), f"--site={SITE}", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "src/nvml_unsimulated.def is stale" in done.stdout


def test_cuda_exports_exactly_the_header_functions() -> None:
    public = _public("cuda")
    # The extraction really sees macro-renamed, legacy and per-thread names.
    assert {"cuMemcpy2D", "cuMemcpy2D_v2", "cuMemcpy2D_v2_ptds", "cuLaunchKernel_ptsz"} <= public
    assert len(public) > 650
    exported = _exports("libcuda.so.1")
    assert sorted(public - exported) == []
    assert sorted(exported - public) == []


def test_nvml_exports_exactly_the_header_functions_and_vgpusim() -> None:
    public = _public("nvml")
    assert {"nvmlInit", "nvmlInit_v2", "nvmlUnitGetCount", "nvmlDeviceGetAccountingStats"} <= public
    assert len(public) > 400
    exported = _exports("libnvidia-ml.so.1")
    assert sorted(public - exported) == []
    assert sorted(n for n in exported - public if not n.startswith("vgpusim_")) == []


PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include <cuda.h>
#include <nvml.h>

#define EXPECT(expr, want)                                                              \
    do {                                                                                \
        int got_ = (int)(expr);                                                         \
        if (got_ != (int)(want)) {                                                      \
            fprintf(stderr, "%s: %d, expected %d\n", #expr, got_, (int)(want));         \
            return 1;                                                                   \
        }                                                                               \
        printf("%s ok\n", #expr);                                                       \
    } while (0)

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr a, b;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&a, 1 << 20), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&b, 1 << 20), CUDA_SUCCESS);

    CUDA_MEMCPY2D copy;
    memset(&copy, 0, sizeof(copy));
    copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.srcDevice = a;
    copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.dstDevice = b;
    copy.WidthInBytes = 256;
    copy.Height = 4;
    EXPECT(cuMemcpy2D(&copy), CUDA_ERROR_NOT_SUPPORTED);
    CUmemLocation where;
    memset(&where, 0, sizeof(where));
    where.type = CU_MEM_LOCATION_TYPE_DEVICE;
    EXPECT(cuMemPrefetchAsync(a, 1 << 20, where, 0, NULL), CUDA_ERROR_NOT_SUPPORTED);
    CUpointer_attribute attrs[1] = {CU_POINTER_ATTRIBUTE_CONTEXT};
    void *values[1] = {&ctx};
    EXPECT(cuPointerGetAttributes(1, attrs, values, a), CUDA_ERROR_NOT_SUPPORTED);
    CUipcMemHandle ipc;
    EXPECT(cuIpcGetMemHandle(&ipc, a), CUDA_ERROR_NOT_SUPPORTED);
    CUlinkState link = NULL;
    EXPECT(cuLinkCreate(0, NULL, NULL, &link), CUDA_ERROR_NOT_SUPPORTED);

    /* The same answers through the entry-point lookup every modern client uses. */
    CUresult (*memcpy2d)(const CUDA_MEMCPY2D *) = NULL;
    CUdriverProcAddressQueryResult status;
    EXPECT(cuGetProcAddress("cuMemcpy2D", (void **)&memcpy2d, 12000, 0, &status), CUDA_SUCCESS);
    EXPECT(status, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT(memcpy2d(&copy), CUDA_ERROR_NOT_SUPPORTED);
    CUresult (*ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned int) = NULL;
    EXPECT(cuGetProcAddress("cuIpcOpenMemHandle", (void **)&ipc_open, 12000, 0, &status),
           CUDA_SUCCESS);
    EXPECT(ipc_open(&a, ipc, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemFree(a), CUDA_SUCCESS);
    EXPECT(cuMemFree(b), CUDA_SUCCESS);

    unsigned int units = 7, count = 0;
    nvmlDevice_t nv;
    nvmlAccountingStats_t stats;
    EXPECT(nvmlInit(), NVML_SUCCESS);
    EXPECT(nvmlUnitGetCount(&units), NVML_ERROR_NOT_SUPPORTED);
    EXPECT(units, 7);
    EXPECT(nvmlDeviceGetCount(&count), NVML_SUCCESS);
    EXPECT(count > 0, 1);
    EXPECT(nvmlDeviceGetHandleByIndex(0, &nv), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetAccountingStats(nv, 1234, &stats), NVML_ERROR_NOT_SUPPORTED);
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    return 0;
}
"""


def test_program_linking_unsimulated_calls_loads_and_gets_not_supported(tmp_path: Path) -> None:
    src = tmp_path / "surface.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "surface"
    subprocess.run(
        [
            "gcc",
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{CUDA_INCLUDE}",
            f"-I{NVML_INCLUDE}",
            "-o",
            str(exe),
            str(src),
            f"-L{LIB}",
            "-lcuda",
            "-lnvidia-ml",
        ],
        check=True,
    )
    node = SimNode.create("l4-2", tmp_path)
    done = subprocess.run(
        [str(exe)], env=node.env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cuMemcpy2D(&copy) ok" in done.stdout
    assert "nvmlDeviceGetAccountingStats(nv, 1234, &stats) ok" in done.stdout
