"""Supervision of long-lived loops: a loop survives an unexpected exception or its process knows.

Why one module for both processes: the controller and the kubelet plugin each run a dozen
threads (informers, the worker, the leader elector, the governor, enforcement, the slice
publisher...). Before this module a loop that met an exception it did not expect ended its
thread in silence, and the process stayed Ready; a tenant's odd object could stop placement for
the whole cluster. Every loop now follows the same rules:

- **one step at a time**: a loop is a `step()` called again and again; an exception out of a
  step is logged with its traceback, counted (`failures[name]`, exported as
  `vgpu_dra_loop_failures_total` by each process's metrics) and followed by a capped
  exponential backoff, and the loop goes on. One bad object costs one step, not the loop.
- **progress is visible**: every finished step (failed or not) is a beat. A loop whose last beat
  is older than its deadline is *stalled* (a step hangs: a lock never released, a call with no
  timeout). `stalled()` names them; the controller's `/readyz` and its Lease renewal read it,
  so a stuck leader stops renewing and a standby takes over; the kubelet plugin's watchdog ends
  the process, so the kubelet restarts it.
- a loop ends normally only when `stop` is set (`run`/`drive` then mark it `finished`: no
  longer watched, so its last beat never ages into a stall); one that ends before (a
  BaseException, or a self-beating loop that marks itself `ended`) counts as stalled at once.
- a backoff longer than the loop's period is announced (`Loop.grace_s`) and added to the
  deadline: a loop that fails every step is a failing loop (counted), not a stuck one.

Nothing here knows Kubernetes. Both processes export the same two series through
`LoopCollector` (registered into each one's own registry): `vgpu_dra_loop_failures_total{loop}`
and `vgpu_dra_loop_stalled{loop}`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass
class Loop:
    """One supervised loop's progress, as its thread reports it."""

    name: str
    deadline_s: float  # a step longer than this (or no step for this long) is a stall
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    last_beat: float = field(default_factory=time.monotonic)
    ended: bool = False  # the thread returned before its stop was set (a stall)
    finished: bool = False  # the thread returned after its stop was set: no longer watched
    grace_s: float = 0.0  # how much longer than its period the loop waits now (a backoff)
    failures: int = 0  # steps that raised
    consecutive: int = 0  # failed steps since the last good one

    def beat(self, *, failed: bool = False) -> None:
        self.last_beat = self.clock()
        if failed:
            self.failures += 1
            self.consecutive += 1
        else:
            self.consecutive = 0

    def end(self, *, stopped: bool) -> None:
        """The loop's thread returns: `finished` when it was asked to stop (no longer watched),
        else `ended` (a stall at once)."""
        if stopped:
            self.finished = True
        else:
            self.ended = True

    def step(
        self,
        step: Callable[[], object],
        *,
        expected: tuple[type[Exception], ...] = (),
    ) -> bool:
        """Run one step of this loop: True when it finished, False when it raised. An
        `expected` exception (the API is unreachable) is logged in one line; any other one with
        its traceback, and counted as the loop's failure. Either way the step is a beat."""
        try:
            step()
        except expected as exc:
            self.beat()
            log.warning("loop %s: %s; going on after a backoff", self.name, exc)
            return False
        except Exception:
            self.beat(failed=True)
            log.exception(
                "loop %s: step failed (%d in a row, %d in all); going on after a backoff",
                self.name,
                self.consecutive,
                self.failures,
            )
            return False
        self.beat()
        return True


