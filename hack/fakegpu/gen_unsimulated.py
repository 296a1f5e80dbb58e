#!/usr/bin/env python3
"""Generate the simulated GPUs' lists of unsimulated entry points from the official headers.

Why this exists: a program that links any public CUDA driver or NVML function must load against
the simulated libraries, and an unsimulated call must fail cleanly with NOT_SUPPORTED instead of
"undefined symbol". The official headers (cuda.h, cudaTypedefs.h, nvml.h of CUDA 12 and 13) come
from Python wheels that only the dev venv has, so this script runs at dev time and its output is
committed: src/cuda_unsimulated.def and src/nvml_unsimulated.def (X-macro lists). The C build reads
only those files; tests/integration/fakegpu/test_full_surface.py reruns this script with `--check`
and fails when the committed lists no longer match the headers or the hand-written tables.

How names are found: gcc's `-aux-info` lists every function the preprocessed header declares, so
macro renames (`#define cuMemcpy2D cuMemcpy2D_v2`) and the per-thread-default-stream variants
(`_ptds`/`_ptsz`) come out as the linker sees them. `__CUDA_API_VERSION_INTERNAL` makes cuda.h
declare the legacy and per-thread names too (the real driver exports all of them);
`NVML_NO_UNVERSIONED_FUNC_DEFS` does the same for nvml.h's legacy unversioned names.

Usage: gen_unsimulated.py [--site SITE_PACKAGES] [--check] [--print-public cuda|nvml]
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
CUDA_TABLE = HERE / "src" / "cuda_entry_points.def"
NVML_HEADER = HERE / "include" / "nvml_abi.h"
CUDA_OUT = HERE / "src" / "cuda_unsimulated.def"
NVML_OUT = HERE / "src" / "nvml_unsimulated.def"

# Official include directories under site-packages, per CUDA major version.
CUDA_INCLUDES = ("nvidia/cuda_runtime/include", "nvidia/cu13/include")
NVML_INCLUDES = ("nvidia/nvml_dev/include", "nvidia/cu13/include")

AUX_LINE = re.compile(
    r"^/\* (?P<file>[^:]+):\d+:\w+ \*/ extern (?P<ret>[^(]*?[\s*])(?P<name>\w+) \("
)
TABLE_ROW = re.compile(r"^CU_ENTRY\((\w+),\s*(\d+),\s*(\w+),\s*(\w+)\)", re.M)
PFN = re.compile(r"\bPFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)")
PER_THREAD = ("_ptds", "_ptsz")


def declared_functions(header: Path, defines: list[str]) -> dict[str, str]:
    """name -> return type of every extern function `header` itself declares."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "decls.c"
        aux = Path(tmp) / "decls.aux"
        src.write_text(f'#include "{header}"\n')
        subprocess.run(
            ["gcc", "-fsyntax-only", *defines, f"-I{header.parent}", f"-aux-info={aux}", str(src)],
            check=True,
        )
        out: dict[str, str] = {}
        for line in aux.read_text().splitlines():
            m = AUX_LINE.match(line)
            if m and Path(m["file"]) == header:
                out[m["name"]] = m["ret"].strip()
        return out


def _headers(site: Path, dirs: tuple[str, ...], name: str) -> list[Path]:
    found = [site / d / name for d in dirs if (site / d / name).is_file()]
    if len(found) != len(dirs):
        sys.exit(f"official {name} not found under {site} ({', '.join(dirs)}): run make venv")
    return found


def cuda_public(site: Path) -> dict[str, str]:
    """Every function cuda.h of CUDA 12 and 13 declares, legacy and per-thread names included."""
    out: dict[str, str] = {}
    for header in _headers(site, CUDA_INCLUDES, "cuda.h"):
        for defines in ([], ["-D__CUDA_API_VERSION_INTERNAL"]):
            out.update(declared_functions(header, defines))
    return out


def nvml_public(site: Path) -> dict[str, str]:
    """Every function nvml.h of CUDA 12 and 13 declares, legacy unversioned names included."""
    out: dict[str, str] = {}
    for header in _headers(site, NVML_INCLUDES, "nvml.h"):
        for defines in ([], ["-DNVML_NO_UNVERSIONED_FUNC_DEFS"]):
            out.update(declared_functions(header, defines))
    return out


def pfn_versions(site: Path) -> dict[str, list[int]]:
    """base name -> the ABI versions cudaTypedefs.h gives it (default-stream ones)."""
    versions: dict[str, set[int]] = {}
    for header in _headers(site, CUDA_INCLUDES, "cudaTypedefs.h"):
        for base, version, per_thread in PFN.findall(header.read_text()):
            if not per_thread:
                versions.setdefault(base, set()).add(int(version))
    return {base: sorted(v) for base, v in versions.items()}


def base_name(symbol: str) -> str:
    for suffix in PER_THREAD:
        symbol = symbol.removesuffix(suffix)
    return re.sub(r"_v\d+$", "", symbol)


def _abi_rank(symbol: str) -> int:
    m = re.search(r"_v(\d+)$", symbol)
    return int(m.group(1)) if m else 1


def _simulated_rows() -> list[tuple[str, str, str, str]]:
    return TABLE_ROW.findall(CUDA_TABLE.read_text())


