"""Where the test bed's plugins serve metrics (vgpu_testbed.cluster.metrics_urls).

Proves: a cluster directory yields the last URL each live plugin process logged (a dead process,
a process that is not a plugin and a plugin without a URL give nothing); a broken state file is
a clear error; `vgpu-dra dev-cluster gpus` hands those URLs to the product's status, where the
explicit `--metrics-endpoint` still wins.
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

from dra_driver import status
from dra_driver.metrics_endpoints import Endpoint
from vgpu_testbed.cluster.metrics_urls import from_cluster_dir


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


def test_found_urls_are_explicit_endpoints_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, str | Endpoint] = {}

    def collect(client: Any, *, driver: str, endpoints: dict[str, str | Endpoint]) -> Any:
        seen.update(endpoints)
        raise status.kube.KubeError(0, "Stop", "enough")  # what main does next is not tested

    class Client:
        @staticmethod
        def from_kubeconfig(path: str | None) -> Any:
            return Client()

        def close(self) -> None:
            pass

    monkeypatch.setattr(status, "collect", collect)
    monkeypatch.setattr(status.kube, "KubeClient", Client)
    found = {"node-1": Endpoint("bed:1", str), "node-2": Endpoint("bed:2", str)}
    code = status.main(
        ["--no-discover", "--metrics-endpoint", "node-2=http://127.0.0.1:9/metrics"],
        endpoints=found,
    )
    assert code == 1  # the stand-in collect's error
    assert seen == {"node-1": found["node-1"], "node-2": "http://127.0.0.1:9/metrics"}
