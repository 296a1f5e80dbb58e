"""Where `vgpu-dra status` finds each node's plugin metrics without flags
(`dra_driver.metrics_endpoints`, `dra_driver.status.discover`).

Proves: a test-bed cluster directory yields the last URL each live plugin process logged (a
dead process, a process that is not a plugin and a plugin without a URL give nothing; a broken
state file is a clear error); the kubeconfig's own directory is taken as the cluster directory
when it is one; the port of a plugin pod comes from its `metrics` container port, else from its
env, else it serves no metrics; explicit endpoints override discovered ones.
(The API-server path runs in tests/e2e/kubelet_plugin/test_observability.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.metrics_endpoints import from_cluster_dir, metrics_port
from dra_driver.status import _cluster_dir, discover


def ticks(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[19])


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A live process standing for a running plugin."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def write_state(root: Path, processes: list[dict[str, Any]]) -> None:
    (root / "state.json").write_text(json.dumps({"version": 1, "processes": processes}))
    (root / "kubeconfig").write_text("")


def record(root: Path, name: str, pid: int, *log_lines: str) -> dict[str, Any]:
    log = root / f"{name}.log"
    log.write_text("".join(line + "\n" for line in log_lines))
    return {"name": name, "pid": pid, "start_ticks": ticks(pid), "log_path": str(log)}


def test_cluster_dir_yields_each_live_plugins_last_url(tmp_path: Path, sleeper: int) -> None:
    me = os.getpid()
    dead = record(tmp_path, "kubelet-plugin-node-3", sleeper, "metrics_url=http://127.0.0.1:3/m")
    dead["start_ticks"] += 1  # the pid was reused by another process: not the plugin
    write_state(
        tmp_path,
        [
            record(
                tmp_path,
                "kubelet-plugin-node-1",
                sleeper,
                "level=info msg=metrics metrics_url=http://127.0.0.1:1000/metrics",
                "level=info msg=restarted metrics_url=http://127.0.0.1:1001/metrics",
            ),
            record(tmp_path, "kubelet-plugin-node-2", me, "level=info msg=no metrics"),
            record(tmp_path, "kube-apiserver", me, "metrics_url=http://127.0.0.1:2/metrics"),
            dead,
        ],
    )
    found = from_cluster_dir(tmp_path)
    assert {node: e.where for node, e in found.items()} == {
        "node-1": "http://127.0.0.1:1001/metrics"
    }


def test_a_broken_state_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable cluster state"):
        from_cluster_dir(tmp_path)


def test_the_kubeconfigs_directory_is_the_cluster_dir_when_it_is_one(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")
    assert _cluster_dir(None, str(kubeconfig)) is None  # no state.json beside it
    write_state(tmp_path, [])
    assert _cluster_dir(None, str(kubeconfig)) == tmp_path.resolve()
    assert _cluster_dir(Path("/elsewhere"), str(kubeconfig)) == Path("/elsewhere")
    assert _cluster_dir(None, None) is None


def pod(ports: list[dict[str, Any]], env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "kubelet-plugin", "ports": ports, "env": env}]}}


def test_metrics_port_of_a_plugin_pod() -> None:
    env = [{"name": "VGPU_DRA_METRICS_ADDRESS", "value": "0.0.0.0:9464"}]
    assert metrics_port(pod([], env)) == 9464
    assert metrics_port(pod([{"name": "metrics", "containerPort": 9000}], env)) == 9000
    assert metrics_port(pod([{"name": "health", "containerPort": 51515}], [])) is None
    assert metrics_port(pod([], [{"name": "VGPU_DRA_METRICS_ADDRESS", "value": "junk"}])) is None


def test_explicit_endpoints_override_discovered_ones(tmp_path: Path, sleeper: int) -> None:
    write_state(
        tmp_path,
        [
            record(tmp_path, "kubelet-plugin-node-1", sleeper, "metrics_url=http://127.0.0.1:1/m"),
            record(tmp_path, "kubelet-plugin-node-2", sleeper, "metrics_url=http://127.0.0.1:2/m"),
        ],
    )
    found, warnings = discover(
        None,  # type: ignore[arg-type]  # not asked: a cluster directory is given
        driver="vgpu.dra.dev",
        cluster_dir=tmp_path,
        explicit={"node-2": "http://127.0.0.1:9/metrics"},
    )
    assert not warnings
    assert found["node-2"] == "http://127.0.0.1:9/metrics"
    assert not isinstance(found["node-1"], str) and found["node-1"].where.endswith(":1/m")
