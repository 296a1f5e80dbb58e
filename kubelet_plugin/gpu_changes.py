"""Did this node's GPUs change? The in-process check that decides when a rediscovery child runs.

Why: NVML enumerates GPUs once per process, so only a fresh process sees a hot-plugged GPU
(`kubelet_plugin.rediscover`). Starting one every rescan period cost ~70 ms of CPU per child,
whether or not anything had changed (issue 32). A running plugin can tell most changes without
forking:
- NVML answers of the GPUs its own session enumerated: a GPU removed or fallen off the bus stops
  answering (GPU_IS_LOST), one that comes back answers again (a few NVML calls);
- the kernel driver's list of the GPUs it has bound, `/proc/driver/nvidia/gpus/<PCI bus ID>`
  (procfs shows the host's driver inside a container too): a GPU hot-added or unbound changes
  it, which the plugin's NVML session never shows (one `listdir`).

`ChangeCheck.due()` reads both every rescan period (`--rescan-seconds`, well under a
millisecond) and says why a rediscovery is due, or None. It is due at the first check unless a
`baseline()` was taken before start-up's own discovery, after a failed rediscovery (until one
succeeds), when
either answer differs from the last check's (taken before the child runs, so a change during
the child is seen at the next check), when neither can be read (no signal: every period, as
before), and, where the kernel's list cannot be read (the simulated GPUs of the test bed, a node
whose /proc hides the driver), every `full_rescan_s`: there, a GPU that the plugin's session
never enumerated (added after start) is seen only by a fresh process. Used by the loop
`gpu-rescan` (`kubelet_plugin.monitoring`): one instance per loop, called from its thread only
once started; `kubelet_plugin.main` creates it, takes the baseline and closes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.nvml import Nvml, NvmlError

log = logging.getLogger(__name__)

KERNEL_GPUS = "/proc/driver/nvidia/gpus"
FULL_RESCAN_S = 30.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a running process sees of the node's GPUs (None: that source cannot be read)."""

    nvml: tuple[str, ...] | None  # per index of the session's enumeration: UUID or `!<code>`
    kernel: tuple[str, ...] | None  # entries of the kernel driver's GPU list, sorted


class ChangeCheck:
    """Whether a rediscovery is due (see the module docstring)."""

    def __init__(
        self,
        nvml: Nvml | None,
        *,
        kernel_dir: str = KERNEL_GPUS,
        full_rescan_s: float = FULL_RESCAN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._open = False
        self._kernel_dir = kernel_dir
        self._full_rescan_s = full_rescan_s
        self._clock = clock
        self._last: Snapshot | None = None
        self._pending = True  # no baseline yet, or a rediscovery that failed
        self._last_full = clock()
        self._close_lock = threading.Lock()

    def baseline(self) -> None:
        """Take the first look now, before the caller's own discovery: a change after it is seen
        by the first check, an earlier one is in that discovery (no rediscovery is due then)."""
        self._last = self._snapshot()
        self._pending = False

    def due(self) -> str | None:
        """Why a rediscovery is due now, or None when nothing changed."""
        seen = self._snapshot()
        last, self._last = self._last, seen
        if last is None:
            return "first check"
        if self._pending:
            return "the last rediscovery failed"
        if seen.nvml is None and seen.kernel is None:
            return "no cheap signal (NVML and the kernel's GPU list unreadable)"
        if seen.nvml != last.nvml:
            return "NVML answers changed"
        if seen.kernel != last.kernel:
            return "the kernel driver's GPU list changed"
        if seen.kernel is None and self._clock() - self._last_full >= self._full_rescan_s:
            return f"periodic ({self._full_rescan_s:g} s: no kernel GPU list to see additions)"
        return None

    def done(self, *, ok: bool) -> None:
        """A rediscovery ran; a failed one is due again at the next check."""
        self._pending = not ok
        if ok:
            self._last_full = self._clock()

    def close(self) -> None:
        """End the NVML session (idempotent; its creator calls it)."""
        with self._close_lock:
            if self._nvml is not None and self._open:
                with contextlib.suppress(NvmlError):
                    self._nvml.shutdown()
                self._open = False

    def _snapshot(self) -> Snapshot:
        return Snapshot(nvml=self._nvml_answers(), kernel=self._kernel_list())

    def _nvml_answers(self) -> tuple[str, ...] | None:
        if self._nvml is None:
            return None
        try:
            if not self._open:
                self._nvml.init()
                self._open = True
            count = self._nvml.device_count()
        except NvmlError as exc:
            log.debug("GPU change check: NVML unusable: %s", exc)
            return None
        answers = []
        for index in range(count):
            try:
                answers.append(self._nvml.uuid(self._nvml.device_by_index(index)))
            except NvmlError as exc:  # removed or lost: no longer answering
                answers.append(f"!{exc.code}")
        return tuple(answers)

    def _kernel_list(self) -> tuple[str, ...] | None:
        try:
            return tuple(sorted(os.listdir(self._kernel_dir)))
        except OSError:
            return None
