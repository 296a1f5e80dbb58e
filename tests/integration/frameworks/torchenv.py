"""Helpers for running tests/fixtures/torch_checks.py under the torch environment of `make torch`.

Reusable from other tests: `torch_python()` (vgpu_testbed.torchapp, which also gives the
environment's mounts for a pod on a real node, tests/e2e/frameworks) finds the environment
without installing anything, `run_checks()` runs the checks through any runner (a claim's
container, a plain subprocess) and returns their JSON.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vgpu_testbed.torchapp import torch_python

__all__ = ["CHECKS", "REPO", "Runner", "run_checks", "torch_python"]

REPO = Path(__file__).resolve().parents[3]
CHECKS = REPO / "tests" / "fixtures" / "torch_checks.py"


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
