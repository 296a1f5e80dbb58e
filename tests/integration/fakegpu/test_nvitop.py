"""nvitop, a third-party NVML client, on a simulated node: its one-shot mode lists every
simulated GPU with its memory, and a process holding memory through the fake CUDA driver shows in
its process table with that memory. Runs `python -m nvitop --once` as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.fakegpu.nvml_node import SimNode, build_fakegpu


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build_fakegpu()


def nvitop_once(node: SimNode) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "nvitop", "--once", "--no-unicode"],
        env={**node.env, "COLUMNS": "200", "LINES": "100", "TERM": "xterm"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_nvitop_lists_the_simulated_gpus_and_a_process(tmp_path: Path) -> None:
    node = SimNode.create("dgx-h100", tmp_path)
    with node.holding(2, 6 << 30) as proc:
        out = nvitop_once(node)
    assert "Driver Version: 580.95.05" in out and "CUDA Driver Version: 13.0" in out
    assert out.count("H100 80GB HBM3") == 8
    for gpu in node.profile.gpus:
        assert gpu.pci_bus_id in out
    assert out.count("79.65GiB") == 8  # 81559 MiB total on every GPU
    rows = [line for line in out.splitlines() if f" {proc.pid} " in line]
    assert len(rows) == 1, out
    assert "6.00GiB" in rows[0] or "6144MiB" in rows[0], rows[0]


def test_nvitop_on_a_node_without_processes(tmp_path: Path) -> None:
    out = nvitop_once(SimNode.create("a10-pcie", tmp_path))
    assert out.count("NVIDIA A10") + out.count(" A10 ") >= 4
    assert "No running processes found" in out
