"""A bounded queue drained by one daemon thread: plugin work that prepare must never wait for.

Why one module: the Events of failed prepares and the pod lookups behind the metrics' `container`
label both run off the prepare path and need the same rules: a submit that never blocks (an item
is dropped when the queue is full: these are advice, not state), a failing item that does not
stop the ones after it, `flush` for tests and shutdown, and a `close` that stops the thread. The
thread starts with the first item, so a plugin that never needs it runs none.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Background(Generic[T]):
    """Runs `handle(item)` for each submitted item, in order, on one daemon thread."""

    def __init__(self, handle: Callable[[T], None], *, name: str, max_queued: int = 1000) -> None:
        self._handle = handle
        self._name = name
        self._queue: queue.Queue[tuple[T] | None] = queue.Queue(max_queued)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, item: T) -> bool:
        """Queue `item`; False (nothing queued) when the queue is full or closed."""
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait((item,))
        except queue.Full:
            return False
        return True

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued item was handled, or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        """Stop taking items; the thread ends after what is queued (waited for up to 5 s)."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)  # blocks only while the queue is full: the thread is draining
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            entry = self._queue.get()
            try:
                if entry is None:
                    return
                self._handle(entry[0])
            except Exception:  # one odd item must not end the thread
                log.exception("%s: an item failed", self._name)
            finally:
                self._queue.task_done()
