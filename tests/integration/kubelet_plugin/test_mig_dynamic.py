"""Dynamic MIG on a simulated H100 node: the Preparer creates a claim's instance at prepare and
destroys it at unprepare, through the simulator's NVML (shared state across processes); a process
SIGKILLed right after each step converges at the next start: no leaked and no second instance.

Each step runs in its own process (`tests.fixtures.mig_node`): the kill is a real SIGKILL of a
process in the middle of prepare or unprepare, and the next process sees only what the shared
state, the ledger and the checkpoint kept.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fakegpu.nvml_node import REPO, SimNode, build_fakegpu

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
MIB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    build_fakegpu()


def run(node: SimNode, root: Path, action: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.fixtures.mig_node", str(root), action],
        env={**node.env, "PYTHONPATH": str(REPO), **extra},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )


def step(node: SimNode, root: Path, action: str, **extra: str) -> dict[str, Any]:
    done = run(node, root, action, **extra)
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def test_prepare_creates_the_instance_and_unprepare_destroys_it(tmp_path: Path) -> None:
    node = SimNode.create("dgx-h100", tmp_path)
    prepared = step(node, tmp_path / "plugin", "prepare")
    assert prepared["error"] == ""
    [instance] = prepared["instances"]
    assert (instance["profile_id"], instance["start"], instance["size"]) == (19, 3, 1)
    mig_uuid = instance["uuid"]
    assert mig_uuid.startswith("MIG-")
    # The NVIDIA stack's names for a MIG device, and the instance's memory as the hook's total.
    assert f"NVIDIA_VISIBLE_DEVICES={mig_uuid}" in prepared["env"]
    assert f"CUDA_VISIBLE_DEVICES={mig_uuid}" in prepared["env"]
    assert f"uuid=GPU-{mig_uuid[4:]} memory={9984 * MIB} cores=0 policy=none" in prepared["conf"]
    assert prepared["prepared"] == [UID]
    # A restart adopts it (its claim is prepared): still one instance, the same one.
    again = step(node, tmp_path / "plugin", "check")
    assert [i["uuid"] for i in again["instances"]] == [mig_uuid]
    done = step(node, tmp_path / "plugin", "unprepare")
    assert done["error"] == ""
    assert done["instances"] == [] and done["ledger"] == [] and done["prepared"] == []


@pytest.mark.parametrize("kill_at", ["ledger", "gpu-instance", "compute-instance"])
def test_sigkill_during_prepare_converges(tmp_path: Path, kill_at: str) -> None:
    node = SimNode.create("dgx-h100", tmp_path)
    killed = run(node, tmp_path / "plugin", "prepare", MIG_KILL_AT=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # The next start destroys whatever the dead prepare made and forgets its ledger entry ...
    after = step(node, tmp_path / "plugin", "check")
    assert after == {"instances": [], "ledger": [], "prepared": []}
    # ... and the kubelet's retry prepares the claim with exactly one instance.
    retried = step(node, tmp_path / "plugin", "prepare")
    assert retried["error"] == "" and len(retried["instances"]) == 1
    assert retried["prepared"] == [UID]


@pytest.mark.parametrize("kill_at", ["destroyed-compute-instance", "destroyed-gpu-instance"])
def test_sigkill_during_unprepare_converges(tmp_path: Path, kill_at: str) -> None:
    node = SimNode.create("dgx-h100", tmp_path)
    assert step(node, tmp_path / "plugin", "prepare")["error"] == ""
    killed = run(node, tmp_path / "plugin", "unprepare", MIG_KILL_AT=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # The claim is still prepared (the checkpoint record goes last): the kubelet retries the
    # unprepare, which removes what is left.
    retried = step(node, tmp_path / "plugin", "unprepare")
    assert retried == {
        "error": "",
        "seconds": retried["seconds"],
        "instances": [],
        "ledger": [],
        "prepared": [],
    }


def test_whole_gpu_of_a_dynamic_gpu_is_its_full_instance(tmp_path: Path) -> None:
    node = SimNode.create("dgx-h100", tmp_path)
    prepared = step(node, tmp_path / "plugin", "prepare", MIG_DEVICE="gpu-0")
    assert prepared["error"] == ""
    [instance] = prepared["instances"]
    assert (instance["profile_id"], instance["start"], instance["size"]) == (0, 0, 8)
