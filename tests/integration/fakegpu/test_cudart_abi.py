"""The simulated CUDA runtime's ABI and exports against NVIDIA's own (the runtime wheels in the
venv: nvidia-cuda-runtime-cu12 for CUDA 12, nvidia-cuda-runtime for CUDA 13).

Proves, for both major versions:
1. The committed generated lists (src/cudart_exports.def, include/cudart_errors.def) are what
   hack/fakegpu/gen_cudart.py makes from the official headers today.
2. `make abi-check-cudart` passes: every prototype of include/cudart_abi.h and every use in
   src/cudart*.c compiles against the official cuda_runtime_api.h, and every size, field offset
   and value we declare is the official one; a deliberately wrong prototype is caught.
3. libcudart.so.<major> exports exactly what NVIDIA's libcudart.so.<major> exports, every symbol
   under the same version node (libcudart.so.<major>), except the documented omissions: the
   graphics-interop functions (cudaGL*, cudaEGL*, cudaVDPAU*, cudaGraphics* of GL/EGL/VDPAU,
   cudaEventCreateFromEGLSync), CUDA 13's cudaSubgrid* (declared by no shipped header) and three
   internal names whose signatures no public header gives (__cudaRegisterHostVar,
   __cudaRegisterUnifiedTable, __cudaGetProcAddress).
4. The exports are the generated list's rows for that version, and only cuda*/__cuda* names.
5. No constructor does work, and the library imports no driver symbol: it reaches the driver only
   through the entry points it resolves with cuGetProcAddress_v2 (found with dlsym).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FAKEGPU = REPO / "hack" / "fakegpu"
SITE = Path(sysconfig.get_paths()["purelib"])
OFFICIAL = {12: SITE / "nvidia" / "cuda_runtime", 13: SITE / "nvidia" / "cu13"}
MAJORS = [12, 13]
WARN = ["-std=gnu11", "-Wall", "-Wextra", "-Werror"]

OMITTED = re.compile(
    r"^(cudaGL\w+|cudaEGL\w+|cudaVDPAU\w+|cudaGraphics(GL|EGL|VDPAU)\w+|"
    r"cudaGraphicsResourceGetMappedEglFrame|cudaEventCreateFromEGLSync|cudaSubgrid\w+|"
    r"__cudaRegisterHostVar|__cudaRegisterUnifiedTable|__cudaGetProcAddress)$"
)


def _official(major: int) -> Path:
    root = OFFICIAL[major]
    if not (root / "include" / "cuda_runtime_api.h").is_file():
        pytest.skip(f"official CUDA {major} runtime not installed at {root} (run make venv)")
    return root


def _exports(lib: Path) -> dict[str, str]:
    """symbol -> version node of every defined dynamic function symbol."""
    out = subprocess.run(
        ["nm", "-D", "--defined-only", "--with-symbol-versions", str(lib)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    symbols: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "T":
            name, _, version = parts[2].partition("@@")
            symbols[name] = version
    return symbols


@pytest.fixture(scope="module")
def built() -> None:
    subprocess.run(["make", "-s", "-C", str(FAKEGPU), "all"], check=True)


def test_generated_lists_are_current() -> None:
    _official(12), _official(13)
    done = subprocess.run(
        [sys.executable, str(FAKEGPU / "gen_cudart.py"), "--check", "--site", str(SITE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_abi_check_passes() -> None:
    _official(12), _official(13)
    done = subprocess.run(
        ["make", "-s", "-C", str(FAKEGPU), "abi-check-cudart"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "match CUDA 12" in done.stdout and "match CUDA 13" in done.stdout


def test_abi_check_catches_a_wrong_prototype(tmp_path: Path) -> None:
    include = _official(13) / "include"
    inc = tmp_path / "include"
    shutil.copytree(FAKEGPU / "include", inc)
    header = inc / "cudart_abi.h"
    text = header.read_text()
    broken = text.replace(
        "cudaError_t cudaMalloc(void **devPtr, size_t size);",
        "cudaError_t cudaMalloc(void **devPtr, unsigned int size);",
    )
    assert broken != text
    header.write_text(broken)
    done = subprocess.run(
        [
            "gcc",
            *WARN,
            "-fsyntax-only",
            "-DVGPU_CUDART_MAJOR=13",
            "-D__CUDA_API_VERSION_INTERNAL",
            f"-I{FAKEGPU / 'abi_shim'}",
            f"-I{include}",
            "-include",
            "cuda.h",
            "-include",
            "cuda_runtime_api.h",
            f"-I{inc}",
            f"-I{FAKEGPU / 'src'}",
            str(FAKEGPU / "src" / "cudart_memory.c"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "conflicting types" in done.stderr and "cudaMalloc" in done.stderr


@pytest.mark.parametrize("major", MAJORS)
def test_exports_are_nvidias_less_the_documented_omissions(built: None, major: int) -> None:
    official = _exports(_official(major) / "lib" / f"libcudart.so.{major}")
    ours = _exports(FAKEGPU / "build" / "lib" / f"libcudart.so.{major}")
    node = f"libcudart.so.{major}"
    assert set(official.values()) == {node}
    assert set(ours.values()) == {node}
    omitted = {name for name in official if OMITTED.match(name)}
    assert len(omitted) >= 29
    assert set(ours) == set(official) - omitted


@pytest.mark.parametrize("major", MAJORS)
def test_exports_are_the_generated_list(built: None, major: int) -> None:
    rows = re.findall(
        r"^CUDART_(SIM|ALIAS|STUB)\((\w+),(?: \w+,)? (\d), (\d)\)",
        (FAKEGPU / "src" / "cudart_exports.def").read_text(),
        re.M,
    )
    column = 2 if major == 12 else 3
    listed = {row[1] for row in rows if row[column] == "1"}
    ours = _exports(FAKEGPU / "build" / "lib" / f"libcudart.so.{major}")
    assert set(ours) == listed
    assert all(re.match(r"^(cuda|__cuda)\w+$", name) for name in ours)
    simulated = {row[1] for row in rows if row[0] != "CUDART_STUB" and row[column] == "1"}
    assert len(simulated) > 120
    assert {"cudaMalloc", "cudaLaunchKernel", "__cudaRegisterFunction"} <= simulated


@pytest.mark.parametrize("major", MAJORS)
def test_no_constructor_and_no_direct_driver_calls(built: None, major: int) -> None:
    """Lazy initialisation only (.init_array holds just the compiler's frame_dummy), and the
    driver is reached only through the entry points resolved with cuGetProcAddress_v2: the
    library imports no cu* symbol, only libc's."""
    lib = FAKEGPU / "build" / "lib" / f"libcudart.so.{major}"
    headers = subprocess.run(
        ["objdump", "-h", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    init = [line.split() for line in headers.splitlines() if ".init_array" in line]
    assert init and int(init[0][2], 16) == 8
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    imported = {line.split()[-1].split("@")[0] for line in undefined.splitlines() if line.strip()}
    assert "dlsym" in imported and "dlopen" in imported
    assert not {name for name in imported if name.startswith("cu")}
