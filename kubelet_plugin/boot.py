"""Which boot of the node the prepared claims belong to.

A reboot ends every container, and while the node was down a claim may have been deallocated and
allocated again under the same UID, so what the checkpoint says was prepared before a reboot must
not be trusted after it: the plugin forgets those claims at start-up and the kubelet, which asks
again for every claim after it restarts, has them prepared from the API's current allocation.
The kernel's boot ID (`/proc/sys/kernel/random/boot_id`, the same in every namespace and
container of the node) tells a reboot from a plugin restart; the boot the checkpoint belongs to
is kept beside it in `<state-dir>/boot-id`.
"""

from __future__ import annotations

import contextlib
import os

from dra_driver.atomicfile import write_atomic

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
RECORD_FILE = "boot-id"


def current_boot_id(path: str = BOOT_ID_PATH) -> str | None:
    """This boot's ID, or None where the kernel does not say (then every start trusts the
    checkpoint, as before boot IDs were recorded)."""
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


class BootRecord:
    """The boot ID the state dir's checkpoint belongs to."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, RECORD_FILE)

    def recorded(self) -> str | None:
        """None when no boot was recorded (a new state dir, or one from an older version)."""
        with contextlib.suppress(FileNotFoundError), open(self.path, encoding="ascii") as handle:
            return handle.read().strip() or None
        return None

    def store(self, boot_id: str) -> None:
        write_atomic(self.path, (boot_id + "\n").encode("ascii"), mode=0o640)
