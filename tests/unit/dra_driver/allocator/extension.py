"""The mark of tests that need the allocator's Cython extension (`dra_driver.allocator._scan`):
skipped where it is not built, except under CI (the `CI` environment variable set), where it
must be built: there they run, and fail without it (`Allocator()` says what is missing)."""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import pytest

BUILT = importlib.util.find_spec("dra_driver.allocator._scan") is not None

needs_extension = pytest.mark.skipif(
    not BUILT and not os.environ.get("CI"),
    reason="the allocator's Cython extension is not built (make native)",
)


def kernels() -> ModuleType:
    """`dra_driver.allocator._scan`, imported when a test runs (not when it is collected)."""
    return importlib.import_module("dra_driver.allocator._scan")
