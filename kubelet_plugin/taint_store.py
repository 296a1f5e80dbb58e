"""`<state-dir>/device-health.json`: the device-taint conditions, so a restart keeps them.

Why: a fatal GPU must stay tainted across plugin restarts (a crash loop must not un-taint it), and
a recoverable XID's quiet period must not start over. Written atomically and fsynced
(`dra_driver.atomicfile`) by the health monitor whenever a condition appears or is lifted; read
once at start-up. The document is `TaintState.to_json()` (`kubelet_plugin.taints`).

An unreadable file is not fatal (the health of a node must not stop its claims from being
served): it is moved aside to `device-health.json.corrupt` with an error in the log, and the
plugin starts with no conditions; NVML re-reports what is still wrong.
"""

from __future__ import annotations

import json
import logging
import os

from dra_driver.atomicfile import write_atomic
from kubelet_plugin.taints import DEFAULT_QUIET_S, TaintState

log = logging.getLogger(__name__)

FILE_NAME = "device-health.json"


def store_path(state_dir: str) -> str:
    return os.path.join(state_dir, FILE_NAME)


def load(path: str, *, quiet_s: float = DEFAULT_QUIET_S) -> TaintState:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return TaintState(quiet_s=quiet_s)
    try:
        return TaintState.from_json(json.loads(text), quiet_s=quiet_s)
    except (ValueError, AttributeError) as exc:
        aside = path + ".corrupt"
        os.replace(path, aside)
        log.error(
            "%s is unreadable (%s); moved to %s, starting with no device taints", path, exc, aside
        )
        return TaintState(quiet_s=quiet_s)


def save(path: str, state: TaintState) -> None:
    data = json.dumps(state.to_json(), indent=1, sort_keys=True).encode()
    write_atomic(path, data, mode=0o600)
