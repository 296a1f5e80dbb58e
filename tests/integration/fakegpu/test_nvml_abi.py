"""Our NVML declarations (hack/fakegpu/include/nvml_abi.h) against the official nvml.h of CUDA 12
and CUDA 13 (installed into the venv by pip: nvidia-nvml-dev-cu12 and nvidia-nvml-dev).

`make abi-check` compiles every src/nvml*.c with each official header force-included (so each of
our prototypes must equal the official one) and diffs sizes, field offsets and constant values
dumped from both. This test runs it and also proves it can fail: a copy of our header with one
wrong enum value is caught."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.integration.fakegpu.nvml_node import FAKEGPU


def abi_check(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "-C", str(directory), "abi-check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_declarations_match_official_headers_12_and_13() -> None:
    done = abi_check(FAKEGPU)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "match nvml.h 12 and 13" in done.stdout
    count = int(done.stdout.split("abi-check: ")[1].split()[0])
    assert count > 150


def test_a_wrong_value_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "fakegpu"
    copy.mkdir()
    for part in ("Makefile", "include", "src", "tests"):
        src = FAKEGPU / part
        if src.is_dir():
            shutil.copytree(src, copy / part)
        else:
            shutil.copy(src, copy / part)
    header = copy / "include" / "nvml_abi.h"
    text = header.read_text()
    assert "NVML_ERROR_GPU_IS_LOST = 15," in text
    header.write_text(text.replace("NVML_ERROR_GPU_IS_LOST = 15,", "NVML_ERROR_GPU_IS_LOST = 51,"))
    # The copy finds the venv's official headers through SITE (relative to the real tree).
    site = next((FAKEGPU.parent.parent / ".venv" / "lib").glob("python3*/site-packages"))
    done = subprocess.run(
        ["make", "-s", "-C", str(copy), "abi-check", f"SITE={site}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert "NVML_ERROR_GPU_IS_LOST 51" in done.stdout + done.stderr
