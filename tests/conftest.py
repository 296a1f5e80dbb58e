"""Shared pytest wiring for every test level: markers that depend on where a test lives or what the
machine has, the control-plane fixtures (tests/fixtures/cluster.py) every level shares, and the
guard that fails a test which leaves threads or child processes behind (tests/fixtures/leaks.py).

Every test has a 60 s limit (pytest-timeout, `timeout` in pyproject.toml), fixtures included; a
test that needs longer says so with `@pytest.mark.timeout(N)` (or a module's `pytestmark`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures import leaks

pytest_plugins = ("tests.fixtures.cluster",)

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


@pytest.fixture(autouse=True)
def no_leaked_threads_or_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test (at teardown) when threads or child processes it started outlive it.

    Function-scoped autouse fixtures are set up after every session- and module-scoped fixture
    the test uses and torn down after all its other function-scoped ones, so the snapshot
    excludes the shared control plane and the check includes the test's own fixtures. A process
    that a live test-bed Cluster of the test's fixtures records is the cluster's to stop.
    """
    before = leaks.snapshot()
    fixture_values = list(getattr(request.node, "funcargs", {}).values())
    yield
    threads, children = leaks.leaks(before, owned=lambda: leaks.cluster_owned(fixture_values))
    if threads or children:
        leaks.kill(children)
        pytest.fail(
            f"the test leaked {leaks.describe(threads, children)} "
            f"(still alive {leaks.GRACE_S:.0f} s after its teardown)",
            pytrace=False,
        )