class Supervisor:
    """Runs steps in supervised threads and says which loops stopped making progress."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._loops: dict[str, Loop] = {}

    def register(self, name: str, deadline_s: float) -> Loop:
        """A loop that beats by itself (it runs its own thread and calls `Loop.beat`)."""
        loop = Loop(name, deadline_s, self._clock, last_beat=self._clock())
        with self._lock:
            self._loops[name] = loop
        return loop

    def run(
        self,
        name: str,
        step: Callable[[], object],
        stop: threading.Event,
        *,
        period_s: float,
        deadline_s: float,
        backoff_max_s: float = BACKOFF_MAX_S,
        expected: tuple[type[Exception], ...] = (),
    ) -> threading.Thread:
        """Call `step()` every `period_s` until `stop` is set, in a daemon thread named `name`.

        `deadline_s` bounds one step plus one period: longer without a beat is a stall.
        """
        loop = self.register(name, deadline_s)
        thread = threading.Thread(
            target=self.drive,
            args=(loop, step, stop),
            kwargs={"period_s": period_s, "backoff_max_s": backoff_max_s, "expected": expected},
            name=name,
            daemon=True,
        )
        thread.start()
        return thread

    def pace(
        self,
        name: str,
        tick: Callable[[], object],
        stop: threading.Event,
        *,
        period_s: Callable[[], float],
        deadline_s: float,
    ) -> None:
        """Run `tick` as the loop `name`, in the calling thread, at a steady pace until `stop`:
        each tick starts `period_s()` after the previous one started (at once if it took longer),
        so the tick's own time does not stretch the period. A tick that raises is followed by a
        full period (and the backoff of `drive`)."""
        loop = self.register(name, deadline_s)
        wait = period_s()

        def step() -> None:
            nonlocal wait
            started = self._clock()
            wait = period_s()
            tick()
            wait = max(0.0, period_s() - (self._clock() - started))

        self.drive(loop, step, stop, period_s=lambda: wait)

    def drive(
        self,
        loop: Loop,
        step: Callable[[], object],
        stop: threading.Event,
        *,
        period_s: float | Callable[[], float],
        backoff_max_s: float = BACKOFF_MAX_S,
        expected: tuple[type[Exception], ...] = (),
    ) -> None:
        """What `run` does, in the calling thread, for a registered `loop`.

        For a loop that must set something up in its own thread first (an NVML session) and
        registers once it is there. `period_s` may be a function, asked after each step for
        the wait before the next (a loop whose pace changes); it must not raise.
        """
        period = period_s if callable(period_s) else (lambda: period_s)
        backoff = BACKOFF_START_S
        try:
            while not stop.is_set():
                done = loop.step(step, expected=expected)
                normal = period()
                if done:
                    backoff = BACKOFF_START_S
                    wait = normal
                else:
                    wait = max(normal, backoff)
                    backoff = min(backoff * 2, backoff_max_s)
                loop.grace_s = wait - normal  # waiting out a backoff is not a stall
                if stop.wait(wait):
                    break
        finally:
            # Only an early end is a stall; a loop stopped on request is no longer watched.
            loop.end(stopped=stop.is_set())

    def loops(self) -> list[Loop]:
        with self._lock:
            return list(self._loops.values())

    def failures(self) -> dict[str, int]:
        """Failed steps by loop name, since the start (a counter)."""
        return {loop.name: loop.failures for loop in self.loops()}

    def stalled(self) -> list[str]:
        """Names of the loops that stopped making progress (ended early, or no beat in time)."""
        now = self._clock()
        return [
            loop.name
            for loop in self.loops()
            if not loop.finished
            and (loop.ended or now - loop.last_beat > loop.deadline_s + loop.grace_s)
        ]

    def healthy(self) -> bool:
        return not self.stalled()

    def watchdog(
        self,
        stop: threading.Event,
        on_stall: Callable[[list[str]], None],
        *,
        period_s: float = 1.0,
    ) -> threading.Thread:
        """Call `on_stall(names)` (once) from a daemon thread when any loop stalls."""

        def body() -> None:
            while not stop.wait(period_s):
                names = self.stalled()
                if names:
                    on_stall(names)
                    return

        thread = threading.Thread(target=body, name="watchdog", daemon=True)
        thread.start()
        return thread


class LoopCollector(Collector):
    """Scrape-time metrics of a Supervisor's loops (one series per loop and name)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "vgpu_dra_loop_failures",
            "Steps of a long-lived loop that raised an unexpected exception (logged with its "
            "traceback; the loop went on after a backoff).",
            labels=["loop"],
        )
        stalled = GaugeMetricFamily(
            "vgpu_dra_loop_stalled",
            "1 while a long-lived loop makes no progress (no step finished within its deadline, "
            "or its thread ended): the process reports itself unhealthy.",
            labels=["loop"],
        )
        stuck = set(self._supervisor.stalled())
        for loop in self._supervisor.loops():
            failures.add_metric([loop.name], loop.failures)
            stalled.add_metric([loop.name], 1.0 if loop.name in stuck else 0.0)
        yield failures
        yield stalled
