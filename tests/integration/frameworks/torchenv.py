"""Helpers for running tests/fixtures/torch_checks.py under the torch environment of `make torch`.

Reusable from other tests (e.g. inside containers on real test-bed nodes): `torch_python()`
finds the environment without installing anything, `run_checks()` runs the checks through any
runner (a claim's container, a plain subprocess) and returns their JSON.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
INSTALL = REPO / "hack" / "torch" / "install.sh"
CHECKS = REPO / "tests" / "fixtures" / "torch_checks.py"


def torch_python() -> Path | None:
    """The torch environment's python if `make torch` installed it, else None."""
    done = subprocess.run(
        ["bash", str(INSTALL), "--check"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return None
    return Path(done.stdout.strip().splitlines()[-1])


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_checks(
    run: Runner, python: Path, cap: int, checks: Sequence[str], device: int = 0
) -> dict[str, Any]:
    """torch_checks.py's JSON; `run` executes an argv (in a container, or not)."""
    argv = [
        str(python),
        "-W",
        "ignore",
        str(CHECKS),
        "--cap",
        str(cap),
        "--device",
        str(device),
        "--checks",
        ",".join(checks),
    ]
    done = run(argv)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"torch_checks printed no result ({done.returncode}): {done.stdout}{done.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result
