"""Process records of the test bed: start in an own group, find again, stop for certain.

What this proves:
1. A spawned process leads its own session and process group, and its record says it is alive.
2. stop_all ends the whole group — including a helper that ignores SIGTERM (killed after the
   grace period) — and leaves no zombie in the starter.
3. A record whose PID was reused by another process (different start time) is "not alive" and
   stop_all never signals it.
4. A die-with-parent child started from a short-lived thread outlives that thread, and dies
   when its process is SIGKILLed.
5. State files round-trip, are 0600, and a missing or corrupt one is a clear StateError.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vgpu_testbed import procs
from vgpu_testbed.cluster import state as cluster_state


def test_spawn_and_stop_group(tmp_path: Path) -> None:
    record, popen = procs.spawn(
        "sleeper", ["sh", "-c", "sleep 300 & sleep 300; wait"], log_path=tmp_path / "s.log"
    )
    assert procs.is_alive(record)
    assert os.getpgid(record.pid) == record.pid == os.getsid(record.pid)
    assert procs.stop_all([record], popens={record.pid: popen}) == []
    assert not procs.is_alive(record)
    assert popen.returncode is not None  # reaped


def test_sigterm_ignoring_process_is_killed(tmp_path: Path) -> None:
    record, popen = procs.spawn(
        "stubborn",
        ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"],
        log_path=tmp_path / "t.log",
    )
    deadline = time.monotonic() + 5
    while "ready" not in (tmp_path / "t.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    assert procs.stop_all([record], popens={record.pid: popen}, grace_seconds=0.5) == []
    assert time.monotonic() - started < 5
    assert popen.returncode == -9


def test_reused_pid_is_not_ours(tmp_path: Path) -> None:
    record, popen = procs.spawn("s", ["sleep", "300"], log_path=tmp_path / "l.log")
    try:
        impostor = record.model_copy(update={"start_ticks": record.start_ticks + 1})
        assert not procs.is_alive(impostor)
        assert procs.stop_all([impostor], grace_seconds=0.1) == []
        assert procs.is_alive(record)  # untouched
    finally:
        procs.stop_all([record], popens={record.pid: popen})


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="cannot start ghost"):
        procs.spawn("ghost", [str(tmp_path / "nope")], log_path=tmp_path / "g.log")


def test_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert procs.log_tail(log, 3) == "line 97\nline 98\nline 99"
    assert procs.log_tail(tmp_path / "absent") == "(no log file)"


def test_state_round_trip_and_errors(tmp_path: Path) -> None:
    state = cluster_state.ClusterState(k8s_version="v1.37.1", root=str(tmp_path))
    state.nodes.append(cluster_state.NodeRecord(name="node-1", profile="t4", kubeconfig="/k"))
    path = tmp_path / "state.json"
    cluster_state.save(state, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = cluster_state.load(path)
    assert loaded == state
    assert loaded.profile_of("node-1") == "t4"
    with pytest.raises(KeyError, match="node-9"):
        loaded.profile_of("node-9")
    path.write_text('{"version": 2}')
    with pytest.raises(cluster_state.StateError, match="not a valid cluster state"):
        cluster_state.load(path)
    with pytest.raises(cluster_state.StateError, match="dev-cluster up"):
        cluster_state.load(tmp_path / "nothing.json")


def test_die_with_parent_child_outlives_the_thread_that_started_it(tmp_path: Path) -> None:
    # PR_SET_PDEATHSIG is per forking *thread*: started from a short-lived thread, the child
    # must still run after that thread ended (it dies only with the process).
    started: list[tuple[procs.ProcessRecord, subprocess.Popen[bytes]]] = []
    worker = threading.Thread(
        target=lambda: started.append(
            procs.spawn(
                "child", ["sleep", "300"], log_path=tmp_path / "c.log", die_with_parent=True
            )
        )
    )
    worker.start()
    worker.join()
    record, popen = started[0]
    try:
        time.sleep(0.3)
        assert procs.is_alive(record)
    finally:
        procs.stop_all([record], popens={record.pid: popen})


def test_die_with_parent_child_dies_with_its_process(tmp_path: Path) -> None:
    script = (
        "import sys, threading; from pathlib import Path; from vgpu_testbed import procs\n"
        "out = []\n"
        "t = threading.Thread(target=lambda: out.append(procs.spawn('c', ['sleep', '300'],"
        " log_path=Path(sys.argv[1]), die_with_parent=True)))\n"
        "t.start(); t.join(); print(out[0][0].model_dump_json(), flush=True); sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "c.log")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    record = procs.ProcessRecord.model_validate_json(parent.stdout.readline())
    assert procs.is_alive(record)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while procs.is_alive(record) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.is_alive(record)
