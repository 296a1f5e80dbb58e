"""A tenant that resizes its region must not crash the kubelet plugin or fill the node's disk.

The governor maps every claim's region; a read beyond the end of a file a tenant shrank raises
SIGBUS and kills the process. Each governor pass first sets a resized region back to its layout
size (`kubelet_plugin.region.enforce_size`), so the pass that follows reads valid pages, and a
region grown to fill the disk is cut back. The tick runs in a child process so that a SIGBUS
(what happened before the fix) fails this test instead of killing pytest.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kubelet_plugin import region as rg
from kubelet_plugin.claimfiles import ensure_region
from kubelet_plugin.governor import REGION_SWEEP_TICKS, CappedDevice, Governor, GpuSample
from tests.fixtures.regions import write_region

REPO = Path(__file__).resolve().parents[3]
UUID = "GPU-00000000-1111-2222-3333-444444444444"

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from kubelet_plugin.governor import CappedDevice, Governor, GpuSample
    from kubelet_plugin.region import POLICY_FIXED

    class Source:
        def sample(self, uuid, since_us):
            return GpuSample(device_util=50.0, process_util={101: 50.0})

    state, size, uuid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    governor = Governor(state, Source(), lambda: {"c1": [CappedDevice(uuid, 30, POLICY_FIXED)]})
    governor.tick()  # maps the region
    os.truncate(os.path.join(state, "claims", "c1", "region"), size)  # the tenant resizes it
    governor.tick()
    governor.tick()
    print("ticked", os.path.getsize(os.path.join(state, "claims", "c1", "region")))
    """
)


def _tick_after_resize(tmp_path: Path, size: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "claims" / "c1").mkdir(parents=True)
    write_region(tmp_path / "claims" / "c1" / "region", UUID, 30, pid=101)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(size), UUID],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_shrunk_region_does_not_kill_the_governor(tmp_path: Path) -> None:
    done = _tick_after_resize(tmp_path, 0)
    assert done.returncode != -signal.SIGBUS, "the governor died of SIGBUS"
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ticked", str(rg.REGION_SIZE)]


def test_grown_region_is_cut_back_by_the_governor(tmp_path: Path) -> None:
    done = _tick_after_resize(tmp_path, rg.REGION_SIZE + (64 << 20))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ticked", str(rg.REGION_SIZE)]


def test_uncapped_claims_regions_are_swept_too(tmp_path: Path) -> None:
    """A claim without a compute cap is not mapped by the governor, but its region is still the
    tenant's one writable file: the sweep cuts it back within REGION_SWEEP_TICKS passes."""

    class Idle:
        def sample(self, uuid: str, since_us: int) -> GpuSample | None:
            return None

    regions = []
    for uid in ("u1", "u2", "u3"):
        (tmp_path / "claims" / uid).mkdir(parents=True)
        regions.append(write_region(tmp_path / "claims" / uid / "region", UUID, 0))
        os.truncate(regions[-1], rg.REGION_SIZE + (16 << 20))
    governor = Governor(str(tmp_path), Idle(), lambda: {"u1": [], "u2": [], "u3": []})
    for _ in range(REGION_SWEEP_TICKS):
        governor.tick()
    assert [path.stat().st_size for path in regions] == [rg.REGION_SIZE] * 3


def test_region_not_yet_initialised_is_waited_for_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Prepare creates the region zero-filled; until the claim's first hooked process writes its
    header the governor skips the claim without a warning per pass, then picks it up."""

    class Idle:
        def sample(self, uuid: str, since_us: int) -> GpuSample | None:
            return None

    path = tmp_path / "claims" / "c1" / "region"
    path.parent.mkdir(parents=True)
    ensure_region(str(path), os.getgid())
    caps = {"c1": [CappedDevice(UUID, 30, rg.POLICY_FIXED)]}
    governor = Governor(str(tmp_path), Idle(), lambda: caps)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            governor.tick()
    assert caplog.records == [] and governor.claims == {}
    write_region(path, UUID, 30, pid=101)  # what the hook's first process does
    governor.tick()
    assert list(governor.claims) == ["c1"]
    governor.close()
