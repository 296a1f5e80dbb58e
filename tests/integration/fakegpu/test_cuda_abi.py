"""The fake CUDA driver's hand-written ABI (hack/fakegpu/include/cuda_abi.h) against the official
cuda.h of CUDA 12 and CUDA 13 (shipped in the venv by the nvidia-cuda-runtime wheels).

Proves, for both major versions:
1. every prototype we declare is declared by the official header too, with a compatible type
   (the compiler sees both declarations in one translation unit; a mismatch is a
   "conflicting types" error) - and a deliberately broken prototype is caught;
2. sizeof of every struct, typedef and enum we declare, offsetof of every struct field, every
   enumerator value and every #define value are identical (two programs, one built on each
   header, print the same table);
3. the library's dynamic symbol table is exactly the entry-point table (cuda_entry_points.def)
   plus the generated NOT_SUPPORTED stubs (cuda_unsimulated.def; test_full_surface.py proves
   that together they are every function cuda.h declares).
"""

from __future__ import annotations

import re
import subprocess
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FAKEGPU = REPO / "hack" / "fakegpu"
OUR_HEADER = FAKEGPU / "include" / "cuda_abi.h"
TABLE = FAKEGPU / "src" / "cuda_entry_points.def"
STUBS = FAKEGPU / "src" / "cuda_unsimulated.def"
SITE = Path(sysconfig.get_paths()["purelib"])
OFFICIAL = {
    "12": SITE / "nvidia" / "cuda_runtime" / "include",
    "13": SITE / "nvidia" / "cu13" / "include",
}
WARN = ["-std=gnu11", "-Wall", "-Wextra", "-Werror"]


def _official(version: str) -> Path:
    include = OFFICIAL[version]
    if not (include / "cuda.h").is_file():
        pytest.skip(f"official CUDA {version} cuda.h not installed at {include} (run make venv)")
    return include


def _our_text() -> str:
    return OUR_HEADER.read_text()


def _prototype_names(text: str) -> list[str]:
    protos = text.split("/* ---- Prototypes", 1)[1]
    return re.findall(r"^CUresult (cu\w+)\(", protos, re.MULTILINE)


def _compile(source: str, include: Path | None, tmp: Path, name: str, run: bool) -> str:
    src = tmp / f"{name}.c"
    src.write_text(source)
    exe = tmp / name
    args = ["gcc", *WARN, f"-I{FAKEGPU / 'include'}"]
    if include is not None:
        args += [f"-I{include}", "-D__CUDA_API_VERSION_INTERNAL"]
    if not run:
        args += ["-fsyntax-only"]
    done = subprocess.run(
        [*args, str(src), *([] if not run else ["-o", str(exe)])],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"{name} does not compile:\n{done.stderr}")
    if not run:
        return ""
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def _prototype_check_source(header_text: str) -> str:
    """The official header, a use of every name we declare (an undeclared one fails), then our
    prototypes (a differing one fails)."""
    uses = "\n".join(f"    (void)&{name};" for name in _prototype_names(header_text))
    return (
        "#include <cuda.h>\n"
        f"static void declared_officially(void) {{\n{uses}\n}}\n"
        "#define VGPU_CUDA_ABI_PROTOS_ONLY\n"
        '#include "cuda_abi.h"\n'
        "int main(void) { declared_officially(); return 0; }\n"
    )


@pytest.mark.parametrize("version", ["12", "13"])
def test_prototypes_match_official(version: str, tmp_path: Path) -> None:
    include = _official(version)
    _compile(_prototype_check_source(_our_text()), include, tmp_path, "protos", run=False)


