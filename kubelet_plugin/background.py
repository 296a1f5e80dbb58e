"""A bounded queue drained by one daemon thread: plugin work that prepare must never wait for.

Why one module: the Events of failed prepares, the Events of node-side enforcement and the pod
lookups behind the metrics' `container` label all run off the hot paths and need the same rules:
a submit that never blocks (an item is dropped when the queue is full: these are advice, not
state), a failing item that does not stop the ones after it, `flush` for tests and shutdown, and
a `close` that stops the thread. The thread starts with the first item, so a plugin that never
needs it runs none.

Supervision (`dra_driver.supervision`): the thread is a loop of its `supervisor`, named after the
queue, registered when it starts. Every handled item is a beat (a failing one is logged with its
traceback and counted), and an idle thread beats every `IDLE_BEAT_S`; an item that takes longer
than `deadline_s` (a call with no timeout) is a stall, and so is a thread that ends before
`close`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from dra_driver.supervision import Loop, Supervisor

log = logging.getLogger(__name__)

T = TypeVar("T")

IDLE_BEAT_S = 5.0
# An item is at most two API calls (an Event patch that finds the Event expired, then a create)
# at the client's 30 s timeout each: 90 s without a finished item is a call that does not return.
DEADLINE_S = 90.0


class Background(Generic[T]):
    """Runs `handle(item)` for each submitted item, in order, on one daemon thread."""

    def __init__(
        self,
        handle: Callable[[T], None],
        *,
        name: str,
        max_queued: int = 1000,
        supervisor: Supervisor | None = None,
        deadline_s: float = DEADLINE_S,
    ) -> None:
        self._handle = handle
        self._name = name
        self._queue: queue.Queue[tuple[T] | None] = queue.Queue(max_queued)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._supervisor = supervisor or Supervisor()
        self._deadline_s = deadline_s

    def submit(self, item: T) -> bool:
        """Queue `item`; False (nothing queued) when the queue is full or closed."""
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                loop = self._supervisor.register(self._name, self._deadline_s)
                self._thread = threading.Thread(
                    target=self._run, args=(loop,), name=self._name, daemon=True
                )
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

    def _run(self, loop: Loop) -> None:
        try:
            while True:
                try:
                    entry = self._queue.get(timeout=IDLE_BEAT_S)
                except queue.Empty:
                    loop.beat()  # idle is not stuck
                    continue
                try:
                    if entry is None:
                        return
                    self._handle(entry[0])
                except Exception:  # one odd item must not end the thread
                    loop.beat(failed=True)
                    log.exception("%s: an item failed (%d in all)", self._name, loop.failures)
                else:
                    loop.beat()
                finally:
                    self._queue.task_done()
        finally:
            # Only `close` ends the thread normally; anything else (a BaseException) is a stall.
            loop.end(stopped=self._closed)
