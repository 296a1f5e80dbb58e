"""`vgpu-dra dev-cluster` argument parsing, status rendering and error reporting (no cluster).

What this proves:
1. Defaults: `.dev-cluster` directory, nodes dgx-h100,a10-pcie, no pinned port.
2. Bad --nodes and --apiserver-port values are usage errors (exit 2) naming the value.
3. Without binaries `up` fails (exit 1) telling to run `make controlplane`, and creates nothing;
   a taken --apiserver-port fails naming the port, before anything starts;
   `down`/`status` on a directory without a cluster fail with a clear message.
4. The status table names each component's pid, port and health and each node's profile.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from vgpu_testbed.cluster import cli as cluster_cli
from vgpu_testbed.cluster.control_plane import ClusterStatus, ComponentStatus, NodeStatus


def test_defaults() -> None:
    args = cluster_cli.parse_args(["up"])
    assert args.dir == Path(".dev-cluster")
    assert args.nodes == ["dgx-h100", "a10-pcie"]
    assert args.apiserver_port is None
    assert args.client_qps is None and args.client_burst is None


def test_nodes_and_port_are_parsed() -> None:
    args = cluster_cli.parse_args(
        ["up", "--nodes", "dgx-h100, t4 ,a10-pcie", "--dir", "/tmp/c", "--apiserver-port", "6443"]
    )
    assert args.nodes == ["dgx-h100", "t4", "a10-pcie"]
    assert args.dir == Path("/tmp/c")
    assert args.apiserver_port == 6443


def test_client_limits_are_parsed() -> None:
    args = cluster_cli.parse_args(["up", "--client-qps", "1000", "--client-burst", "2000"])
    assert (args.client_qps, args.client_burst) == (1000, 2000)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["up", "--nodes", ""], "comma-separated"),
        (["up", "--nodes", "a,,b"], "comma-separated"),
        (["up", "--nodes", "bad/name"], "'bad/name' is not a valid label value"),
        (["up", "--apiserver-port", "http"], "not a port number: 'http'"),
        (["up", "--apiserver-port", "0"], "port must be 1..65535"),
        (["up", "--client-qps", "0"], "must be >= 1, got 0"),
        (["up", "--client-burst", "lots"], "not an integer: 'lots'"),
        (["launch"], "invalid choice: 'launch'"),
        ([], "required"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster_cli.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_up_without_binaries_says_how_to_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VGPU_DRA_K8S_BIN", str(tmp_path / "nothing-here"))
    target = tmp_path / "cluster"
    assert cluster_cli.main(["up", "--dir", str(target)]) == 1
    err = capsys.readouterr().err
    assert "make controlplane" in err and "kube-apiserver" in err
    assert not target.exists()


@pytest.mark.parametrize("command", ["down", "status", "env"])
def test_commands_on_an_empty_directory_explain(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cluster_cli.main([command, "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no cluster state" in err and "dev-cluster up" in err


def test_status_rendering() -> None:
    status = ClusterStatus(
        root=Path("/c"),
        server="https://127.0.0.1:4000",
        components=[
            ComponentStatus("etcd", 11, True, 4001, True, "ok"),
            ComponentStatus("kube-apiserver", 12, False, 4000, False, "not running"),
            ComponentStatus("plugin-node-1", 13, True, None, None, "running"),
        ],
        nodes=[
            NodeStatus("node-1", "dgx-h100", True, True),
            NodeStatus("node-2", "t4", False, False),
        ],
    )
    text = cluster_cli.render_status(status)
    assert "etcd" in text and "pid 11" in text and "port 4001" in text and "healthy" in text
    assert "DEAD" in text and "UNHEALTHY" in text
    assert "node-1" in text and "dgx-h100" in text and "Ready" in text and "MISSING" in text
    assert text.endswith("overall: NOT healthy")
    assert not status.healthy


def test_up_on_a_taken_port_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Stand-in binaries: the port check comes before anything is started.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
    monkeypatch.setenv("VGPU_DRA_K8S_BIN", str(bin_dir))
    target = tmp_path / "cluster"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cluster_cli.main(["up", "--dir", str(target), "--apiserver-port", str(port)])
    assert code == 1
    assert f"port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err
    assert not target.exists()
