#!/usr/bin/env python3
"""Generate the simulated CUDA runtime's export list from the official runtime headers.

Why this exists: libcudart.so.12 and libcudart.so.13 of the simulator must export every public
function NVIDIA's shared runtime of that major version exports, so that any program or library
linked against the runtime (PyTorch's libtorch_cuda, nvcc's `-cudart shared` builds) loads; the
functions the simulator models do their work, every other one returns cudaErrorNotSupported.
The official cuda_runtime_api.h of CUDA 12 and 13 come from the runtime wheels in the dev venv
only, so this script runs at dev time and its output is committed:

- src/cudart_exports.def: one X-macro row per exported symbol, with the major versions whose
  header declares it: CUDART_SIM (simulated: its prototype is in include/cudart_abi.h),
  CUDART_ALIAS (the _ptsz/_ptds per-thread-default-stream name of a simulated function) and
  CUDART_STUB (cudaErrorNotSupported); CUDART_RUNTIME_VERSION rows give each header's
  CUDART_VERSION.
- include/cudart_errors.def: every cudaError enumerator with its value and versions
  (cudaGetErrorName/String and the enum in cudart_abi.h come from it).

The list is the functions cuda_runtime_api.h declares (with `__CUDA_API_VERSION_INTERNAL`, so the
per-thread and legacy names come out as the linker sees them; gcc's `-aux-info` lists them), plus
the nvcc registration ABI (REGISTRATION below: the functions nvcc's generated host code calls,
declared in nvcc's crt/host_runtime.h, which the wheels do not ship) and the profiler control
functions (PROFILER: cuda_profiler_api.h, not shipped either). Not exported: the graphics-interop
headers' functions (cudaGL*, cudaEGL*, cudaVDPAU*, cudaGraphics*GL/EGL/VDPAU*), as the fake driver
leaves out cuGL*/cuEGL*/cuVDPAU*. tests/integration/fakegpu/test_cudart_abi.py compares the
libraries' exports with NVIDIA's own shared runtime (nm -D of the wheels' .so) and reruns this
script with `--check`.

The official headers include crt/host_defines.h, which ships with nvcc, not with the runtime
wheels; abi_shim/crt/host_defines.h gives its macros their host-compiler meaning.

Usage: gen_cudart.py [--site SITE_PACKAGES] [--check] [--print-public 12|13]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE / "abi_shim"
OUR_HEADER = HERE / "include" / "cudart_abi.h"
EXPORTS_OUT = HERE / "src" / "cudart_exports.def"
ERRORS_OUT = HERE / "include" / "cudart_errors.def"

# Official include directories under site-packages, per CUDA major version.
INCLUDES = {12: "nvidia/cuda_runtime/include", 13: "nvidia/cu13/include"}
MAJORS = (12, 13)

# The nvcc registration ABI: what nvcc's generated host code calls (crt/host_runtime.h).
# __cudaGetKernel/__cudaLaunchKernel are what CUDA 13's <<<>>> stubs call instead of
# cudaLaunchKernel. NVIDIA's shared runtime also exports __cudaRegisterHostVar,
# __cudaRegisterUnifiedTable and (13) __cudaGetProcAddress, whose signatures no public header
# gives: they are left out.
REGISTRATION = (
    "__cudaRegisterFatBinary",
    "__cudaRegisterFatBinaryEnd",
    "__cudaUnregisterFatBinary",
    "__cudaRegisterFunction",
    "__cudaRegisterVar",
    "__cudaRegisterManagedVar",
    "__cudaInitModule",
    "__cudaPushCallConfiguration",
    "__cudaPopCallConfiguration",
    "__cudaGetKernel",
    "__cudaLaunchKernel",
    "__cudaLaunchKernel_ptsz",
)
PROFILER = ("cudaProfilerStart", "cudaProfilerStop")
PER_THREAD = ("_ptsz", "_ptds")

AUX_LINE = re.compile(
    r"^/\* (?P<file>[^:]+):\d+:\w+ \*/ extern (?P<ret>[^(]*?[\s*])(?P<name>\w+) \("
)


def include_dir(site: Path, major: int) -> Path:
    inc = site / INCLUDES[major]
    if not (inc / "cuda_runtime_api.h").is_file():
        sys.exit(f"official cuda_runtime_api.h {major} not found under {inc}: run make venv")
    return inc


def declared_functions(site: Path, major: int) -> dict[str, str]:
    """name -> return type of every function cuda_runtime_api.h of `major` declares."""
    inc = include_dir(site, major)
    header = inc / "cuda_runtime_api.h"
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "decls.c"
        aux = Path(tmp) / "decls.aux"
        src.write_text("#include <cuda_runtime_api.h>\n")
        for defines in ([], ["-D__CUDA_API_VERSION_INTERNAL"]):
            subprocess.run(
                [
                    "gcc",
                    "-fsyntax-only",
                    *defines,
                    f"-I{SHIM}",
                    f"-I{inc}",
                    f"-aux-info={aux}",
                    str(src),
                ],
                check=True,
            )
            for line in aux.read_text().splitlines():
                m = AUX_LINE.match(line)
                if m and Path(m["file"]) == header:
                    out[m["name"]] = m["ret"].strip()
    return out


def runtime_version(site: Path, major: int) -> int:
    text = (include_dir(site, major) / "cuda_runtime_api.h").read_text()
    m = re.search(r"^#define CUDART_VERSION\s+(\d+)", text, re.M)
    if not m:
        sys.exit(f"no CUDART_VERSION in cuda_runtime_api.h {major}")
    return int(m.group(1))


def error_codes(site: Path, major: int) -> dict[str, int]:
    """Every enumerator of `enum cudaError` in driver_types.h of `major`, with its value."""
    text = (include_dir(site, major) / "driver_types.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    m = re.search(r"enum\s+__device_builtin__\s+cudaError\s*\{(.*?)\}", text, re.S)
    if not m:
        sys.exit(f"no enum cudaError in driver_types.h {major}")
    return {k: int(v, 0) for k, v in re.findall(r"(\w+)\s*=\s*(\w+)", m.group(1))}


def simulated() -> set[str]:
    """The functions include/cudart_abi.h declares (its prototypes section): the simulated ones."""
    text = OUR_HEADER.read_text().split("/* ---- Prototypes", 1)[1]
    return set(re.findall(r"^[A-Za-z_][\w *]*?[\s*]((?:cuda|__cuda)\w+)\(", text, re.M))


def base_of(symbol: str) -> str:
    for suffix in PER_THREAD:
        if symbol.endswith(suffix):
            return symbol[: -len(suffix)]
    return symbol


def public(site: Path, major: int) -> dict[str, str]:
    """Every symbol libcudart.so.<major> exports -> its return type ('' when no header says)."""
    out = declared_functions(site, major)
    out.update({name: "" for name in REGISTRATION + PROFILER})
    return out


def export_rows(site: Path) -> list[tuple[str, str, str, int, int]]:
    """(kind, symbol, alias target, in 12, in 13), sorted by symbol."""
    per_major = {major: public(site, major) for major in MAJORS}
    sim = simulated()
    unknown = sorted(s for s in sim if not any(s in per_major[m] for m in MAJORS))
    if unknown:
        sys.exit(f"include/cudart_abi.h declares functions no official header does: {unknown}")
    rows = []
    for symbol in sorted(set().union(*per_major.values())):
        flags = [int(symbol in per_major[m]) for m in MAJORS]
        target = base_of(symbol)
        if symbol in sim:
            rows.append(("CUDART_SIM", symbol, "", *flags))
        elif target != symbol and target in sim:
            for m, flag in zip(MAJORS, flags, strict=True):
                if flag and target not in per_major[m]:
                    sys.exit(f"{symbol} in CUDA {m} has no default-stream function {target}")
            rows.append(("CUDART_ALIAS", symbol, target, *flags))
        else:
            rets = {per_major[m].get(symbol) for m in MAJORS} - {None}
            if rets != {"cudaError_t"}:
                sys.exit(
                    f"{symbol} returns {rets}, not cudaError_t: it needs a hand-written "
                    "definition (a prototype in include/cudart_abi.h)"
                )
            rows.append(("CUDART_STUB", symbol, "", *flags))
    return rows


GENERATED = (
    "/* GENERATED by hack/fakegpu/gen_cudart.py from the official cuda_runtime_api.h of CUDA 12\n"
    " * and 13. Do not edit: run `make -C hack/fakegpu cudart-exports`. */"
)


def render_exports(site: Path) -> str:
    rows = export_rows(site)
    lines = [
        GENERATED,
        "/*",
        " * Every function the simulated libcudart.so.12 / libcudart.so.13 exports; the last two",
        " * columns say whether CUDA 12 / CUDA 13 has it.",
        " *   CUDART_SIM(symbol, in12, in13): simulated, defined in src/cudart_*.c (its prototype",
        " *       is in include/cudart_abi.h).",
        " *   CUDART_ALIAS(symbol, target, in12, in13): the per-thread-default-stream name of a",
        " *       simulated function, exported as a second name of `target`.",
        " *   CUDART_STUB(symbol, in12, in13): returns cudaErrorNotSupported",
        " *       (cudart_unsimulated.c).",
        " *   CUDART_RUNTIME_VERSION(major, CUDART_VERSION of that header).",
        " */",
        "",
    ]
    lines += [f"CUDART_RUNTIME_VERSION({m}, {runtime_version(site, m)})" for m in MAJORS]
    lines.append("")
    for kind, symbol, target, in12, in13 in rows:
        if kind == "CUDART_ALIAS":
            lines.append(f"{kind}({symbol}, {target}, {in12}, {in13})")
        else:
            lines.append(f"{kind}({symbol}, {in12}, {in13})")
    return "\n".join(lines) + "\n"


def render_errors(site: Path) -> str:
    codes = {m: error_codes(site, m) for m in MAJORS}
    merged: dict[str, int] = {}
    for m in MAJORS:
        for name, value in codes[m].items():
            if merged.setdefault(name, value) != value:
                sys.exit(f"{name} has different values in CUDA 12 and 13")
    lines = [
        GENERATED.replace("cuda_runtime_api.h", "driver_types.h"),
        "/* CUDART_ERROR(enumerator, value, in12, in13): every enum cudaError value. */",
        "",
    ]
    for name, value in sorted(merged.items(), key=lambda kv: (kv[1], kv[0])):
        flags = ", ".join(str(int(name in codes[m])) for m in MAJORS)
        lines.append(f"CUDART_ERROR({name}, {value}, {flags})")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path(sysconfig.get_paths()["purelib"]))
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--print-public", type=int, choices=MAJORS)
    args = parser.parse_args()
    if args.print_public:
        print("\n".join(sorted(public(args.site, args.print_public))))
        return 0
    outputs = {EXPORTS_OUT: render_exports(args.site), ERRORS_OUT: render_errors(args.site)}
    stale = [p for p, text in outputs.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(HERE)} is stale: run make -C hack/fakegpu cudart-exports")
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path])
        print(f"wrote {path.relative_to(HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