def simulated_cuda() -> set[str]:
    return {sym for row in _simulated_rows() for sym in row[2:]}


def simulated_since() -> dict[str, int]:
    """base name -> the oldest version the hand-written table serves it from."""
    since: dict[str, int] = {}
    for base, version, _, _ in _simulated_rows():
        since[base] = min(since.get(base, int(version)), int(version))
    return since


def simulated_nvml() -> set[str]:
    return set(re.findall(r"^\w[\w ]*?\**\s*\b(nvml\w+)\(", NVML_HEADER.read_text(), re.M))


def cuda_rows(site: Path) -> tuple[list[str], list[tuple[str, int, str, str]]]:
    """(stub symbols, cuGetProcAddress rows for them)."""
    public = cuda_public(site)
    bad = sorted(n for n, ret in public.items() if ret != "CUresult")
    if bad:
        sys.exit(f"cuda.h functions not returning CUresult need a hand-written stub: {bad}")
    simulated = simulated_cuda()
    stubs = sorted(set(public) - simulated)
    versions = pfn_versions(site)
    since = simulated_since()
    by_base: dict[str, list[str]] = {}
    for sym in public:
        if not sym.endswith(PER_THREAD):
            by_base.setdefault(base_name(sym), []).append(sym)
    rows: list[tuple[str, int, str, str]] = []
    for base in sorted(by_base):
        syms = sorted(by_base[base], key=_abi_rank)
        base_versions = versions.get(base, [])
        if not base_versions or all(s in simulated for s in syms):
            continue

        def per_thread(sym: str) -> str:
            return next((sym + s for s in PER_THREAD if sym + s in public), sym)

        if len(syms) == len(base_versions):
            # One ABI per version, in order (cuMemcpy2D@2000, cuMemcpy2D_v2@3020). Where the
            # hand-written table serves a base, it rules from its first version on; stubs only
            # answer the older (legacy) ABIs below it.
            first = since.get(base, 1 << 30)
            rows += [
                (base, v, s, per_thread(s))
                for s, v in zip(syms, base_versions, strict=True)
                if s not in simulated and v < first
            ]
        elif not any(s in simulated for s in syms):
            # Versions that changed only a parameter type share one symbol: the newest answers all.
            rows.append((base, base_versions[0], syms[-1], per_thread(syms[-1])))
    return stubs, rows


def nvml_stubs(site: Path) -> list[str]:
    public = nvml_public(site)
    simulated = simulated_nvml()
    unknown = sorted(simulated - set(public))
    if unknown:
        sys.exit(f"include/nvml_abi.h declares functions nvml.h does not: {unknown}")
    stubs = sorted(set(public) - simulated)
    bad = sorted(n for n in stubs if public[n] != "nvmlReturn_t")
    if bad:
        sys.exit(f"nvml.h functions not returning nvmlReturn_t need a hand-written stub: {bad}")
    return stubs


GENERATED = (
    "/* GENERATED by hack/fakegpu/gen_unsimulated.py from the official\n"
    " * {src}. Do not edit: run `make -C hack/fakegpu unsimulated`. */"
)


def render_cuda(stubs: list[str], rows: list[tuple[str, int, str, str]]) -> str:
    lines = [
        GENERATED.format(src="cuda.h and cudaTypedefs.h of CUDA 12 and 13"),
        "/*",
        " * Every cuda.h function the fake driver does not simulate (the simulated ones are",
        " * cuda_entry_points.def). CU_STUB(symbol): an exported function that returns",
        " * CUDA_ERROR_NOT_SUPPORTED (cuda_unsimulated.c). CU_ENTRY(base, version, symbol,",
        " * per-thread symbol): the rows cuGetProcAddress serves them from, as in",
        " * cuda_entry_points.def.",
        " */",
        "",
    ]
    lines += [f"CU_STUB({s})" for s in stubs]
    lines.append("")
    lines += [f"CU_ENTRY({b}, {v}, {s}, {p})" for b, v, s, p in rows]
    return "\n".join(lines) + "\n"


def render_nvml(stubs: list[str]) -> str:
    lines = [
        GENERATED.format(src="nvml.h of CUDA 12 and 13"),
        "/*",
        " * Every nvml.h function the fake NVML does not simulate (the simulated ones are the",
        " * prototypes of include/nvml_abi.h). NVML_STUB(symbol): an exported function that",
        " * returns NVML_ERROR_NOT_SUPPORTED (nvml_unsimulated.c).",
        " */",
        "",
    ]
    lines += [f"NVML_STUB({s})" for s in stubs]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path(sysconfig.get_paths()["purelib"]))
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--print-public", choices=("cuda", "nvml"))
    args = parser.parse_args()
    if args.print_public:
        public = cuda_public(args.site) if args.print_public == "cuda" else nvml_public(args.site)
        print("\n".join(sorted(public)))
        return 0
    outputs = {
        CUDA_OUT: render_cuda(*cuda_rows(args.site)),
        NVML_OUT: render_nvml(nvml_stubs(args.site)),
    }
    stale = [p for p, text in outputs.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(HERE)} is stale: run make -C hack/fakegpu unsimulated")
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path])
        print(f"wrote {path.relative_to(HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
