"""`vgpu-dra demo` without a cluster: options, the step runner, failure reporting, teardown
choices, and every table and parser the demo prints from (vgpu_testbed.demo.report).

What this proves:
1. Defaults (temp dir, dgx-h100 + a10-pcie, not kept, 90 s waits); bad --nodes and
   --wait-timeout are usage errors naming the value.
2. Steps run in order with numbered titles (the teardown is the last number); a failing step
   stops the run, and `main` reports the step's number, title and error (and the kept logs
   when the cluster itself failed to start) and exits 1.
3. Missing control-plane binaries are a clear error (`make controlplane`) that starts nothing.
4. Teardown: after a failure the logs are kept; with --keep it prints KUBECONFIG and how to stop.
5. Without root the workload step is skipped with an explanation instead of failing.
6. Tables: published devices sorted by node and index with `-` for absent attributes;
   placements joined from pod, claim and the stand-in's record; devices several pods share and
   what is left of them; vgpu.conf and CDI summaries.
7. Parsers: cuda_hold success/CUDA error/garbage, utilisation statistics after settling
   (none left is an error), cuda_spin's launch rate, a pending pod's reasons.
8. Manifests of a kind the demo cannot apply are refused, naming file and kind.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vgpu_testbed.demo import caps as demo_caps
from vgpu_testbed.demo import cli as demo
from vgpu_testbed.demo import report as demo_report
from vgpu_testbed.demo import steps as demo_steps
from vgpu_testbed.demo import workloads as demo_workloads

GIB = 1 << 30


# ---------------------------------------------------------------- 1-3. options and runner


def test_defaults() -> None:
    args = demo.build_parser().parse_args([])
    assert args.dir is None and args.keep is False
    assert args.nodes == ["dgx-h100", "a10-pcie"]
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
    monkeypatch.setattr(demo, "check_prerequisites", lambda args: None)
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

    monkeypatch.setattr(demo, "check_prerequisites", lambda args: None)
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


def test_teardown_after_failure_keeps_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = _ctx()
    cluster = _FakeCluster(tmp_path)
    ctx.cluster = cluster  # type: ignore[assignment]
    demo.tear_down(ctx, keep=False, failed=True)
    assert cluster.stopped == [True]
    assert f"logs kept in {tmp_path / 'logs'}" in capsys.readouterr().out


def test_keep_prints_how_to_reach_and_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = _ctx()
    cluster = _FakeCluster(tmp_path)
    ctx.cluster = cluster  # type: ignore[assignment]
    demo.tear_down(ctx, keep=True, failed=False)
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


# ---------------------------------------------------------------- 6. tables


def _device(name: str, **attrs: Any) -> dict[str, Any]:
    kinds = {bool: "bool", int: "int", str: "string"}
    return {
        "name": name,
        "attributes": {k: {kinds[type(v)]: v} for k, v in attrs.items()},
        "capacity": {"memory": {"value": "81559Mi"}, "cores": {"value": "100"}},
    }


def _slice(node: str, *devices: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"nodeName": node, "pool": {"name": node}, "devices": list(devices)}}


def test_device_rows_sorted_with_dashes() -> None:
    slices = [
        _slice("node-2", _device("gpu-0", productName="NVIDIA A10", numaNode=1)),
        _slice(
            "node-1",
            _device("gpu-10", productName="H100", numaNode=1, nvlinkDomain=0),
            _device(
                "gpu-2",
                productName="H100",
                numaNode=0,
                nvlinkDomain=0,
                **{"resource.kubernetes.io/pcieRoot": "pci0000:18"},
            ),
        ),
    ]
    rows = demo_report.device_rows(slices)
    assert [(r.node, r.device) for r in rows] == [
        ("node-1", "gpu-2"),
        ("node-1", "gpu-10"),
        ("node-2", "gpu-0"),
    ]
    assert rows[0].memory == 81559 << 20 and rows[0].cores == 100
    lines = demo_report.device_table(rows)
    assert lines[0].split() == [
        "NODE", "DEVICE", "PRODUCT", "MEMORY", "CORES", "NUMA", "NVLINK", "PCIE", "ROOT"
    ]  # fmt: skip
    assert lines[1].split() == ["node-1", "gpu-2", "H100", "79.6", "GiB", "100", "0", "0",
                                "pci0000:18"]  # fmt: skip
    assert lines[3].split()[-2:] == ["-", "-"]  # the A10: no NVLink domain, no PCIe root


def test_render_table_refuses_ragged_rows() -> None:
    with pytest.raises(ValueError, match="2 cells, the header has 3"):
        demo_report.render_table(["A", "B", "C"], [["1", "2"]])


@pytest.mark.parametrize(
    ("value", "text"),
    [(GIB, "1 GiB"), (81559 << 20, "79.6 GiB"), (768 << 20, "768 MiB"), (1000, "1000 B")],
)
def test_human_bytes(value: int, text: str) -> None:
    assert demo_report.human_bytes(value) == text


def test_placement_joins_pod_claim_and_record() -> None:
    pod = {"metadata": {"name": "nvlink-pair"}, "spec": {"nodeName": "node-1"}}
    claim = {
        "metadata": {"uid": "u-1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "device": "gpu-0",
                            "shareID": "9f0545c4-0000",
                            "consumedCapacity": {"memory": "81559Mi", "cores": "0"},
                        },
                        {"device": "gpu-1"},
                    ]
                }
            }
        },
    }
    record = {
        "claims": [
            {"uid": "other", "devices": [{"cdiDeviceIDs": ["x/y=z"]}]},
            {"uid": "u-1", "devices": [{"cdiDeviceIDs": ["k/c=a"]}, {"cdiDeviceIDs": ["k/c=b"]}]},
        ]
    }
    p = demo_report.placement(pod, claim, record)
    assert (p.pod, p.node, p.devices) == ("nvlink-pair", "node-1", ("gpu-0", "gpu-1"))
    assert p.memory == (81559 << 20, None) and p.cores == (0, None)
    assert p.cdi_ids == ("k/c=a", "k/c=b")
    (_, row) = demo_report.placement_table([p])
    assert "79.6 GiB + -" in row and "0 + -" in row and "9f0545c4…,-" in row
    assert row.split()[-1] == "2"


def test_shared_devices_and_what_is_left() -> None:
    def place(pod: str, node: str, device: str, memory: int, cores: int) -> Any:
        return demo_report.Placement(pod, node, (device,), (memory,), (cores,), ("s",), ())

    rows = [
        place("a10-only", "node-2", "gpu-0", 4 * GIB, 0),
        place("shared-gpu", "node-2", "gpu-0", GIB, 10),
        place("whole-gpu", "node-1", "gpu-0", 80 * GIB, 0),  # same name, other node
    ]
    assert demo_report.shared_devices(rows) == [
        "node-2/gpu-0 is shared by a10-only (4 GiB) and shared-gpu (1 GiB, 10 cores)"
    ]
    a10 = demo_report.DeviceRow("node-2", "gpu-0", "NVIDIA A10", 24 * GIB, 100, 0, None, None)
    assert demo_report.remaining_line(a10, rows) == (
        "node-2/gpu-0: 5 GiB and 10 cores allocated; 19 GiB and 90 cores left for other claims"
    )


def test_conf_devices_and_cdi_names() -> None:
    text = "version 1\nclaim u\ndevice uuid=GPU-1 memory=1073741824 cores=10 policy=fixed\n"
    assert demo_report.conf_devices(text) == [
        {"uuid": "GPU-1", "memory": "1073741824", "cores": "10", "policy": "fixed"}
    ]
    ids = ["k8s.vgpu.dra.dev/claim=u-gpu-2-s", "nvidia.com/gpu=2"]
    assert demo_report.cdi_device_names("k8s.vgpu.dra.dev/claim", ids) == ["u-gpu-2-s"]


def test_cdi_summary() -> None:
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "k8s.vgpu.dra.dev/claim",
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=GPU-1"],
            "mounts": [
                {"hostPath": "/h/hook.so", "containerPath": "/c/hook.so", "options": ["bind", "ro"]}
            ],
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
        },
        "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia2"}]}}],
    }
    assert demo_report.cdi_summary(spec) == [
        "kind k8s.vgpu.dra.dev/claim, cdiVersion 0.5.0",
        "env    NVIDIA_VISIBLE_DEVICES=GPU-1",
        "mount  /h/hook.so -> /c/hook.so (ro)",
        "device nodes /dev/nvidiactl, /dev/nvidia2",
    ]


# ---------------------------------------------------------------- 7. parsers


def test_parse_hold() -> None:
    assert demo_report.parse_hold("ready 805306368\n", 0) == demo_report.HoldResult(True, None)
    oom = demo_report.parse_hold(
        "error cuMemAlloc_v2(&p, (size_t)bytes) CUDA_ERROR_OUT_OF_MEMORY\n", 3
    )
    assert oom == demo_report.HoldResult(False, "CUDA_ERROR_OUT_OF_MEMORY")
    garbage = demo_report.parse_hold("Segmentation fault\n", 139)
    assert not garbage.ok and garbage.error is not None and "exit 139" in garbage.error


def test_util_stats_ignores_the_settling_period() -> None:
    samples = [(0.1, 60.0), (1.9, 40.0), (2.0, 11.0), (2.1, 9.0), (2.2, 10.0)]
    stats = demo_report.util_stats(samples, settle_s=2.0)
    assert stats == demo_report.UtilStats(mean=10.0, low=9.0, high=11.0, samples=3)
    with pytest.raises(ValueError, match=r"no utilisation samples after 5\.0s \(got 5\)"):
        demo_report.util_stats(samples, settle_s=5.0)


def test_spin_rate() -> None:
    assert demo_report.spin_rate("started\nlaunches=4000 seconds=8.000 gpu_ms=800.0\n") == 500.0
    assert demo_report.spin_rate("launches=x seconds=1") is None
    assert demo_report.spin_rate("launches=10 seconds=0") is None
    assert demo_report.spin_rate("error cuInit CUDA_ERROR_NO_DEVICE") is None


def test_pod_state_names_the_scheduler_reason() -> None:
    pod = {
        "spec": {},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "message": "0/1 nodes are available: 1 cannot allocate all claims.",
                }
            ],
        },
    }
    assert demo_report.pod_state(pod) == (
        "pod is on node (none), phase Pending; "
        "PodScheduled=False: 0/1 nodes are available: 1 cannot allocate all claims."
    )


# ---------------------------------------------------------------- 8. manifests, programs


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
