"""The plugin's background queue: items in order, a full queue refuses without blocking, a
failing item does not stop the next, close stops the thread and refuses what comes after, and no
thread runs until the first item."""

from __future__ import annotations

import threading

from kubelet_plugin.background import Background


def test_items_are_handled_in_order_and_a_failing_one_does_not_stop_the_rest() -> None:
    seen: list[int] = []

    def handle(item: int) -> None:
        if item == 2:
            raise RuntimeError("an odd item")
        seen.append(item)

    work: Background[int] = Background(handle, name="test-order")
    try:
        assert all(work.submit(i) for i in range(5))
        work.flush()
        assert seen == [0, 1, 3, 4]
    finally:
        work.close()


def test_a_full_queue_refuses_at_once_and_close_refuses_afterwards() -> None:
    release = threading.Event()
    started = threading.Event()

    def handle(item: int) -> None:
        started.set()
        release.wait(10)

    work: Background[int] = Background(handle, name="test-full", max_queued=2)
    try:
        assert work.submit(0)
        assert started.wait(10)  # item 0 is being handled: the queue itself is empty
        assert work.submit(1) and work.submit(2)
        assert not work.submit(3)  # full: refused without blocking
    finally:
        release.set()
        work.close()
    assert not work.submit(4)


def test_no_thread_runs_before_the_first_item_or_after_close() -> None:
    names = {t.name for t in threading.enumerate()}
    work: Background[int] = Background(lambda item: None, name="test-lazy")
    assert "test-lazy" not in {t.name for t in threading.enumerate()} - names
    work.submit(1)
    assert "test-lazy" in {t.name for t in threading.enumerate()}
    work.close()
    assert "test-lazy" not in {t.name for t in threading.enumerate()}
