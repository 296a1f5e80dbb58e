"""The run-as-a-container helper applies CDI edits the way a runtime does.

Proves: (1) spec-level and per-device edits merge (env overrides in order, mounts with ro/rw,
device nodes, additional GIDs); (2) unknown device names and malformed env entries are
rejected with a message naming them; (3) in a real private mount namespace, a read-only bind
is read-only, a mount target missing on the host is created without touching the host, and
the env reaches the program.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from vgpu_testbed.container import BindMount, edits_from_spec, run_with_claims


def _spec(tmp: Path) -> dict[str, Any]:
    return {
        "cdiVersion": "0.7.0",
        "kind": "k8s.vgpu.dra.dev/claim",
        "containerEdits": {
            "env": ["A=1", "B=2"],
            "mounts": [
                {
                    "hostPath": str(tmp / "ro.txt"),
                    "containerPath": "/run/vgpu-test/ro.txt",
                    "options": ["bind", "ro"],
                },
                {
                    "hostPath": str(tmp / "rwdir"),
                    "containerPath": "/run/vgpu-test/rw",
                    "options": ["bind", "rw"],
                },
            ],
            "additionalGids": [4242],
        },
        "devices": [
            {
                "name": "d0",
                "containerEdits": {"env": ["B=3"], "deviceNodes": [{"path": "/dev/nvidia0"}]},
            },
            {"name": "d1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}},
        ],
    }


def test_edits_merge_in_cdi_order(tmp_path: Path) -> None:
    edits = edits_from_spec(_spec(tmp_path), ["d0"])
    assert edits.env == {"A": "1", "B": "3"}
    assert edits.mounts == (
        BindMount(str(tmp_path / "ro.txt"), "/run/vgpu-test/ro.txt", True),
        BindMount(str(tmp_path / "rwdir"), "/run/vgpu-test/rw", False),
    )
    assert edits.device_paths == ("/dev/nvidia0",)
    assert edits.additional_gids == (4242,)


def test_bad_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'d9'"):
        edits_from_spec(_spec(tmp_path), ["d9"])
    spec = _spec(tmp_path)
    spec["containerEdits"]["env"] = ["NOEQUALS"]
    with pytest.raises(ValueError, match="NOEQUALS"):
        edits_from_spec(spec, [])


@pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")
def test_mounts_in_a_private_namespace(tmp_path: Path) -> None:
    (tmp_path / "ro.txt").write_text("hello\n")
    (tmp_path / "rwdir").mkdir()
    script = (
        "cat /run/vgpu-test/ro.txt; echo x > /run/vgpu-test/ro.txt 2>/dev/null || echo ro-ok; "
        'echo written > /run/vgpu-test/rw/f; echo "B=$B"; id -G'
    )
    done = run_with_claims([(_spec(tmp_path), ["d0"])], ["sh", "-c", script])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["hello", "ro-ok", "B=3"]
    assert "4242" in lines[3].split()
    assert (tmp_path / "rwdir" / "f").read_text() == "written\n"  # rw bind reaches the host
    assert not os.path.exists("/run/vgpu-test")  # the host tree was not modified
