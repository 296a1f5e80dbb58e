"""`vgpu-dra controller`: a real process that serves its probes and stops cleanly.

Proves: (1) started through the console-script dispatcher, the controller loads its kubeconfig,
serves /healthz (200) and /readyz (503 naming informers-synced while the API server is
unreachable) on the loopback address it was given, 404 elsewhere, and logs that the allocation
controller runs; (2) SIGTERM stops it with exit code 0; (3) unusable
credentials and a malformed --health-address fail at start with a message naming the flag;
(4) readiness follows the registered checks (503 naming the failing ones, also for a check that
raises) and reports shutting-down once stop began.
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from controller.probes import ProbeServer

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: not-a-secret}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class Lines:
    """Stderr of a child process, line by line, awaited with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stderr is not None
        threading.Thread(target=self._pump, args=(proc.stderr,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)

    def rest(self) -> str:
        """Everything logged so far, once the process has ended (its pipe closed)."""
        while True:
            try:
                self.seen.append(self._queue.get(timeout=2))
            except queue.Empty:
                return "".join(self.seen)

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.seen)}")


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


def start(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dra_driver.cli", "controller", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def controller(kubeconfig: Path) -> Iterator[tuple[subprocess.Popen[str], Lines]]:
    proc = start("--kubeconfig", str(kubeconfig), "--health-address", "127.0.0.1:0")
    try:
        yield proc, Lines(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_serves_probes_and_stops_on_sigterm(
    controller: tuple[subprocess.Popen[str], Lines],
) -> None:
    proc, lines = controller
    host, port = lines.wait_for(r"probes on http://([\d.]+):(\d+)").groups()
    assert host == "127.0.0.1"
    base = f"http://{host}:{port}"
    assert get(base + "/healthz") == (200, "ok\n")
    # The API server of this kubeconfig is unreachable: alive, but not ready (nothing listed).
    assert get(base + "/readyz") == (503, "not ready: informers-synced\n")
    assert get(base + "/metrics")[0] == 404  # nothing is advertised that does not exist
    lines.wait_for("allocation controller running")
    proc.send_signal(signal.SIGTERM)
    # Within a pod's default termination grace period (30 s). Usually under a second; one CI run
    # on a loaded machine took longer than 15 s, so on a timeout say what the process logged.
    try:
        assert proc.wait(timeout=30) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError(f"no exit 30 s after SIGTERM; it logged:\n{lines.rest()}") from None
    lines.wait_for("stopped")
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(base + "/healthz", timeout=2)


def test_unusable_credentials_fail_at_start(tmp_path: Path) -> None:
    proc = start("--kubeconfig", str(tmp_path / "absent"), "--health-address", "127.0.0.1:0")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "cannot load Kubernetes credentials (--kubeconfig" in err


def test_a_malformed_health_address_is_a_usage_error(kubeconfig: Path) -> None:
    proc = start("--kubeconfig", str(kubeconfig), "--health-address", "8081")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "--health-address: expected host:port" in err


def test_readiness_follows_the_checks() -> None:
    probes = ProbeServer(("127.0.0.1", 0))
    probes.start()
    state = {"synced": False}

    def broken() -> bool:
        raise RuntimeError("boom")

    try:
        base = f"http://127.0.0.1:{probes.address[1]}"
        probes.add_check("synced", lambda: state["synced"])
        assert get(base + "/readyz") == (503, "not ready: synced\n")
        assert get(base + "/healthz") == (200, "ok\n")  # alive while not ready
        state["synced"] = True
        assert get(base + "/readyz") == (200, "ok\n")
        probes.add_check("broken", broken)
        assert get(base + "/readyz") == (503, "not ready: broken\n")
    finally:
        probes.stop()
    assert probes.failing() == ["shutting-down"]


def test_liveness_fails_while_a_loop_is_stalled() -> None:
    """A stalled loop fails /healthz (the kubelet restarts the replica) and /readyz."""
    probes = ProbeServer(("127.0.0.1", 0))
    probes.start()
    stalled: list[str] = []
    try:
        base = f"http://127.0.0.1:{probes.address[1]}"
        probes.set_liveness(lambda: list(stalled))
        assert get(base + "/healthz") == (200, "ok\n")
        assert get(base + "/readyz") == (200, "ok\n")
        stalled.append("worker")
        assert get(base + "/healthz") == (503, "stalled: worker\n")
        assert get(base + "/readyz") == (503, "not ready: loops-progressing\n")
        stalled.clear()
        assert get(base + "/healthz") == (200, "ok\n")
    finally:
        probes.stop()