def test_prototype_check_catches_a_wrong_signature(tmp_path: Path) -> None:
    include = _official("13")
    broken = _our_text().replace(
        "CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);",
        "CUresult cuMemAlloc_v2(CUdeviceptr *dptr, unsigned int bytesize);",
    )
    assert broken != _our_text()
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "cuda_abi.h").write_text(broken)
    src = tmp_path / "broken.c"
    src.write_text(_prototype_check_source(broken))
    done = subprocess.run(
        [
            "gcc",
            *WARN,
            "-fsyntax-only",
            f"-I{tmp_path / 'inc'}",
            f"-I{include}",
            "-D__CUDA_API_VERSION_INTERNAL",
            str(src),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "conflicting types" in done.stderr and "cuMemAlloc_v2" in done.stderr


# ---- Layout tables ------------------------------------------------------------------------------


def _structs(text: str) -> dict[str, list[str]]:
    """typedef name -> top-level field names, parsed from our `typedef struct ... { } Name;`."""
    out: dict[str, list[str]] = {}
    for match in re.finditer(r"typedef (struct|union) \w+ \{(.*?)\n\} (\w+);", text, re.DOTALL):
        depth = 0
        fields: list[str] = []
        for raw in match.group(2).splitlines():
            line = raw.split("/*")[0].strip()
            if not line:
                continue
            if line.endswith("{"):
                depth += 1
                continue
            if line.startswith("}"):
                depth -= 1
                name = line.strip("}; ")
                if depth == 0 and name:
                    fields.append(name)
                continue
            if depth == 0 and line.endswith(";"):
                declarator = line[:-1].split("[")[0].split()[-1]
                fields.append(declarator.lstrip("*"))
        out[match.group(3)] = fields
    return out


def _enumerators(text: str) -> list[str]:
    names: list[str] = []
    for body in re.findall(r"typedef enum \w+ \{(.*?)\}", text, re.DOTALL):
        names += re.findall(r"^\s*(\w+)\s*=", body, re.MULTILINE)
    return names


def _enum_types(text: str) -> list[str]:
    return re.findall(r"typedef enum \w+ \{.*?\} (\w+);", text, re.DOTALL)


def _defines(text: str) -> list[str]:
    return re.findall(r"^#define (CU_\w+) ", text, re.MULTILINE)


# Members compared by the enclosing struct's size only: a union we spell out partly, and the
# reserved tail of the pool properties (CUDA 13 carved a named byte out of it; the size is equal).
SKIP_FIELDS = {
    ("CUlaunchAttributeValue", "cooperative"),
    ("CUlaunchAttributeValue", "priority"),
    ("CUmemPoolProps_v1", "reserved"),
}
SIZE_ONLY = {"CUlaunchAttributeValue"}
SCALARS = ["CUdeviceptr", "CUdevice", "CUmemGenericAllocationHandle", "cuuint64_t", "cuuint32_t"]


def _dump_source(text: str) -> str:
    lines = [
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <stdio.h>",
        "#include <cuda.h>",
    ]
    lines.append("int main(void) {")

    def emit(label: str, expr: str) -> None:
        lines.append(f'    printf("%s %llu\\n", "{label}", (unsigned long long)({expr}));')

    for name, fields in sorted(_structs(text).items()):
        emit(f"sizeof {name}", f"sizeof({name})")
        if name in SIZE_ONLY:
            continue
        for field in fields:
            if (name, field) not in SKIP_FIELDS:
                emit(f"offsetof {name}.{field}", f"offsetof({name}, {field})")
    for name in _enum_types(text) + SCALARS:
        emit(f"sizeof {name}", f"sizeof({name})")
    for name in _enumerators(text):
        emit(f"enum {name}", f"(long long){name}")
    for name in _defines(text):
        emit(f"define {name}", f"(unsigned long long)(uintptr_t){name}")
    lines.append("    return 0;\n}\n")
    return "\n".join(lines)


@pytest.mark.parametrize("version", ["12", "13"])
def test_layouts_and_values_match_official(version: str, tmp_path: Path) -> None:
    include = _official(version)
    text = _our_text()
    source = _dump_source(text)
    official = _compile(source, include, tmp_path, "official", run=True)
    ours_dir = tmp_path / "our_include"
    ours_dir.mkdir()
    (ours_dir / "cuda.h").write_text('#include "cuda_abi.h"\n')
    ours = _compile(source, ours_dir, tmp_path, "ours", run=True)
    assert len(ours.splitlines()) > 250  # the table really covers the header
    diff = [
        f"{a}  !=  {b}"
        for a, b in zip(official.splitlines(), ours.splitlines(), strict=True)
        if a != b
    ]
    assert not diff, "\n".join(diff)


# ---- Exports ------------------------------------------------------------------------------------


def _table_symbols() -> set[str]:
    rows = re.findall(r"^CU_ENTRY\((\w+),\s*(\d+),\s*(\w+),\s*(\w+)\)", TABLE.read_text(), re.M)
    assert len(rows) > 100
    return {sym for row in rows for sym in row[2:]}


def _stub_symbols() -> set[str]:
    stubs = set(re.findall(r"^CU_STUB\((\w+)\)", STUBS.read_text(), re.M))
    assert len(stubs) > 400
    assert not stubs & _table_symbols(), "a simulated entry point is also a stub"
    return stubs


def test_exports_are_exactly_the_entry_point_table_and_the_stubs() -> None:
    subprocess.run(["make", "-s", "-C", str(FAKEGPU), "all"], check=True)
    lib = FAKEGPU / "build" / "lib" / "libcuda.so.1"
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert exported == _table_symbols() | _stub_symbols()
