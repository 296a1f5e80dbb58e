"""What `vgpu-dra demo` prints (vgpu_testbed.demo.report), checked against hand-made objects.

What this proves:
1. Tables: published devices sorted by node and index with `-` for absent attributes;
   placements joined from pod, claim and the stand-in's record; devices several pods share and
   what is left of them; vgpu.conf and CDI summaries.
   The policy step: one column per policy, how far each spread its pods, which node has
   several NVLink islands of a size.
2. Parsers: cuda_hold success/CUDA error/garbage, utilisation statistics after settling
   (none left is an error), cuda_spin's launch rate, a pending pod's reasons.
"""

from __future__ import annotations

from typing import Any

import pytest

from vgpu_testbed.demo import report as demo_report

GIB = 1 << 30


# ---------------------------------------------------------------- 1. tables


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


# ---------------------------------------------------------------- 2. parsers


def test_parse_hold() -> None:
    assert demo_report.parse_hold("ready 805306368\n", 0) == demo_report.HoldResult(True, None)
    oom = demo_report.parse_hold(
        "error cuMemAlloc_v2(&p, (size_t)bytes) CUDA_ERROR_OUT_OF_MEMORY\n", 3
    )
    assert oom == demo_report.HoldResult(False, "CUDA_ERROR_OUT_OF_MEMORY")
    assert oom.outcome == "CUDA_ERROR_OUT_OF_MEMORY"
    assert demo_report.HoldResult(True, None).outcome == "ok"
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


# ---------------------------------------------------------------- the policy step


def test_policy_table_has_a_column_per_policy() -> None:
    runs = {
        "binpack": {"p1": ("node-2", "gpu-0"), "p2": ("node-2", "gpu-0")},
        "spread": {"p1": ("node-3", "gpu-0"), "p2": ("node-1", "gpu-5")},
    }
    assert demo_report.policy_table(["p1", "p2", "p3"], runs) == [
        "POD  BINPACK       SPREAD",
        "p1   node-2/gpu-0  node-3/gpu-0",
        "p2   node-2/gpu-0  node-1/gpu-5",
        "p3   -             -",
    ]


def test_spread_summary_counts_gpus_and_nodes() -> None:
    same = {"p1": ("n", "gpu-0"), "p2": ("n", "gpu-0")}
    assert demo_report.spread_summary(same) == "2 pods on 1 GPU of 1 node"
    apart = {"p1": ("a", "gpu-0"), "p2": ("b", "gpu-0"), "p3": ("b", "gpu-1")}
    assert demo_report.spread_summary(apart) == "3 pods on 3 GPUs of 2 nodes"


def _row(node: str, device: str, nvlink: Any) -> demo_report.DeviceRow:
    return demo_report.DeviceRow(node, device, "GPU", None, None, 0, nvlink, None)


def test_island_node_needs_several_islands_of_the_size() -> None:
    one_domain = [_row("node-1", f"gpu-{i}", 0) for i in range(8)]
    no_link = [_row("node-2", f"gpu-{i}", None) for i in range(4)]
    two_islands = [_row("node-3", f"gpu-{i}", i // 4) for i in range(8)]
    pairs = [_row("node-4", f"gpu-{i}", i // 2) for i in range(8)]
    assert demo_report.island_node(one_domain + no_link + two_islands + pairs, 4) == "node-3"
    assert demo_report.island_node(one_domain + no_link + pairs, 4) is None
    assert demo_report.island_node(pairs, 2) == "node-4"
    assert demo_report.islands(two_islands, "node-3") == {
        0: ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        1: ["gpu-4", "gpu-5", "gpu-6", "gpu-7"],
    }
