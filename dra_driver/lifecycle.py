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


# How often the main thread wakes while it waits for `stop` (the longest a signal can wait).
SIGNAL_POLL_S = 0.5


def wait_for_stop(stop: threading.Event) -> None:
    """Block the main thread until `stop` is set, waking every SIGNAL_POLL_S.

    Why not `stop.wait()`: Python runs signal handlers only in the main thread, between
    bytecodes. When the kernel delivers SIGTERM to another thread (any thread that does not
    block it may get it), the main thread, blocked without a timeout in the lock inside
    `Event.wait()`, is never interrupted and never runs the handler: the process ignores the
    kubelet's SIGTERM until it is killed. Seen in CI: a controller logged nothing for 30 s after
    SIGTERM. A timed wait returns to the interpreter, which then runs the pending handler.
    """
    while not stop.wait(SIGNAL_POLL_S):
        pass
