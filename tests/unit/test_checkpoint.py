"""The checkpoint document: round trip, absent file, corruption, atomic replacement."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kubelet_plugin.checkpoint import CheckpointError, CheckpointFile
from kubelet_plugin.plan import ClaimPlan, DevicePlan


def plan(uid: str) -> ClaimPlan:
    return ClaimPlan(
        uid=uid,
        namespace="ns",
        name=f"claim-{uid}",
        devices=(
            DevicePlan(
                request="gpu",
                pool="node-1",
                device="gpu-0",
                share_id="s",
                uuid="GPU-x",
                minor=0,
                memory=1 << 30,
                cores=20,
                policy="balance",
                toolkit_cdi_ids=("nvidia.com/gpu=0",),
            ),
        ),
    )


def test_absent_file_means_nothing_prepared(tmp_path: Path) -> None:
    assert CheckpointFile(str(tmp_path)).load() == {}


def test_round_trip_and_format(tmp_path: Path) -> None:
    store = CheckpointFile(str(tmp_path))
    store.store({"a": plan("a"), "b": plan("b")})
    assert store.load() == {"a": plan("a"), "b": plan("b")}
    document = json.loads((tmp_path / "checkpoint.json").read_text())
    assert document["version"] == 1
    assert sorted(document["claims"]) == ["a", "b"]
    assert stat.S_IMODE(os.stat(tmp_path / "checkpoint.json").st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]  # no temp debris


def test_store_replaces_the_whole_document(tmp_path: Path) -> None:
    store = CheckpointFile(str(tmp_path))
    store.store({"a": plan("a")})
    store.store({"b": plan("b")})
    assert list(store.load()) == ["b"]


@pytest.mark.parametrize(
    "content",
    ['{"version": 2, "claims": {}}', "{truncated", '{"version": 1, "claims": {"a": {"uid": 1}}}'],
)
def test_unreadable_checkpoint_is_refused_with_advice(tmp_path: Path, content: str) -> None:
    (tmp_path / "checkpoint.json").write_text(content)
    with pytest.raises(CheckpointError, match="move it aside"):
        CheckpointFile(str(tmp_path)).load()


def test_entry_key_must_match_its_uid(tmp_path: Path) -> None:
    store = CheckpointFile(str(tmp_path))
    store.store({"a": plan("b")})
    with pytest.raises(CheckpointError, match="entry a describes claim b"):
        store.load()


def test_non_utf8_checkpoint_gets_the_same_advice(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_bytes(b'{"version": 1, "claims": {"\xff\xfe": {}}}')
    with pytest.raises(CheckpointError, match="move it aside"):
        CheckpointFile(str(tmp_path)).load()


def test_checkpoint_nested_thousands_deep_gets_the_same_advice(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="move it aside"):
        CheckpointFile(str(tmp_path)).load()
