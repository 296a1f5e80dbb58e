"""The image's file tree for tests: built by deploy/image/build-tree.sh (the script the
Dockerfile runs), run on the base interpreter so nothing from the developer's virtualenv helps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")


def build_tree(root: Path) -> Path:
    """Build the tree under `root` (about a minute: pip installs the wheel's dependencies)."""
    run = subprocess.run(
        ["sh", str(REPO / "deploy" / "image" / "build-tree.sh"), str(root), sys.executable],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return root


def tree_bin(root: Path) -> Path:
    return root / "usr" / "local" / "bin"


def tree_env(root: Path) -> dict[str, str]:
    """PATH with the tree's programs first, and the interpreter its launcher must use."""
    path = f"{tree_bin(root)}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {"PATH": path, "VGPU_DRA_PYTHON": BASE_PYTHON}
