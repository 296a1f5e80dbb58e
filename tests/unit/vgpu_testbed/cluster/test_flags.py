"""Component command lines, feature gates and port choice of the test bed.

What this proves:
1. The feature-gate string is sorted, identical for every component, contains exactly the
   gates we set, and refuses locked gates and malformed names.
2. Ports are distinct, a pinned apiserver port is used as given, a taken port is refused with a
   message naming the port.
3. Every component binds 127.0.0.1 only, the controller-manager never runs node-lifecycle,
   and the scheduler and controller-manager carry the same gates as the apiserver.
4. Client rate limits (--kube-api-qps/--kube-api-burst) are absent unless asked for, then reach
   both kube-scheduler and kube-controller-manager; a rate alone raises the burst with it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from vgpu_testbed.cluster import flags as cf


def test_gate_string_is_sorted_and_complete() -> None:
    flag = cf.feature_gate_flag()
    assert flag == (
        "DRAConsumableCapacity=true,DRADeviceTaintRules=true,DRADeviceTaints=true,"
        "DRAPartitionableDevices=true"
    )
    assert cf.feature_gate_flag({"B": False, "A": True}) == "A=true,B=false"


@pytest.mark.parametrize("locked", cf.LOCKED_ON)
def test_locked_gates_are_refused(locked: str) -> None:
    with pytest.raises(ValueError, match=f"{locked} is GA and locked"):
        cf.feature_gate_flag({locked: True})


@pytest.mark.parametrize("bad", ["", "dra", "DRA Foo", "DRA=x", "DRA,Foo"])
def test_malformed_gate_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a Go identifier"):
        cf.feature_gate_flag({bad: True})


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = cf.free_ports(20)
    assert len(set(ports)) == 20
    assert all(cf.port_is_free(p) for p in ports)
    assert cf.free_ports(0) == []
    with pytest.raises(ValueError):
        cf.free_ports(-1)


def test_allocate_ports_all_distinct() -> None:
    ports = cf.allocate_ports()
    assert len(set(ports.all().values())) == 5


def test_pinned_apiserver_port_is_used_or_refused() -> None:
    pinned = cf.free_ports(1)[0]
    ports = cf.allocate_ports(pinned)
    assert ports.apiserver == pinned
    assert pinned not in (ports.etcd_client, ports.etcd_peer, ports.scheduler)
    assert len(set(ports.all().values())) == 5
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert not cf.port_is_free(port)
        with pytest.raises(
            cf.PortInUseError, match=f"port {port} on 127\\.0\\.0\\.1 is already in use"
        ):
            cf.allocate_ports(port)
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        cf.allocate_ports(70000)


def _flags(argv: list[str]) -> dict[str, str]:
    out = {}
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        out[key] = value
    return out


def _all_argv(tmp_path: Path) -> dict[str, list[str]]:
    layout = cf.Layout(tmp_path)
    ports = cf.Ports(2001, 2002, 2003, 2004, 2005)
    pki = tmp_path / "pki"
    return {
        "etcd": cf.etcd_argv(Path("/b/etcd"), layout, ports),
        "apiserver": cf.apiserver_argv(
            Path("/b/kube-apiserver"),
            layout,
            ports,
            ca_cert=pki / "ca.crt",
            serving_cert=pki / "s.crt",
            serving_key=pki / "s.key",
            sa_key=pki / "sa.key",
            sa_pub=pki / "sa.pub",
        ),
        "scheduler": cf.scheduler_argv(Path("/b/kube-scheduler"), layout, ports),
        "kcm": cf.controller_manager_argv(
            Path("/b/kube-controller-manager"), layout, ports, ca_cert=pki / "ca.crt"
        ),
    }


def test_everything_binds_loopback_only(tmp_path: Path) -> None:
    argv = _all_argv(tmp_path)
    etcd = _flags(argv["etcd"])
    assert etcd["--listen-client-urls"] == "http://127.0.0.1:2001"
    assert etcd["--listen-peer-urls"] == "http://127.0.0.1:2002"
    for name in ("apiserver", "scheduler", "kcm"):
        assert _flags(argv[name])["--bind-address"] == "127.0.0.1", name
    api = _flags(argv["apiserver"])
    assert api["--secure-port"] == "2003"
    assert api["--etcd-servers"] == "http://127.0.0.1:2001"
    assert _flags(argv["scheduler"])["--secure-port"] == "2004"
    assert _flags(argv["kcm"])["--secure-port"] == "2005"


def test_gates_identical_on_all_kubernetes_components(tmp_path: Path) -> None:
    argv = _all_argv(tmp_path)
    gates = {
        name: _flags(argv[name])["--feature-gates"] for name in ("apiserver", "scheduler", "kcm")
    }
    assert len(set(gates.values())) == 1
    assert "DRAConsumableCapacity=true" in gates["apiserver"]


def test_apiserver_auth_and_service_accounts(tmp_path: Path) -> None:
    api = _flags(_all_argv(tmp_path)["apiserver"])
    assert api["--authorization-mode"] == "Node,RBAC"
    assert api["--enable-admission-plugins"] == "NodeRestriction"
    assert api["--token-auth-file"] == str(tmp_path / "pki" / "tokens.csv")
    assert api["--service-account-signing-key-file"].endswith("sa.key")
    assert api["--service-account-key-file"].endswith("sa.pub")
    assert api["--service-account-issuer"] == "https://127.0.0.1:2003"


def test_controller_manager_runs_claims_and_gc_but_not_node_lifecycle(tmp_path: Path) -> None:
    kcm = _flags(_all_argv(tmp_path)["kcm"])
    controllers = kcm["--controllers"].split(",")
    assert "resourceclaim-controller" in controllers
    assert "garbage-collector-controller" in controllers
    assert "serviceaccount-controller" in controllers
    assert not any("node-lifecycle" in c or c == "*" for c in controllers)
    assert kcm["--leader-elect"] == "false"
    assert kcm["--kubeconfig"] == str(
        tmp_path / "kubeconfigs" / "kube-controller-manager.kubeconfig"
    )


def test_client_limits_are_stock_unless_asked(tmp_path: Path) -> None:
    argv = _all_argv(tmp_path)
    for name in ("scheduler", "kcm"):
        assert "--kube-api-qps" not in _flags(argv[name]), name
        assert "--kube-api-burst" not in _flags(argv[name]), name


def test_client_limits_reach_scheduler_and_controller_manager(tmp_path: Path) -> None:
    layout = cf.Layout(tmp_path)
    ports = cf.Ports(2001, 2002, 2003, 2004, 2005)
    limits = cf.ClientLimits.of(1000)
    sched = cf.scheduler_argv(Path("/b/kube-scheduler"), layout, ports, limits=limits)
    kcm = cf.controller_manager_argv(
        Path("/b/kcm"), layout, ports, ca_cert=tmp_path / "ca.crt", limits=limits
    )
    for argv in (sched, kcm):
        flags = _flags(argv)
        assert flags["--kube-api-qps"] == "1000"
        assert flags["--kube-api-burst"] == "1000"  # qps alone raises the burst with it


def test_client_limits_burst_alone_and_validation() -> None:
    assert cf.ClientLimits.of(burst=500).flags() == ["--kube-api-burst=500"]
    assert cf.ClientLimits.of(100, 300).flags() == ["--kube-api-qps=100", "--kube-api-burst=300"]
    assert cf.ClientLimits.of().stock
    with pytest.raises(ValueError, match="client qps must be a positive integer, got 0"):
        cf.ClientLimits.of(0)
