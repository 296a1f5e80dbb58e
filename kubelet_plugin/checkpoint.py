"""The kubelet plugin's memory across restarts: which claims are prepared, and how.

Two files in the state dir. `checkpoint.json` is the snapshot `{"version": 1, "claims": {uid:
ClaimPlan}}`, replaced atomically (temp file, fsync, rename, directory fsync). `checkpoint.log`
is a journal of the changes since that snapshot, one JSON line each: `{"op": "put", "plan":
ClaimPlan}` or `{"op": "del", "uid": ...}`. Prepare records a claim (a journal line, appended and
fdatasync'ed) after its files are written and before answering the kubelet; unprepare records
its removal. So a prepare+unprepare cycle costs two syncs, not four (snapshot file and directory,
twice), and a batch's records share one.

Recovery: load the snapshot, replay the journal over it (readers beside a live plugin, such as
the test bed, use `CheckpointJournal.load` too); a last line that a crash tore (partly
written, or zero-filled) was never acknowledged and is dropped, a bad line before it is
corruption. At start-up and every COMPACT_AFTER records the state is written as a new snapshot
and the journal emptied; a crash between the two replays records the snapshot already holds,
which is harmless (each record sets or deletes one key). Start-up reconciliation
(`kubelet_plugin.prepare`) rebuilds CDI specs and hook configs from the result.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dra_driver.atomicfile import fsync_dir, write_atomic
from kubelet_plugin.plan import ClaimPlan

CHECKPOINT_FILE = "checkpoint.json"
JOURNAL_FILE = "checkpoint.log"
COMPACT_AFTER = 1024  # journal records before the state is rewritten as a snapshot


class CheckpointError(RuntimeError):
    """The checkpoint exists but cannot be read; the plugin refuses to guess what is prepared."""


class CheckpointDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    claims: dict[str, ClaimPlan] = {}


class CheckpointFile:
    """Load and store the checkpoint document; no caching, no locking (the caller serialises)."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, CHECKPOINT_FILE)

    def load(self) -> dict[str, ClaimPlan]:
        """Prepared claims by UID; an absent file means nothing is prepared."""
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return {}
        try:  # bytes: a non-UTF-8 file gets the same advice as any other corrupt one
            document = CheckpointDocument.model_validate(json.loads(raw.decode("utf-8")))
        except (ValueError, ValidationError, RecursionError) as exc:
            raise CheckpointError(_unreadable(self.path, exc)) from None
        for uid, plan in document.claims.items():
            if plan.uid != uid:
                raise CheckpointError(
                    f"checkpoint {self.path}: entry {uid} describes claim {plan.uid}"
                )
        return dict(document.claims)

    def store(self, claims: Mapping[str, ClaimPlan]) -> None:
        document = CheckpointDocument(claims=dict(claims))
        data = document.model_dump_json(indent=1).encode() + b"\n"
        write_atomic(self.path, data, mode=0o600)


# A change to the prepared set: ("put", plan) or ("del", uid).
Record = tuple[Literal["put"], ClaimPlan] | tuple[Literal["del"], str]


class CheckpointJournal:
    """Snapshot + journal (see the module docstring); the caller serialises writers."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.snapshot = CheckpointFile(state_dir)
        self.path = os.path.join(state_dir, JOURNAL_FILE)
        self._fd: int | None = None
        self._size = 0  # bytes of acknowledged records in the journal
        self._records = 0
        self._broken = False  # an append failed half-way: compact before appending again

    def load(self) -> dict[str, ClaimPlan]:
        """The prepared claims: the snapshot with the journal replayed over it."""
        # Journal first: compaction renames the new snapshot into place before it empties the
        # journal, so a reader running beside a live plugin never pairs an emptied journal with
        # the old snapshot (an old journal over the new snapshot replays harmlessly).
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            raw = b""
        claims = self.snapshot.load()
        lines = [
            (number, line)
            for number, line in enumerate(raw.split(b"\n"), start=1)
            if line.strip(b"\0 ")  # a crash can leave zero-filled blocks at the end
        ]
        for index, (number, line) in enumerate(lines):
            try:
                _apply(claims, json.loads(line.decode("utf-8")))
            except (ValueError, ValidationError, RecursionError, KeyError, TypeError) as exc:
                if index == len(lines) - 1:
                    break  # the torn tail of an append a crash interrupted: never acknowledged
                raise CheckpointError(_unreadable(f"{self.path} line {number}", exc)) from None
        return claims

    def open(self, claims: Mapping[str, ClaimPlan]) -> None:
        """Start appending: `claims` (what load() returned) becomes the snapshot."""
        os.makedirs(self.state_dir, mode=0o755, exist_ok=True)
        fd = os.open(
            self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
        self._fd = fd
        self.compact(claims)
        fsync_dir(self.state_dir)  # the journal's own directory entry, once

    @property
    def wants_compaction(self) -> bool:
        return self._broken or self._records >= COMPACT_AFTER

    def mark_broken(self) -> None:
        """The next write must be a full snapshot (records were lost from the queue)."""
        self._broken = True

    def append(self, records: Sequence[Record]) -> None:
        """Persist `records` (one write, one fdatasync); OSError names the journal."""
        fd = self._require_open()
        data = b"".join(_encode(record) for record in records)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fdatasync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, self._size)  # drop the partial record
            except OSError:
                self._broken = True
            raise OSError(exc.errno, exc.strerror, self.path) from exc
        self._size += len(data)
        self._records += len(records)

    def compact(self, claims: Mapping[str, ClaimPlan]) -> None:
        """Write `claims` as the snapshot, then empty the journal."""
        fd = self._require_open()
        self.snapshot.store(claims)
        os.ftruncate(fd, 0)
        os.fsync(fd)
        self._size = self._records = 0
        self._broken = False

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _require_open(self) -> int:
        if self._fd is None:
            raise RuntimeError("checkpoint journal used before open()")
        return self._fd


def _encode(record: Record) -> bytes:
    if record[0] == "put":
        return b'{"op":"put","plan":' + record[1].model_dump_json().encode() + b"}\n"
    return json.dumps({"op": "del", "uid": record[1]}).encode() + b"\n"


def _apply(claims: dict[str, ClaimPlan], entry: dict[str, object]) -> None:
    if entry["op"] == "put":
        plan = ClaimPlan.model_validate(entry["plan"])
        claims[plan.uid] = plan
    elif entry["op"] == "del":
        claims.pop(str(entry["uid"]), None)
    else:
        raise ValueError(f"unknown journal op {entry['op']!r}")


def _unreadable(where: str, exc: Exception) -> str:
    return (
        f"checkpoint {where} is unreadable ({_first_line(exc)}); move it aside to start from "
        f"scratch (prepared claims will then be re-prepared by the kubelet)"
    )


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
