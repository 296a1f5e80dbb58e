"""Fixtures of the framework tests: the torch environment (`make torch`) and, from the hook's
tests, a simulated node with claims prepared per the prepare -> container contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.frameworks.torchenv import torch_python
from tests.integration.vgpu_hook.conftest import built, node

__all__ = ["built", "node", "torch_py"]


@pytest.fixture(scope="session")
def torch_py() -> Path:
    python = torch_python()
    if python is None:
        pytest.skip("the torch environment is not installed (make torch)")
    return python
