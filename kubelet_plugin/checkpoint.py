"""The kubelet plugin's memory across restarts: which claims are prepared, and how.

`<state-dir>/checkpoint.json` is `{"version": 1, "claims": {uid: ClaimPlan}}`. Prepare records a
claim here after its files are written and before answering the kubelet; unprepare removes it;
start-up reconciliation (`kubelet_plugin.prepare`) rebuilds CDI specs and hook configs from it.
Each write is atomic (temp file, fsync, rename), so a crash leaves the old or the new document.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dra_driver.atomicfile import write_atomic
from kubelet_plugin.plan import ClaimPlan

CHECKPOINT_FILE = "checkpoint.json"


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
            raise CheckpointError(
                f"checkpoint {self.path} is unreadable ({_first_line(exc)}); move it aside to "
                f"start from scratch (prepared claims will then be re-prepared by the kubelet)"
            ) from None
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


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
