"""Fail closed on a hook library that would not load or would misread our files (issue 8.6).

Real files only: the library `make native` built, copies of it with one header field or the
contract note changed, an unrelated shared object, and non-ELF files. Each refusal must name the
path and the fix; through the Preparer it fails the claim, not the call.
"""

from __future__ import annotations

import _ctypes
import os
import shutil
import struct
from pathlib import Path

import pytest

from kubelet_plugin.hookcheck import (
    EXPECTED,
    NOTE_NAME,
    HookLibraryCheck,
    HookLibraryError,
    check_hook_library,
    node_identity,
)
from kubelet_plugin.prepare import Preparer
from tests.fixtures.claimdata import HOOK_LIB, GiB, claim, inventory, result
from tests.fixtures.prepare import Claims, node_settings

FIX = "make -C vgpu_hook"


def copy_hook(tmp_path: Path) -> Path:
    target = tmp_path / "libvgpu.so"
    shutil.copyfile(HOOK_LIB, target)
    return target


def patch(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def refusal(path: Path) -> str:
    with pytest.raises(HookLibraryError) as err:
        check_hook_library(str(path), node_identity())
    text = str(err.value)
    assert str(path) in text and FIX in text, text
    return text


def test_the_built_library_is_accepted() -> None:
    check_hook_library(str(HOOK_LIB), node_identity())


def test_missing_library(tmp_path: Path) -> None:
    assert "does not exist" in refusal(tmp_path / "libvgpu.so")


def test_empty_library(tmp_path: Path) -> None:
    (tmp_path / "libvgpu.so").touch()
    assert "is empty" in refusal(tmp_path / "libvgpu.so")


def test_not_an_elf_file(tmp_path: Path) -> None:
    (tmp_path / "libvgpu.so").write_text("#!/bin/sh\necho not a library\n")
    assert "is not an ELF file" in refusal(tmp_path / "libvgpu.so")


def test_library_for_another_machine(tmp_path: Path) -> None:
    lib = copy_hook(tmp_path)
    node = node_identity()
    other = 183 if node.machine != 183 else 62  # aarch64 on x86-64, else x86-64
    patch(lib, 18, struct.pack(node.endian + "H", other))
    assert f"machine {other}" in refusal(lib)


def test_executable_is_not_a_shared_object(tmp_path: Path) -> None:
    lib = copy_hook(tmp_path)
    patch(lib, 16, struct.pack(node_identity().endian + "H", 2))  # ET_EXEC
    assert "not a shared object" in refusal(lib)


def test_shared_object_without_the_contract_note(tmp_path: Path) -> None:
    foreign = tmp_path / "libvgpu.so"
    shutil.copyfile(os.path.realpath(_ctypes.__file__), foreign)  # a real .so, not ours
    assert "no vgpu-dra contract note" in refusal(foreign)


def test_library_of_another_contract_version(tmp_path: Path) -> None:
    lib = copy_hook(tmp_path)
    data = lib.read_bytes()
    name_at = data.index(NOTE_NAME + b"\0")
    desc_at = name_at + 12  # "vgpu-dra\0" padded to 12 bytes
    words = struct.unpack_from(node_identity().endian + "3I", data, desc_at)
    assert words == EXPECTED
    patch(lib, desc_at, struct.pack(node_identity().endian + "I", EXPECTED[0] + 1))
    text = refusal(lib)
    assert f"contract v{EXPECTED[0] + 1}" in text and f"writes contract v{EXPECTED[0]}" in text


def test_verdict_is_cached_until_the_file_changes(tmp_path: Path) -> None:
    lib = copy_hook(tmp_path)
    check = HookLibraryCheck(str(lib))
    check.verify()
    replacement = tmp_path / "new.so"
    replacement.write_text("garbage")
    os.replace(replacement, lib)  # a new file at the path: checked again
    with pytest.raises(HookLibraryError, match="not an ELF file"):
        check.verify()
    shutil.copyfile(HOOK_LIB, replacement)
    os.replace(replacement, lib)
    check.verify()


def test_prepare_refuses_each_claim_while_the_hook_is_unusable(tmp_path: Path) -> None:
    settings = node_settings(tmp_path)
    missing = tmp_path / "missing" / "libvgpu.so"
    claims = Claims()
    preparer = Preparer(
        settings, inventory(memory=16 * GiB), claims, hook_check=HookLibraryCheck(str(missing))
    )
    preparer.reconcile()
    try:
        ref = claims.add(claim([result("gpu-0", memory="1Gi")]))
        error = preparer.prepare([ref])[ref.uid].error
        assert "refused" in error and str(missing) in error and "does not exist" in error
        assert preparer.prepared() == {} and claims.reads == 0
        missing.parent.mkdir()
        shutil.copyfile(HOOK_LIB, missing)  # installing the library fixes the next call
        assert preparer.prepare([ref])[ref.uid].error == ""
    finally:
        preparer.close()
