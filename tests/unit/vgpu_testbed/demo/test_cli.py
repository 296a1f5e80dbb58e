"""`vgpu-dra demo` without a cluster: options, the step runner, failure reporting, teardown
choices, manifests and programs (the tables and parsers are in test_report.py).

What this proves:
1. Defaults (temp dir, dgx-h100 + a10-pcie + a100-2x4, not kept, 90 s waits); bad --nodes and
   --wait-timeout are usage errors naming the value.
2. Steps run in order with numbered titles (the teardown is the last number); a failing step
   stops the run, and `main` reports the step's number, title and error (and the kept logs
   when the cluster itself failed to start) and exits 1.
3. Missing control-plane binaries are a clear error (`make controlplane`) that starts nothing.
3b. --runtime: auto (default) takes real nodes where the host allows them and otherwise says why
   it uses the stand-in; `real` on a host that cannot is a clear error that starts nothing.
4. Teardown: after a failure the logs are kept; with --keep it prints KUBECONFIG and how to stop.
5. Without root the workload step is skipped with an explanation instead of failing.
6. Manifests of a kind the demo cannot apply are refused, naming file and kind.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vgpu_testbed.demo import caps as demo_caps
from vgpu_testbed.demo import cli as demo
from vgpu_testbed.demo import steps as demo_steps
from vgpu_testbed.demo import workloads as demo_workloads

GIB = 1 << 30


# ---------------------------------------------------------------- 1-3. options and runner


def test_defaults() -> None:
    args = demo.build_parser().parse_args([])
    assert args.dir is None and args.keep is False
    assert args.nodes == ["dgx-h100", "a10-pcie", "a100-2x4"]
    assert args.wait_timeout == 90.0


def test_bad_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--nodes", "a b"]) == 2
    assert "not a valid label value" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_bad_wait_timeout(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--wait-timeout", value]) == 2
    assert f"'{value}'" in capsys.readouterr().err


def _ctx() -> demo.DemoContext:
    return demo.DemoContext(demo.build_parser().parse_args([]))


def test_steps_run_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []
    steps = [
        demo.Step("first", lambda c: seen.append("a")),
        demo.Step("second", lambda c: seen.append("b")),
    ]
    demo.run_steps(_ctx(), steps)
    out = capsys.readouterr().out
    assert seen == ["a", "b"]
    assert "[1/3] first" in out and "[2/3] second" in out
    assert out.count("done in") == 2


def _boom(ctx: demo.DemoContext) -> None:
    raise ValueError("claim template 'x' has no requests")


def test_failing_step_stops_the_run() -> None:
    seen: list[str] = []
    steps = [
        demo.Step("ok", lambda c: seen.append("ok")),
        demo.Step("breaks", _boom),
        demo.Step("never", lambda c: seen.append("never")),
    ]
    with pytest.raises(demo.StepFailedError) as caught:
        demo.run_steps(_ctx(), steps)
    assert seen == ["ok"]
    assert caught.value.number == 2 and caught.value.title == "breaks"
    assert isinstance(caught.value.error, ValueError)


def test_main_reports_the_failed_step(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "check_prerequisites", lambda args: "standin")
    monkeypatch.setattr(demo, "STEPS", [demo.Step("explode", _boom)])
    assert demo.main([]) == 1
    err = capsys.readouterr().err
    assert "step 1 (explode) failed: ValueError: claim template 'x' has no requests" in err


def test_failed_bring_up_points_to_the_kept_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def bring_up_fails(ctx: demo.DemoContext) -> None:
        ctx.root = tmp_path  # as step_bring_up does before Cluster.start
        (tmp_path / "logs").mkdir()
        raise RuntimeError("kube-apiserver exited with status 1")

    monkeypatch.setattr(demo, "check_prerequisites", lambda args: "standin")
    monkeypatch.setattr(demo, "STEPS", [demo.Step("bring up", bring_up_fails)])
    assert demo.main([]) == 1
    err = capsys.readouterr().err
    assert "step 1 (bring up) failed: RuntimeError: kube-apiserver exited" in err
    assert f"logs (kept): {tmp_path / 'logs'}/" in err


def test_missing_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VGPU_DRA_K8S_BIN", str(tmp_path / "none"))
    assert demo.main(["--dir", str(tmp_path / "c")]) == 1
    assert "make controlplane" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def _host_checks(monkeypatch: pytest.MonkeyPatch, problems: list[str]) -> None:
    """Everything check_prerequisites asks passes but the real-node host check."""
    from vgpu_testbed.cluster import chart
    from vgpu_testbed.realnode import host
    from vgpu_testbed.standin import node_agents

    monkeypatch.setattr(demo, "find_binaries", lambda where: None)
    monkeypatch.setattr(chart, "helm_path", lambda: Path("/usr/bin/helm"))
    monkeypatch.setattr(node_agents, "check_prerequisites", lambda root, nodes: None)
    monkeypatch.setattr(host, "check_host", lambda: problems)


def test_runtime_choice(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.build_parser().parse_args([]).runtime == "auto"
    _host_checks(monkeypatch, [])
    assert demo.check_prerequisites(demo.build_parser().parse_args([])) == "real"
    args = demo.build_parser().parse_args(["--runtime", "standin"])
    assert demo.check_prerequisites(args) == "standin"
    _host_checks(monkeypatch, ["not root (real nodes need namespaces, mounts and cgroups)"])
    assert demo.check_prerequisites(demo.build_parser().parse_args([])) == "standin"
    out = capsys.readouterr().out
    assert "real nodes not possible here (not root" in out and "using the kubelet stand-in" in out


def test_runtime_real_refused_where_impossible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _host_checks(monkeypatch, ["runc missing (apt-get install runc)"])
    monkeypatch.setattr(demo, "STEPS", [demo.Step("must not run", _boom)])
    assert demo.main(["--runtime", "real", "--dir", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert "--runtime real is not possible on this host: runc missing (apt-get install runc)" in err
    assert not (tmp_path / "c").exists()


# ---------------------------------------------------------------- 4. teardown


class _FakeCluster:
    """Records how the demo stops it (the real Cluster is exercised by the e2e test)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.kubeconfig = root / "kubeconfig"
        self.layout = SimpleNamespace(logs=root / "logs")
        self.stopped: list[bool] = []

    def stop(self, *, keep_logs: bool = False) -> list[Any]:
        self.stopped.append(keep_logs)
        return []


