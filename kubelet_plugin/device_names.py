"""`<state-dir>/device-names.json`: the device name each GPU got when this node first saw it.

Why: device names are what claims, checkpoints and CDI specs refer to, so they must survive
restarts and hot-plug; NVML indices do not (`dra_driver.inventory.assign_names` explains the
rule). The kubelet plugin names every inventory through `DeviceNaming.assign` (at start-up and
after each rescan) before anything else sees it. Saved atomically and fsynced whenever a new GPU
is named; a first start (no file) names GPUs `gpu-<index>`, as earlier versions did, so prepared
claims stay valid across the upgrade.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from dra_driver.atomicfile import write_atomic
from dra_driver.gpu import NodeInventory
from dra_driver.inventory import assign_names

log = logging.getLogger(__name__)

FILE_NAME = "device-names.json"
VERSION = 1


class DeviceNaming:
    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, FILE_NAME)
        self._lock = threading.Lock()
        self._known = _load(self.path)

    def assign(self, inventory: NodeInventory) -> NodeInventory:
        """`inventory` with every GPU named; new names are saved before they are returned."""
        with self._lock:
            named, known = assign_names(inventory, self._known)
            if known != self._known:
                os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
                document = {"version": VERSION, "names": dict(sorted(known.items()))}
                write_atomic(self.path, json.dumps(document, indent=1).encode(), mode=0o600)
                for uuid in known.keys() - self._known.keys():
                    log.info("GPU %s is device %s", uuid, known[uuid])
                self._known = known
            return named


def _load(path: str) -> dict[str, str]:
    """The saved names; an unreadable file stops the plugin (renaming devices would orphan
    prepared claims), with a message saying what to do."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise DeviceNamingError(
            f"{path} is unreadable ({exc}); restore it, or delete it to name GPUs by their "
            "current NVML index (claims prepared on renamed GPUs then fail)"
        ) from exc
    names = document.get("names") if isinstance(document, dict) else None
    if not isinstance(names, dict) or document.get("version") != VERSION:
        raise DeviceNamingError(f"{path} is not a version {VERSION} device-name file")
    return {str(uuid): str(name) for uuid, name in names.items()}


class DeviceNamingError(Exception):
    """The device-name file cannot be used; the message says what to do."""
