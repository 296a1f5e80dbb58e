"""Shared pytest wiring for every test level: markers that depend on where a test lives or what the
machine has, and the control-plane fixtures (tests/cluster_fixtures.py) every level shares.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ("tests.cluster_fixtures",)

_E2E_DIR = Path(__file__).parent / "e2e"


def _has_real_gpu() -> bool:
    # The NVIDIA control device exists wherever the real driver is loaded; the override lets a
    # GPU host without it (or a container without /dev) opt in explicitly.
    return os.environ.get("VGPU_DRA_REAL_GPU") == "1" or Path("/dev/nvidiactl").exists()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a real NVIDIA GPU (set VGPU_DRA_REAL_GPU=1 on one)")
    gpu_present = _has_real_gpu()
    for item in items:
        if _E2E_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
        if "gpu" in item.keywords and not gpu_present:
            item.add_marker(skip_gpu)
