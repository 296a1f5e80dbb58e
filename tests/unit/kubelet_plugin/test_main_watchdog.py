"""The plugin ends itself when a supervised loop stalls (kubelet_plugin.main.Watchdog).

What this proves:
1. a stall is logged at error level naming the loop and why, `stop` is set (main then shuts
   down as on SIGTERM), and the process exits with EXIT_STALLED (3) once main has finished;
2. a shutdown that hangs too is cut: the process exits STALL_EXIT_GRACE_S after the stall;
3. the real `vgpu-dra kubelet-plugin` process (main's wiring, a hand-made inventory and a GPU
   rescan that never returns) logs the stalled loop, removes its sockets and exits with status 3,
   so the kubelet restarts it.
No fixed sleeps: every wait is for a condition, with a deadline.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dra_driver.supervision import Supervisor
from kubelet_plugin.main import EXIT_STALLED, Watchdog
from vgpu_testbed.polling import wait_for

ROOT = Path(__file__).resolve().parents[3]


def test_a_stall_stops_the_plugin_and_exits_once_its_shutdown_is_done(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sup = Supervisor()
    sup.register("stuck", deadline_s=0.05)  # never beats
    sup.register("healthy", deadline_s=3600)
    exits: list[int] = []
    watchdog = Watchdog(sup, grace_s=60, period_s=0.01, exit_process=exits.append)
    stop = threading.Event()
    thread = watchdog.start(stop)
    try:
        assert stop.wait(30), "the watchdog never stopped the plugin"
        assert exits == []  # main is still shutting down
        assert watchdog.stalled == ["stuck"]
    finally:
        watchdog.finished()  # what main does at its very end
        thread.join(timeout=30)
    assert exits == [EXIT_STALLED]
    [record] = [r for r in caplog.records if "stopped making progress" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert "stuck (no step finished for" in record.getMessage()
    assert "deadline 0.05 s" in record.getMessage()
    assert "healthy" not in record.getMessage()


def test_a_shutdown_that_hangs_too_is_cut_after_the_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sup = Supervisor()
    loop = sup.register("ended-early", deadline_s=3600)
    loop.ended = True
    exits: list[int] = []
    watchdog = Watchdog(sup, grace_s=0.05, period_s=0.01, exit_process=exits.append)
    stop = threading.Event()
    thread = watchdog.start(stop)
    # main never calls finished(): the watchdog exits by itself
    wait_for("the exit after the grace", lambda: exits, interval=0.01)
    thread.join(timeout=30)
    assert exits == [EXIT_STALLED]
    assert "ended-early (its thread ended)" in caplog.text
    assert "did not finish within 0.05 s; exiting now" in caplog.text


def test_a_shutdown_on_sigterm_exits_normally() -> None:
    exits: list[int] = []
    watchdog = Watchdog(Supervisor(), period_s=0.01, exit_process=exits.append)
    stop = threading.Event()
    thread = watchdog.start(stop)
    stop.set()
    thread.join(timeout=30)
    watchdog.finished()
    assert exits == []


# The real main on a hand-made inventory whose GPU rescan never returns (its deadline shortened
# so that the test need not wait two minutes).
LAUNCHER = """
import sys, threading
from tests.fixtures.claimdata import inventory
import kubelet_plugin.main as main
from kubelet_plugin import monitoring
main._discover_function = lambda: (lambda: inventory(count=2))
never = threading.Event()
def rediscover():
    never.wait()
    raise AssertionError("unreachable")
main._rediscover_function = lambda _discovered: rediscover
monitoring.rescan_deadline = lambda period: 0.5
sys.exit(main.main(sys.argv[1:]))
"""

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: not-used}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_plugin_process_exits_3_when_a_loop_stalls(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    dra = tmp_path / "plugins" / "dra.sock"
    registration = tmp_path / "registry" / "vgpu.dra.dev-reg.sock"
    argv = [
        sys.executable,
        "-c",
        LAUNCHER,
        "--node-name=node-1",
        f"--kubeconfig={kubeconfig}",  # never contacted: no slices, events or prepares
        f"--plugin-dir={dra.parent}",
        f"--registrar-dir={registration.parent}",
        f"--cdi-root={tmp_path / 'cdi'}",
        f"--state-dir={tmp_path / 'state'}",
        f"--hook-path={tmp_path / 'libvgpu.so'}",
        "--no-nvidia-cdi",
        "--no-publish-slices",
        "--no-events",
        "--no-health",
        "--no-governor",
        "--no-enforcement",
        "--rescan-seconds=0.1",
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    log = done.stdout + done.stderr
    assert done.returncode == EXIT_STALLED, log[-3000:]
    assert "kubelet plugin for vgpu.dra.dev on node-1 is running" in log
    assert "supervised loop(s) stopped making progress: gpu-rescan (no step finished" in log
    assert "gRPC servers stopped; our sockets removed" in log
    assert not dra.exists() and not registration.exists()
