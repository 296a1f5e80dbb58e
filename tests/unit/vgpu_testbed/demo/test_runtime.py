"""What the demo does differently on real nodes, without a node (the e2e demo test runs them).

What this proves:
1. Example pods get the bed's workload image (never pulled), a `sleep` command the demo can exec
   into and a short grace period; the manifest's own dict is left as it was. The shared pod,
   given the torch environment, also gets its read-only mounts and LD_LIBRARY_PATH.
2. The kubelet's DRA checkpoint (`{"Data": "<JSON>", "Checksum"}`, as kubelet v1.37 writes it)
   yields a claim's CDI device IDs in order, ours and the toolkit's; an unknown claim is None.
3. A pod's containerd container ID comes from its ready container's status; a pod without a
   running container is a clear error.
4. `nvml-query`'s output (product names with spaces) parses to the NVML view step 5 prints;
   output without a count is an error quoting it.
5. Programs run in the pod's container through `ctr tasks exec` inside the node's namespaces,
   each exec with its own ID and its FIFOs under the node's run dir; a program waiting for a
   line on stdin gets one (ctr never passes end-of-file on).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from vgpu_testbed.demo import runtime
from vgpu_testbed.realnode.node import RealNode

CLAIM = "fffca2f2-9c1c-47a2-8c99-7fb9224439d6"
OURS = f"k8s.vgpu.dra.dev/claim={CLAIM}-gpu-0-2270afd8"
TOOLKIT = "nvidia.com/gpu=GPU-705f2ad2-141f-58ce-adc7-16315358b4a0"


def test_real_pod() -> None:
    doc: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {"name": "shared-gpu"},
        "spec": {
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "args": ["x"]}]
        },
    }
    pod = runtime.real_pod(doc)
    container = pod["spec"]["containers"][0]
    assert container["image"] == runtime.WORKLOAD and container["imagePullPolicy"] == "Never"
    assert container["command"] == ["sleep", "3600"] and "args" not in container
    assert pod["spec"]["terminationGracePeriodSeconds"] == 1
    assert doc["spec"]["containers"][0]["image"] == "registry.k8s.io/pause:3.10"
    assert "volumes" not in pod["spec"] and "volumeMounts" not in container


def test_real_pod_with_torch() -> None:
    """The shared pod's container also gets the torch environment's mounts and environment."""
    from vgpu_testbed.torchapp import TorchApp

    env = Path("/cache/torch/env")
    app = TorchApp(
        python=env / "bin" / "python",
        venv=env,
        directories=(env, Path("/opt/py")),
        files=(),
        site_packages=env / "lib" / "python3.11" / "site-packages",
        dynload=Path("/opt/py/lib/python3.11/lib-dynload"),
        cudart=Path("/repo/libcudart.so.13"),
    )
    doc: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {"name": "shared-gpu"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    pod = runtime.real_pod(doc, app)
    container = pod["spec"]["containers"][0]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["torch-0", "torch-1", "torch-cudart"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == [
        "/cache/torch/env",
        "/opt/py",
        "/usr/local/cuda/lib64/libcudart.so.13",
    ]
    assert {"name": "LD_LIBRARY_PATH", "value": "/usr/local/cuda/lib64"} in container["env"]
    assert "volumes" not in doc["spec"]  # the manifest itself is left alone


def _checkpoint() -> str:
    data = {
        "kind": "DRACheckpoint",
        "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
        "ClaimInfoStateList": [
            {"ClaimUID": "other", "DriverState": {"vgpu.dra.dev": {"Devices": []}}},
            {
                "ClaimUID": CLAIM,
                "ClaimName": "nvlink-pair-gpus-z8tfz",
                "Namespace": "default",
                "PodUIDs": {"601bce41": {}},
                "DriverState": {
                    "vgpu.dra.dev": {
                        "Devices": [
                            {"PoolName": "node-1", "DeviceName": "gpu-0",
                             "CDIDeviceIDs": [OURS, TOOLKIT]},
                            {"PoolName": "node-1", "DeviceName": "gpu-1",
                             "CDIDeviceIDs": [OURS + "x"]},
                        ]
                    }
                },
            },
        ],
    }  # fmt: skip
    return json.dumps({"Data": json.dumps(data), "Checksum": 1234})


def test_kubelet_cdi_ids() -> None:
    assert runtime.kubelet_cdi_ids(_checkpoint(), CLAIM) == [OURS, TOOLKIT, OURS + "x"]
    assert runtime.kubelet_cdi_ids(_checkpoint(), "other") == []
    assert runtime.kubelet_cdi_ids(_checkpoint(), "unknown") is None


def test_container_id() -> None:
    cid = "d49247525c1be89a3d569437dadd7345bbd92cb5dd9a567ee8d339cc472eb96e"
    pod = {"status": {"containerStatuses": [{"ready": True, "containerID": f"containerd://{cid}"}]}}
    assert runtime.container_id(pod) == cid
    waiting = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"ready": False}]}}
    with pytest.raises(RuntimeError, match="pod p has no running containerd container"):
        runtime.container_id(waiting)


def test_parse_nvml_query() -> None:
    out = (
        "hook=mapped\ncount=2\n"
        "gpu 0 uuid=GPU-a name=NVIDIA H100 80GB HBM3 total=1073741824 used=0 free=1073741824\n"
        "gpu 1 uuid=GPU-b name=NVIDIA A10 total=5 used=2 free=3\n"
    )
    view = runtime.parse_nvml_query(out)
    assert view["count"] == 2
    assert view["gpus"][0] == {
        "index": 0,
        "uuid": "GPU-a",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total": 1 << 30,
        "memory_used": 0,
    }
    assert view["gpus"][1]["name"] == "NVIDIA A10" and view["gpus"][1]["memory_used"] == 2
    with pytest.raises(RuntimeError, match="printed no count: 'error=3'"):
        runtime.parse_nvml_query("error=3\n")


def test_pod_container_exec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = SimpleNamespace(
        pid1=4242,
        ctr_bin=tmp_path / "bin",
        layout=SimpleNamespace(run_dir=tmp_path / "run", containerd_socket=tmp_path / "c.sock"),
        enter=lambda argv: ["nsenter", "--target=4242", "--", *argv],
    )
    (tmp_path / "run").mkdir()
    container = runtime.PodContainer(cast(RealNode, node), "abc123")
    assert container.program("cuda_hold") == "/usr/local/bin/cuda-hold"
    first, second = container.command(["nvml-query"]), container.command(["nvml-query"])
    assert first[:3] == ["nsenter", "--target=4242", "--"]
    assert first[3:9] == [str(tmp_path / "bin" / "ctr"), "--address", str(tmp_path / "c.sock"),
                          "--namespace", "k8s.io", "tasks"]  # fmt: skip
    assert first[first.index("--fifo-dir") + 1] == str(tmp_path / "run" / "demo-fifo")
    assert first[-2:] == ["abc123", "nvml-query"]
    exec_ids = {cmd[cmd.index("--exec-id") + 1] for cmd in (first, second)}
    assert len(exec_ids) == 2
    seen: dict[str, Any] = {}

    def fake_run(argv: list[str], **kwargs: Any) -> Any:
        seen.update(kwargs, argv=argv)
        return SimpleNamespace(returncode=0, stdout="count=0\n", stderr="")

    monkeypatch.setattr(runtime.subprocess, "run", fake_run)
    assert container.nvml() == {"count": 0, "gpus": []}
    assert seen["input"] == "\n" and seen["argv"][-1] == "nvml-query"
