"""A full state filesystem fails the claim with an error that names the path (issue 15.8).

Real ENOSPC, not a patched `os.write`: a child process in its own mount namespace mounts a
256 KiB tmpfs, puts the state dir and CDI root on it, fills it, and prepares a claim. Needs root
and `unshare` (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import errno, json, os, sys
from pathlib import Path
from kubelet_plugin.prepare import Preparer
from tests.fixtures.claimdata import GiB, claim, inventory, result
from tests.fixtures.prepare import Claims, node_settings

root = Path(sys.argv[1])
claims = Claims()
preparer = Preparer(node_settings(root), inventory(memory=16 * GiB), claims)
preparer.reconcile()
before = claims.add(claim([result("gpu-1", memory="1Gi")], name="before"))
assert preparer.prepare([before])[before.uid].error == ""
ref = claims.add(claim([result("gpu-0", memory="1Gi")]))
fd = os.open(root / "filler", os.O_WRONLY | os.O_CREAT)  # use up every block
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError as exc:
    assert exc.errno == errno.ENOSPC, exc
os.close(fd)
error = preparer.prepare([ref])[ref.uid].error
prepared = sorted(preparer.prepared())
os.unlink(root / "filler")  # space again: the next claim goes through, nothing was lost
after = claims.add(claim([result("gpu-2", memory="1Gi")], name="after"))
assert preparer.prepare([after])[after.uid].error == ""
preparer.close()
from kubelet_plugin.checkpoint import CheckpointJournal
on_disk = sorted(CheckpointJournal(str(root / "state")).load())
print(json.dumps({"error": error, "prepared": prepared, "on_disk": on_disk,
                  "expected": sorted([before.uid, after.uid])}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_full_state_filesystem_names_the_path(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    script = (
        f'mount -t tmpfs -o size=256k tmpfs "{mount}" || exit 77; '
        f'exec "{sys.executable}" -c "$0" "{mount}"'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode == 77:
        pytest.skip("cannot mount a tmpfs here")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(outcome["prepared"]) == 1  # the claim prepared before the disk filled
    assert outcome["on_disk"] == outcome["expected"]
    assert f"no space left on the filesystem of {mount}/" in outcome["error"], outcome["error"]
    assert "free space there" in outcome["error"]
