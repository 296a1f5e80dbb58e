"""The checkpoint document: round trip, absent file, corruption, atomic replacement."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kubelet_plugin.checkpoint import CheckpointError, CheckpointFile, CheckpointJournal
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


def journal_lines(tmp_path: Path) -> list[str]:
    return (tmp_path / "checkpoint.log").read_text().splitlines()


def test_journal_replays_over_the_snapshot_and_compacts_at_open(tmp_path: Path) -> None:
    journal = CheckpointJournal(str(tmp_path))
    journal.open({"a": plan("a")})
    journal.append([("put", plan("b")), ("put", plan("c"))])
    journal.append([("del", "a")])
    assert len(journal_lines(tmp_path)) == 3
    journal.close()
    # a restart (after a crash: no compaction happened) sees snapshot + journal
    again = CheckpointJournal(str(tmp_path))
    state = again.load()
    assert sorted(state) == ["b", "c"]
    again.open(state)  # compaction: the state becomes the snapshot, the journal empties
    assert journal_lines(tmp_path) == []
    assert sorted(CheckpointFile(str(tmp_path)).load()) == ["b", "c"]
    again.close()


def test_crash_between_snapshot_and_journal_truncation_replays_harmlessly(tmp_path: Path) -> None:
    journal = CheckpointJournal(str(tmp_path))
    journal.open({})
    journal.append([("put", plan("a")), ("put", plan("b")), ("del", "a")])
    journal.close()
    log = (tmp_path / "checkpoint.log").read_bytes()
    CheckpointFile(str(tmp_path)).store({"b": plan("b")})  # the new snapshot landed ...
    (tmp_path / "checkpoint.log").write_bytes(log)  # ... the truncation did not
    assert sorted(CheckpointJournal(str(tmp_path)).load()) == ["b"]


@pytest.mark.parametrize("tail", [b'{"op":"put","plan":{"uid":"x"', b"\0" * 512])
def test_torn_last_record_is_dropped(tmp_path: Path, tail: bytes) -> None:
    journal = CheckpointJournal(str(tmp_path))
    journal.open({})
    journal.append([("put", plan("a"))])
    journal.close()
    with (tmp_path / "checkpoint.log").open("ab") as handle:
        handle.write(tail)  # an append a power loss cut short (never acknowledged)
    assert list(CheckpointJournal(str(tmp_path)).load()) == ["a"]


def test_corrupt_record_before_the_last_is_refused_with_advice(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.log").write_bytes(b"\xff\xfe garbage\n" + b'{"op":"del","uid":"a"}\n')
    with pytest.raises(CheckpointError, match=r"checkpoint\.log line 1 is unreadable.*move it"):
        CheckpointJournal(str(tmp_path)).load()
