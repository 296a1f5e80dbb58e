"""Supervised loops (dra_driver.supervision).

Proves:
1. A step that raises is logged with its traceback, counted and followed by a backoff; the loop
   goes on and the next steps run.
2. An expected exception (the API is down) backs off too, logged in one line and not counted.
3. A step that hangs past the loop's deadline makes `stalled()` name the loop, and the watchdog
   calls its handler once; a step that finishes clears it.
4. A loop whose thread ends before `stop` is stalled at once; one that ends on `stop` is not.
5. The collector exports both series per loop.
"""

from __future__ import annotations

import logging
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dra_driver.supervision import LoopCollector, Supervisor
from vgpu_testbed.polling import wait_for


def test_a_failing_step_is_counted_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor()
    stop = threading.Event()
    steps: list[int] = []

    def step() -> None:
        steps.append(1)
        if len(steps) == 2:
            raise ValueError("one odd object")
        if len(steps) == 4:
            raise ConnectionError("the API is away")

    with caplog.at_level(logging.WARNING):
        thread = supervisor.run(
            "odd", step, stop, period_s=0.001, deadline_s=60, expected=(ConnectionError,)
        )
        wait_for("six steps", lambda: len(steps) >= 6, timeout=10, interval=0.01)
        stop.set()
        thread.join(5)
    assert supervisor.failures() == {"odd": 1}  # the expected one is not a failure
    assert "Traceback" in caplog.text and "one odd object" in caplog.text
    assert "loop odd: the API is away" in caplog.text
    assert supervisor.stalled() == []


def test_a_hung_step_is_a_stall_and_the_watchdog_fires_once() -> None:
    now = [0.0]
    supervisor = Supervisor(clock=lambda: now[0])
    stop = threading.Event()
    entered, release = threading.Event(), threading.Event()

    def step() -> None:
        entered.set()
        release.wait(10)

    fired: list[list[str]] = []
    thread = supervisor.run("hangs", step, stop, period_s=0.001, deadline_s=30)
    supervisor.watchdog(stop, fired.append, period_s=0.01)
    try:
        assert entered.wait(10)
        assert supervisor.stalled() == [] and supervisor.healthy()
        now[0] = 31.0
        assert supervisor.stalled() == ["hangs"] and not supervisor.healthy()
        wait_for("the watchdog", lambda: fired == [["hangs"]], timeout=10, interval=0.01)
        release.set()
        wait_for("no stall", lambda: supervisor.stalled() == [], timeout=10, interval=0.01)
    finally:
        release.set()
        stop.set()
        thread.join(5)
    assert fired == [["hangs"]]


def test_an_early_end_is_a_stall_and_an_end_on_stop_is_not() -> None:
    supervisor = Supervisor()
    loop = supervisor.register("own-thread", deadline_s=60)
    assert supervisor.stalled() == []
    loop.ended = True
    assert supervisor.stalled() == ["own-thread"]

    stop = threading.Event()
    stop.set()
    other = Supervisor()
    other.run("stops", lambda: None, stop, period_s=0.01, deadline_s=60).join(5)
    assert other.stalled() == []


def test_the_collector_exports_failures_and_stalls() -> None:
    now = [0.0]
    supervisor = Supervisor(clock=lambda: now[0])
    quiet = supervisor.register("quiet", deadline_s=10)
    supervisor.register("busy", deadline_s=1000)
    quiet.step(lambda: 1 / 0)
    now[0] = 20.0
    registry = CollectorRegistry()
    registry.register(LoopCollector(supervisor))
    text = generate_latest(registry).decode()
    assert 'vgpu_dra_loop_failures_total{loop="quiet"} 1.0' in text
    assert 'vgpu_dra_loop_failures_total{loop="busy"} 0.0' in text
    assert 'vgpu_dra_loop_stalled{loop="quiet"} 1.0' in text
    assert 'vgpu_dra_loop_stalled{loop="busy"} 0.0' in text
