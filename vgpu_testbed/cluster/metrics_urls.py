"""Where the test bed's kubelet plugins serve their metrics: read from its cluster directory.

Why here and not in the product: a `vgpu-dra dev-cluster` directory's `state.json` lists the
plugin processes (`kubelet-plugin-<node>`), each of which logs the URL it serves on
(`metrics_url=...`). Only the test bed knows that layout; `vgpu-dra dev-cluster gpus` hands the
URLs found here to the product's `vgpu-dra status` as explicit endpoints, the way a user passes
`--metrics-endpoint`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver.metrics_endpoints import Endpoint, url_endpoint

PLUGIN_PROCESS_PREFIX = "kubelet-plugin-"  # the bed's process names
_URL_IN_LOG = re.compile(r"metrics_url=(http://\S+)")
_LOG_TAIL_BYTES = 1 << 20  # the URL is logged at start-up; a plugin's log can grow long


def is_cluster_dir(path: Path) -> bool:
    return (path / "state.json").is_file()


def from_cluster_dir(root: Path) -> dict[str, Endpoint]:
    """node -> endpoint of every plugin process recorded in `root/state.json` that logged a
    metrics URL (ValueError when the file is not a cluster state)."""
    try:
        state = json.loads((root / "state.json").read_text())
        processes = list(state.get("processes") or [])
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{root / 'state.json'} is not a readable cluster state: {exc}") from None
    found: dict[str, Endpoint] = {}
    for record in processes:
        name = str((record or {}).get("name") or "")
        if not name.startswith(PLUGIN_PROCESS_PREFIX) or not _alive(record):
            continue
        url = _last_logged_url(Path(str(record.get("log_path") or "")))
        if url is not None:
            found[name.removeprefix(PLUGIN_PROCESS_PREFIX)] = url_endpoint(url)
    return found


def _alive(record: Mapping[str, Any]) -> bool:
    """Whether the recorded process still runs (same pid and start time, as the bed records
    them: field 22 of /proc/<pid>/stat), so a crashed plugin's old URL is not tried."""
    try:
        with open(f"/proc/{int(record.get('pid') or 0)}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return False
    ticks = record.get("start_ticks")
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # a zombie serves nothing
        return False
    return ticks is None or fields[19] == str(ticks)


def _last_logged_url(log: Path) -> str | None:
    try:
        with log.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - _LOG_TAIL_BYTES))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = _URL_IN_LOG.findall(text)
    return found[-1] if found else None
