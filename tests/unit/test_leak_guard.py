"""The suite's guard against leaked threads and child processes (tests/conftest.py and
tests/fixtures/leaks.py) fails exactly the tests that leave something running.

A small suite in a temp dir uses the real autouse fixture; it runs in a pytest process of its own,
so its leaks (which the guard kills) never touch this session.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from tests.fixtures import leaks

REPO = Path(__file__).resolve().parents[2]

SUITE = """
import subprocess, threading
import pytest

stop = threading.Event()
parked: list[subprocess.Popen[bytes]] = []


@pytest.fixture(scope="session")
def session_helper():
    # Started by a session fixture before the test's own setup: never blamed on a test.
    worker = threading.Thread(target=stop.wait, name="session-worker", daemon=True)
    worker.start()
    yield
    stop.set()


def test_leaks_a_thread(session_helper):
    threading.Thread(target=threading.Event().wait, name="forgotten", daemon=True).start()


def test_leaks_a_child():
    parked.append(subprocess.Popen(["sleep", "60"]))


def test_cleans_up(session_helper):
    done = threading.Event()
    worker = threading.Thread(target=done.wait, name="joined")
    worker.start()
    child = subprocess.Popen(["sleep", "60"])
    done.set()
    worker.join()
    child.kill()
    child.wait()


def test_thread_ending_within_the_grace_period():
    threading.Timer(0.5, lambda: None).start()
"""


def test_the_guard_fails_only_the_leaking_tests(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import no_leaked_threads_or_processes  # noqa: F401\n"
    )
    (tmp_path / "test_suite.py").write_text(SUITE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "ERROR test_suite.py::test_leaks_a_thread" in out
    assert "the test leaked thread 'forgotten' (daemon)" in out
    assert "ERROR test_suite.py::test_leaks_a_child" in out
    assert "child process" in out and "(sleep)" in out
    assert "PASSED test_suite.py::test_cleans_up" in out
    assert "PASSED test_suite.py::test_thread_ending_within_the_grace_period" in out
    assert "session-worker" not in out


def test_a_snapshot_sees_new_threads_and_children_until_they_end() -> None:
    before = leaks.snapshot()
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="probe-thread")
    worker.start()
    child = subprocess.Popen(["sleep", "60"])
    try:
        threads, children = leaks.leaks(before, grace_s=0)
        assert [t.name for t in threads] == ["probe-thread"]
        assert {(c.pid, c.command) for c in children} == {(child.pid, "sleep")}
    finally:
        release.set()
        worker.join()
        child.kill()
        child.wait()
    assert leaks.leaks(before, grace_s=0) == ([], set())
