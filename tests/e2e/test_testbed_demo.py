"""`vgpu-dra demo` runs start to finish on a real control plane and cleans up after itself.

What this proves:
1. Every step runs and prints its result: the Kubernetes version and resource.k8s.io/v1, both
   nodes with their profiles, two pods placed on one GPU of node-1 with 10Gi/30 cores each, and
   the oversized claim reported unschedulable by the scheduler.
2. Without --keep the cluster directory is gone afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.cluster_fixtures import require_binaries


def test_demo_runs_and_cleans_up(tmp_path: Path) -> None:
    require_binaries()
    root = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "demo", "--dir", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"Kubernetes v1\.37\.\d+; DRA API: resource\.k8s\.io/v1", out)
    assert re.search(r"node-1 +profile=dgx-h100", out) and re.search(
        r"node-2 +profile=a10-pcie", out
    )
    placed = re.findall(
        r"pod (trainer|notebook) +-> (node-1/gpu-\d)  consumed cores=30, memory=10Gi", out
    )
    assert len(placed) == 2 and placed[0][1] == placed[1][1], out
    assert "cannot allocate all claims" in out
    assert "[5/5]" in out and "cluster stopped and removed" in out
    assert not root.exists()
