"""`<state-dir>/mig-instances.json`: which claim owns which MIG placement, written BEFORE the
instance is created (dynamic MIG, `kubelet_plugin.mig_instances`).

Why a file of its own and not a checkpoint record: the checkpoint says "prepared", and a claim is
not prepared while its instance is being made; the kubelet's retry must not find it there. The
ledger says "this placement of this GPU is (about to be) this claim's". With it a restarted plugin
can tell every instance on a dynamic GPU apart: one the ledger gives to a prepared claim is kept
(adopted), anything else is destroyed (a crash between the ledger write and the checkpoint
record, a leak from an earlier plugin, an instance made by hand). Small (one entry per prepared
MIG device), so it is rewritten whole and fsynced (`dra_driver.atomicfile`) on every change.
"""

from __future__ import annotations

import json
import os
import threading

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver import atomicfile

FILE_NAME = "mig-instances.json"
VERSION = 1


class LedgerError(RuntimeError):
    """The ledger cannot be read: the message names the file and what to do."""


class LedgerEntry(BaseModel):
    """One placement owned by one claim."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    claim: str
    device: str = Field(description="the allocated device (a MIG device or a whole GPU)")
    gpu_uuid: str
    profile_id: int
    start: int
    size: int
    slices: int = Field(description="compute slices (the one compute instance spans them)")


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = VERSION
    entries: list[LedgerEntry] = []


class MigLedger:
    """The ledger, in memory and on disk; every method is thread-safe."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, FILE_NAME)
        self._lock = threading.Lock()
        self._entries = self._load()

    def _load(self) -> list[LedgerEntry]:
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return []
        try:
            loaded = _File.model_validate_json(raw)
        except (ValidationError, ValueError) as exc:
            raise LedgerError(
                f"{self.path} cannot be read ({str(exc).splitlines()[0]}): move it aside; the "
                "plugin then destroys every MIG instance no prepared claim is known to own"
            ) from None
        if loaded.version != VERSION:
            raise LedgerError(f"{self.path}: version {loaded.version}, expected {VERSION}")
        return list(loaded.entries)

    def entries(self) -> list[LedgerEntry]:
        with self._lock:
            return list(self._entries)

    def of_claim(self, claim: str) -> list[LedgerEntry]:
        with self._lock:
            return [e for e in self._entries if e.claim == claim]

    def add(self, entry: LedgerEntry) -> None:
        """Record (durably) that `entry.claim` owns the placement; a repeat is a no-op."""
        with self._lock:
            if entry in self._entries:
                return
            self._write([*self._entries, entry])

    def drop(self, keep: set[str] | None = None, *, claim: str | None = None) -> None:
        """Forget the entries of `claim`, or of every claim not in `keep`."""
        with self._lock:
            if claim is not None:
                left = [e for e in self._entries if e.claim != claim]
            else:
                left = [e for e in self._entries if keep is not None and e.claim in keep]
            if left != self._entries:
                self._write(left)

    def _write(self, entries: list[LedgerEntry]) -> None:
        data = json.dumps(_File(entries=entries).model_dump(), sort_keys=True).encode()
        atomicfile.write_atomic(self.path, data, mode=0o600)
        self._entries = entries
