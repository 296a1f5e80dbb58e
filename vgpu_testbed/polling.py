"""Await a condition instead of sleeping a fixed time: poll until a function returns something
truthy, and fail with what was awaited when it does not come in time.

One home for the demo's waits and the tests' (which import it from here): a condition that never
comes is a TimeoutError naming it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str, fn: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2
) -> T:
    """The first truthy value of `fn()`; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
