"""Where an admission's time goes, phase by phase (`--webhook-phase-timing`, off by default).

Why: the webhook's own work is ~0.3 ms, yet under a burst of pod creations its p99 was tens of
ms (docs/webhook.md, Performance). To tell work from waiting, each admission's connection thread
stamps the end of each phase (headers, body, decode, translate, ensure, review, encode, write),
and compares its wall time with what the kernel says the thread did meanwhile: time on a CPU
(the thread's CPU clock) and time runnable but waiting for one (`/proc/thread-self/schedstat`,
whose wait total is current whenever the thread itself reads it, since it is running). What is
neither was spent asleep: in this code, waiting for the GIL (the socket reads find the request
already arrived; the template ensure, the one network call, is its own phase).
The fields join the admission's log line. Off by default: reading schedstat twice costs about
0.05 ms per admission.
"""

from __future__ import annotations

import os
import threading
import time

_local = threading.local()
_SCHEDSTAT = "/proc/thread-self/schedstat"


def _cpu_and_queue() -> tuple[int, int]:
    """(ns this thread ran on a CPU, ns it was runnable but waited for one). The CPU time comes
    from the thread's clock: schedstat's own CPU total only advances at scheduler events."""
    ran = time.thread_time_ns()
    try:
        fd = os.open(_SCHEDSTAT, os.O_RDONLY)
    except OSError:  # not Linux, or /proc not mounted: the queue time is unknown
        return ran, 0
    try:
        waited = os.read(fd, 128).split()[1]
    finally:
        os.close(fd)
    return ran, int(waited)


class Phases:
    """The phase stamps of one admission, from its request line's arrival."""

    __slots__ = ("_marks", "_sched", "_started", "in_flight", "threads", "tls_ms")

    def __init__(self, in_flight: int, tls_ms: float | None) -> None:
        self._started = time.perf_counter()
        self._sched = _cpu_and_queue()
        self._marks: list[tuple[str, float]] = []
        self.in_flight = in_flight  # admissions in this process, this one included
        self.threads = threading.active_count()
        self.tls_ms = tls_ms  # the handshake, on a connection's first request only

    def mark(self, phase: str) -> None:
        self._marks.append((phase, time.perf_counter()))

    def fields(self) -> dict[str, float | int]:
        """Log fields: `phase_<name>_ms` per phase, and the wall time until now (`total_ms`: the
        phases and what followed the last, e.g. the histogram's update) split into `cpu_ms` (on a
        CPU), `runq_ms` (runnable, no CPU free) and `asleep_ms` (the GIL, or the ensure's I/O)."""
        ran, waited = _cpu_and_queue()
        now = time.perf_counter()  # the split and the total cover the same interval
        out: dict[str, float | int] = {}
        previous = self._started
        for phase, at in self._marks:
            out[f"phase_{phase}_ms"] = round((at - previous) * 1e3, 3)
            previous = at
        wall = now - self._started
        cpu = (ran - self._sched[0]) / 1e9
        runq = (waited - self._sched[1]) / 1e9
        out["total_ms"] = round(wall * 1e3, 3)
        out["cpu_ms"] = round(cpu * 1e3, 3)
        out["runq_ms"] = round(runq * 1e3, 3)
        out["asleep_ms"] = round(max(0.0, wall - cpu - runq) * 1e3, 3)
        out["in_flight"] = self.in_flight
        out["threads"] = self.threads
        if self.tls_ms is not None:
            out["tls_ms"] = self.tls_ms
        return out


def begin(phases: Phases | None) -> None:
    """Make `phases` the current admission's record in this thread (None: not timing)."""
    _local.phases = phases


def current() -> Phases | None:
    return getattr(_local, "phases", None)


def mark(phase: str) -> None:
    """Stamp the end of `phase` of this thread's admission, if it is being timed."""
    phases = getattr(_local, "phases", None)
    if phases is not None:
        phases.mark(phase)
