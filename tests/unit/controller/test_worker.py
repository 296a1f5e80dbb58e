"""The worker: routing and supervision.

Proves:
1. Events go to the rescheduler (never into the allocator's model), claims awaiting a binding
   condition wake the confirmer, and the Events informer is apart from the ones allocation waits
   for (a controller without the right to watch Events still allocates).
2. An object that breaks a parser is skipped with a log line, and the worker takes the next one.
3. A part of a pass (reconciler, confirmer, rescheduler) that raises what nobody expected is
   counted and logged under its name; the other parts and the next passes run (before, the
   exception ended the worker thread while the replica stayed Ready).
4. A pass that hangs makes the worker stalled (the probes and the elector read that).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from controller.confirmer import CONFIRMED
from controller.reconciler import Defaults, Reconciler
from controller.rescheduler import Rescheduler
from controller.worker import WORKER_DEADLINE_S, Worker
from dra_driver.supervision import Supervisor
from vgpu_testbed.polling import wait_for


class NoApi:
    """Nothing here may reach the API: a call is recorded (the worker would swallow a raise)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        raise AssertionError(f"unexpected API call {name}")


def test_events_claims_and_informers_are_routed_apart() -> None:
    api = NoApi()
    reconciler = Reconciler(api, Defaults({}))  # type: ignore[arg-type]
    rescheduler = Rescheduler(api, ["vgpu.dra.dev"], may_write=lambda: False)  # type: ignore[arg-type]
    worker = Worker(api, reconciler, rescheduler)  # type: ignore[arg-type]
    assert worker.warnings is not None and worker.warnings not in worker.informers
    event = {
        "metadata": {"name": "e", "namespace": "t", "uid": "ev"},
        "reason": "PrepareOverbooked",
        "involvedObject": {"kind": "Pod", "namespace": "t", "name": "p", "uid": "pod-uid"},
    }
    worker._apply("Event", "apply", event)
    assert rescheduler.next_due() is not None
    pending = {
        "metadata": {"name": "c", "namespace": "t", "uid": "c"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "driver": "vgpu.dra.dev",
                            "pool": "n",
                            "device": "gpu-0",
                            "bindingConditions": [CONFIRMED],
                        }
                    ]
                }
            }
        },
    }
    assert not worker.confirmer.dirty
    worker._apply("ResourceClaim", "apply", pending)
    assert worker.confirmer.dirty
    assert ("t", "c") in reconciler.claims
    without = Worker(api, Reconciler(api, Defaults({})))  # type: ignore[arg-type]
    assert without.warnings is None
    before = dict(without.reconciler.claims)
    without._apply("Event", "apply", event)  # dropped: no rescheduler
    assert without.reconciler.claims == before and without.reconciler.pods == {}
    assert api.calls == []


def test_an_object_that_breaks_a_parser_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    api = NoApi()
    worker = Worker(api, Reconciler(api, Defaults({})))  # type: ignore[arg-type]
    hostile = {
        "metadata": {"name": "x", "uid": "x"},
        "spec": {
            "driver": "other.example.com",
            "pool": {"name": "p"},
            "nodeName": "n",
            "devices": [{"name": "d", "capacity": {"mem": {"value": "9223372036854775807"}}}],
        },
    }
    with caplog.at_level(logging.WARNING):
        worker._apply("ResourceSlice", "apply", hostile)
        worker._apply("Pod", "apply", "not an object")  # type: ignore[arg-type]
    assert "ResourceSlice None/x skipped" in caplog.text and "2^48" in caplog.text
    assert "cannot take Pod" in caplog.text
    assert worker.reconciler.model.devices == {}
    assert api.calls == []


def _running(worker: Worker) -> tuple[threading.Event, threading.Thread]:
    """The worker's own thread only (no informers: they would reach for the API)."""
    for informer in worker.informers:
        informer.synced.set()
    stop = threading.Event()
    thread = threading.Thread(target=worker._run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


@pytest.mark.parametrize("part", ["reconciler", "confirmer", "rescheduler"])
def test_a_part_that_raises_is_counted_and_the_others_and_next_passes_run(
    caplog: pytest.LogCaptureFixture, part: str
) -> None:
    """Each part of a pass (the reconciler, the confirmer, the rescheduler) that raises once is
    logged with its traceback and counted under its own name; the other parts run in the same
    pass and every part in the next ones."""
    api = NoApi()
    reconciler = Reconciler(api, Defaults({}))  # type: ignore[arg-type]
    rescheduler = Rescheduler(api, ["vgpu.dra.dev"], may_write=lambda: False)  # type: ignore[arg-type]
    supervisor = Supervisor()
    worker = Worker(api, reconciler, rescheduler, supervisor=supervisor)  # type: ignore[arg-type]
    calls: dict[str, int] = {"reconciler": 0, "confirmer": 0, "rescheduler": 0}

    def counted(name: str) -> Callable[[], None]:
        def run() -> None:
            calls[name] += 1
            if name == part and calls[name] == 1:
                raise RuntimeError(f"a bug met by the {name}")

        return run

    reconciler.reconcile = counted("reconciler")  # type: ignore[method-assign]
    worker.confirmer.run = counted("confirmer")  # type: ignore[method-assign]
    # The worker took the rescheduler's bound method when it was built.
    worker._parts = [
        (loop, counted("rescheduler") if loop.name == "rescheduler" else run)
        for loop, run in worker._parts
    ]
    with caplog.at_level(logging.ERROR):
        stop, thread = _running(worker)
        try:
            wait_for("three passes", lambda: min(calls.values()) >= 3, timeout=10, interval=0.01)
        finally:
            stop.set()
            thread.join(5)
    assert supervisor.failures()[part] == 1
    assert sum(supervisor.failures().values()) == 1
    assert f"a bug met by the {part}" in caplog.text  # with its traceback
    assert supervisor.stalled() == []
    assert not thread.is_alive()


def test_a_hung_pass_makes_the_worker_stalled() -> None:
    api = NoApi()
    reconciler = Reconciler(api, Defaults({}))  # type: ignore[arg-type]
    now = [1000.0]
    supervisor = Supervisor(clock=lambda: now[0])
    worker = Worker(api, reconciler, supervisor=supervisor)  # type: ignore[arg-type]
    entered, release = threading.Event(), threading.Event()

    def reconcile() -> None:
        entered.set()
        release.wait(10)

    reconciler.reconcile = reconcile  # type: ignore[method-assign]
    stop, thread = _running(worker)
    try:
        assert entered.wait(10)
        assert supervisor.stalled() == []
        now[0] += WORKER_DEADLINE_S + 1
        assert supervisor.stalled() == ["worker"]
        release.set()
        wait_for(
            "the worker beating again",
            lambda: supervisor.stalled() == [],
            timeout=10,
            interval=0.01,
        )  # it beats again after the pass
    finally:
        release.set()
        stop.set()
        thread.join(5)
