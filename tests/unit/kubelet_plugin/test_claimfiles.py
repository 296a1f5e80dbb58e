"""The plugin's side of the region contract (kubelet_plugin.claimfiles.ensure_region and
kubelet_plugin.region.enforce_size): the region is created at its fixed layout size with the
claim group, a region a tenant grew or shrank is set back to that size without touching its
contents, and a symlink or a directory in its place is refused rather than followed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kubelet_plugin.claimfiles import REGION_MODE, ensure_region
from kubelet_plugin.claims import ClaimError
from kubelet_plugin.region import REGION_SIZE, enforce_size


def test_created_sparse_at_layout_size_with_the_claim_group(tmp_path: Path) -> None:
    path = tmp_path / "region"
    assert ensure_region(str(path), os.getgid()) is True
    status = path.stat()
    assert status.st_size == REGION_SIZE
    assert stat.S_IMODE(status.st_mode) == REGION_MODE == 0o660
    assert status.st_gid == os.getgid()
    assert status.st_blocks * 512 < REGION_SIZE  # sparse: no disk until the hook writes
    assert ensure_region(str(path), os.getgid()) is False  # idempotent


@pytest.mark.parametrize("size", [0, 100, REGION_SIZE + (1 << 20)])
def test_resized_region_is_set_back_and_keeps_its_contents(tmp_path: Path, size: int) -> None:
    path = tmp_path / "region"
    ensure_region(str(path), os.getgid())
    with open(path, "r+b") as region:
        region.write(b"live counters")
        region.truncate(size)
    kept = b"live counters"[:size]
    assert ensure_region(str(path), os.getgid()) is True
    assert path.stat().st_size == REGION_SIZE
    assert path.read_bytes()[: len(kept)] == kept


@pytest.mark.parametrize("size", [0, REGION_SIZE - 4096, REGION_SIZE + (8 << 20)])
def test_governor_pass_sets_the_size_back(tmp_path: Path, size: int) -> None:
    path = tmp_path / "region"
    ensure_region(str(path), os.getgid())
    os.truncate(path, size)
    assert enforce_size(str(path)) is False
    assert path.stat().st_size == REGION_SIZE
    assert enforce_size(str(path)) is True
    assert enforce_size(str(tmp_path / "missing")) is True  # being prepared or removed


def test_symlink_or_directory_in_its_place_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    link = tmp_path / "region"
    link.symlink_to(target)
    with pytest.raises(OSError):
        ensure_region(str(link), os.getgid())
    assert target.stat().st_size == 0  # never followed
    directory = tmp_path / "dir-region"
    directory.mkdir()
    with pytest.raises((ClaimError, OSError)):
        ensure_region(str(directory), os.getgid())
