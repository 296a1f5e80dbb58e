"""Process lifecycle shared by the long-running commands (kubelet plugin, controller).

Both stop the same way: SIGTERM (what the kubelet sends a pod) or SIGINT sets one event that
the main thread waits on, so shutdown runs in the main thread, in order, instead of inside a
signal handler.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType


def stop_on_signals(stop: threading.Event, log: logging.Logger) -> None:
    """Set `stop` on SIGTERM or SIGINT (logged). Call from the main thread."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
