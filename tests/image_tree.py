"""The image's file tree for tests: built by deploy/image/build-tree.sh (the script the
Dockerfile runs), run on the base interpreter so nothing from the developer's virtualenv helps."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")


def built_tree() -> Path:
    """The tree `make image-tree` built (`make test` builds it first): tests only read it, so no
    test installs packages from an index. VGPU_DRA_IMAGE_TREE points elsewhere if set."""
    root = Path(os.environ.get("VGPU_DRA_IMAGE_TREE", REPO / "build" / "image-tree"))
    assert (root / ".built").is_file(), f"no image tree at {root}: run `make image-tree` first"
    return root


def tree_bin(root: Path) -> Path:
    return root / "usr" / "local" / "bin"


def tree_env(root: Path) -> dict[str, str]:
    """PATH with the tree's programs first, and the interpreter its launcher must use."""
    path = f"{tree_bin(root)}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {"PATH": path, "VGPU_DRA_PYTHON": BASE_PYTHON}
