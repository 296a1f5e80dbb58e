"""The main thread hears SIGTERM even when the kernel hands it to another thread.

A child process waits for its stop event the way the plugin and the controller do; a second
thread sends SIGTERM to itself (`pthread_kill`, the delivery the kernel may choose for a
process-directed signal when the main thread is busy). With `wait_for_stop` the handler runs and
the child exits at once; with a bare `Event.wait()` it never does (shown too, so the test proves
the mechanism it guards against).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import logging, os, signal, sys, threading
    from dra_driver.lifecycle import stop_on_signals, wait_for_stop
    stop = threading.Event()
    stop_on_signals(stop, logging.getLogger("t"))
    started = threading.Event()

    def main_thread_asleep() -> bool:
        # /proc/self/task/<main tid>/stat: "pid (comm) S ..."; the main thread's tid is the pid.
        with open(f"/proc/self/task/{os.getpid()}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "S"

    def other() -> None:
        started.set()
        while not main_thread_asleep():  # in the lock of the wait below, not between bytecodes
            threading.Event().wait(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        threading.Event().wait()  # stays alive, as the plugin's loops do

    threading.Thread(target=other, daemon=True).start()
    started.wait()
    if sys.argv[1] == "bare":
        stop.wait()
    else:
        wait_for_stop(stop)
    print("stopped", flush=True)
    """
)


def run(mode: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_sigterm_taken_by_another_thread_stops_the_main_thread() -> None:
    done = run("timed", timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stopped\n"


def test_a_bare_event_wait_misses_it() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run("bare", timeout=3)