def _torn_down(root: Path, *, keep: bool, failed: bool) -> _FakeCluster:
    """The demo's tear-down run on a fake cluster under `root`; the cluster, to see what it did."""
    ctx = _ctx()
    cluster = _FakeCluster(root)
    ctx.cluster = cluster  # type: ignore[assignment]
    demo.tear_down(ctx, keep=keep, failed=failed)
    return cluster


def test_teardown_after_failure_keeps_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = _torn_down(tmp_path, keep=False, failed=True)
    assert cluster.stopped == [True]
    assert f"logs kept in {tmp_path / 'logs'}" in capsys.readouterr().out


def test_keep_prints_how_to_reach_and_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = _torn_down(tmp_path, keep=True, failed=False)
    out = capsys.readouterr().out
    assert cluster.stopped == []
    assert f"export KUBECONFIG={tmp_path / 'kubeconfig'}" in out
    assert f"vgpu-dra dev-cluster down --dir {tmp_path}" in out


# ---------------------------------------------------------------- 5. not root


def test_workloads_skipped_without_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo_caps.os, "geteuid", lambda: 1000)
    ctx = _ctx()
    demo_caps.step_workloads(ctx)  # no prepared pods needed: it returns before using them
    assert "SKIPPED" in capsys.readouterr().out
    assert ctx.results["workloads"] == "skipped"


# ---------------------------------------------------------------- 6. manifests, programs


class _RecordingClient:
    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.created.append((path, obj))
        return obj


def test_apply_manifest_paths_and_unknown_kind(tmp_path: Path) -> None:
    good = tmp_path / "ok.yaml"
    good.write_text(
        "kind: DeviceClass\nmetadata: {name: c}\n---\n"
        "kind: Pod\napiVersion: v1\nmetadata: {name: p}\n"
    )
    client = _RecordingClient()
    created = demo_steps.apply_manifest(client, good, "demo")  # type: ignore[arg-type]
    assert created == ["DeviceClass/c", "Pod/p"]
    assert [p for p, _ in client.created] == [
        "/apis/resource.k8s.io/v1/deviceclasses",
        "/api/v1/namespaces/demo/pods",
    ]
    assert demo_steps.example_pods(good) == ["p"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Deployment\nmetadata: {name: d}\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: kind 'Deployment' is not one"):
        demo_steps.apply_manifest(client, bad, "demo")  # type: ignore[arg-type]


def test_examples_each_have_one_pod() -> None:
    pods = [demo_steps.example_pods(m) for m in sorted(demo_steps.EXAMPLES_DIR.glob("*.yaml"))]
    assert all(len(p) == 1 for p in pods)
    flat = [p for (p,) in pods]
    assert demo_steps.SHARED_POD in flat and demo_steps.UNCAPPED_POD in flat


def test_missing_program_says_make_native(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo_workloads, "CUDA_PROGRAMS", tmp_path)
    with pytest.raises(demo_workloads.WorkloadError, match="make native"):
        demo_workloads.program("cuda_hold")


def test_workload_cli_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_workloads.main(["sample", "GPU-x"]) == 2
    assert "usage" in capsys.readouterr().err


def test_context_without_bring_up_is_a_clear_error() -> None:
    ctx = demo.DemoContext(argparse.Namespace())
    with pytest.raises(RuntimeError, match="bring-up step did not run"):
        ctx.need_client()
    with pytest.raises(RuntimeError, match="pod shared-gpu was not prepared"):
        ctx.need_prepared("shared-gpu")
