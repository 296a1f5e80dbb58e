"""A plain install runs the product: its packages import without anything only the extras bring.

The layer contract in pyproject.toml (lint-imports, `make lint`) checks the static imports
between our packages. This test checks the other half at run time: in a fresh interpreter where
every module of every distribution named only in an extra (`dev`: pytest,
cuda-python, ...) and our own test code (`vgpu_testbed`, `tests`, `bench`) cannot be
imported, every module of `dra_driver`, `kubelet_plugin` and `controller` still imports. It fails
when a product module starts importing, say, pytest or the test bed.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("dra_driver", "kubelet_plugin", "controller")
OUR_TEST_CODE = {"vgpu_testbed", "tests", "bench"}

IMPORT_ALL = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys
    blocked = set(sys.argv[1].split(","))
    tried = []

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                tried.append(name)
                raise ModuleNotFoundError(f"blocked: {name}", name=name)
            return None

    sys.meta_path.insert(0, Missing())
    imported = 0
    for package in sys.argv[2:]:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            importlib.import_module(info.name)
            imported += 1
    print(imported, len(tried))
    """
)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution(requirement: str) -> str:
    """`name[extra]>=1; marker` -> normalised `name`."""
    return _normalise(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0])


def extra_only_modules() -> set[str]:
    """Top-level modules of the distributions that only the extras of pyproject.toml bring."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {_distribution(req) for req in project["dependencies"]}
    extra = {
        _distribution(req) for reqs in project["optional-dependencies"].values() for req in reqs
    }
    extra -= core | {"vgpu-dra"}
    modules = {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(_normalise(dist) in extra for dist in dists) and module.isidentifier()
    }
    assert {"pytest", "hypothesis"} <= modules  # the extras' own distributions are among them
    return modules


def test_product_modules_import_without_extras_or_test_code() -> None:
    blocked = sorted(extra_only_modules() | OUR_TEST_CODE)
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, ",".join(blocked), *PRODUCT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    imported, _ = map(int, done.stdout.split())
    assert imported >= 30  # every module was walked, not an empty tree


def test_the_blocker_would_catch_a_product_import_of_the_test_bed() -> None:
    """The same harness fails when a product import needs a blocked module."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, "dra_driver", "kubelet_plugin"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert done.returncode != 0
    assert "blocked: dra_driver" in done.stderr
