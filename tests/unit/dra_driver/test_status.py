"""`vgpu-dra status`, the pure part: slices + claims (+ live metrics) -> figures -> table/JSON.

The objects are the real shapes: slices from `dra_driver.slices.build_slices`, claims as the API
serves them after allocation (tests/integration/kubelet_plugin/claimdata). The command against a
real cluster is tested on the test bed (tests/e2e/kubelet_plugin/test_observability.py).
"""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import pytest

from dra_driver import slices
from dra_driver.status import ClaimShare, build_parser, build_status, render_json, render_table
from tests.fixtures.claimdata import claim, inventory, result

GIB = 1 << 30
MIB = 1 << 20


def node_slices(node: str = "node-1", generation: int = 1) -> list[dict[str, Any]]:
    out = slices.build_slices(
        inventory(count=2, memory=80 * GIB),
        driver="vgpu.dra.dev",
        node_name=node,
        node_uid="uid-" + node,
    )
    for obj in out:
        obj["spec"]["pool"]["generation"] = generation
    return out


def pods(obj: dict[str, Any], *names: str) -> dict[str, Any]:
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": n, "uid": n} for n in names]
    return obj


def sample_claims() -> list[dict[str, Any]]:
    return [
        pods(
            claim(
                [result("gpu-0", memory="10Gi", cores=30, share_id="a")],
                name="train",
                namespace="ml",
            ),
            "train-0",
        ),
        claim([result("gpu-0", memory="20Gi", cores=10, share_id="b")], name="infer"),
        claim([result("gpu-1")], name="whole"),  # nothing consumed explicitly: the whole GPU
        claim([result("gpu-1", driver="other.example.com")], name="foreign"),
    ]


def test_allocated_and_free_per_gpu() -> None:
    status = build_status(node_slices(), sample_claims())
    gpu0, gpu1 = status.gpus
    assert (gpu0.node, gpu0.device, gpu0.product) == ("node-1", "gpu-0", "NVIDIA H100 80GB HBM3")
    assert gpu0.memory_total == 80 * GIB
    assert gpu0.memory_allocated == 30 * GIB and gpu0.memory_free == 50 * GIB
    assert gpu0.cores_allocated == 40 and gpu0.cores_free == 60
    assert gpu0.claims == 2
    assert gpu1.memory_free == 0 and gpu1.claims == 1
    assert [c.claim for c in status.claims] == ["infer", "whole", "train"]
    train = status.claims[-1]
    assert train == ClaimShare("ml", "train", "node-1", "gpu-0", 10 * GIB, 30, ["train-0"])


def test_only_the_newest_pool_generation_counts() -> None:
    old = node_slices(generation=1)
    new = node_slices(generation=2)
    new[0]["spec"]["devices"] = new[0]["spec"]["devices"][:1]  # a GPU left in generation 2
    status = build_status(old + new, [])
    assert [g.device for g in status.gpus] == ["gpu-0"]


def test_live_figures_come_from_the_nodes_metrics() -> None:
    live = {
        "node-1": [
            ("vgpu_dra_gpu_memory_used_bytes", {"node": "node-1", "device": "gpu-0"}, 31 * GIB),
            ("vgpu_dra_gpu_utilization_ratio", {"node": "node-1", "device": "gpu-0"}, 1.7),
            (
                "vgpu_dra_claim_memory_used_bytes",
                {"namespace": "ml", "claim": "train", "device": "gpu-0"},
                300 * MIB,
            ),
            (
                "vgpu_dra_claim_utilization_ratio",
                {"namespace": "ml", "claim": "train", "device": "gpu-0"},
                0.28,
            ),
        ]
    }
    status = build_status(node_slices(), sample_claims(), live=live)
    gpu0 = status.gpus[0]
    assert gpu0.memory_used == 31 * GIB
    assert gpu0.utilization == 1.0  # clamped: a bad endpoint cannot show 170 %
    train = next(c for c in status.claims if c.claim == "train")
    assert (train.memory_used, train.utilization) == (300 * MIB, 0.28)
    assert status.gpus[1].memory_used is None  # no sample: shown as "-"
    assert status.live_nodes == ["node-1"]
    table = render_table(status)
    assert "300Mi" in table and "28%" in table


def test_table_layout() -> None:
    status = build_status(node_slices() + node_slices("node-2"), sample_claims())
    lines = render_table(status).splitlines()
    assert lines[0].split() == [
        "NODE", "GPU", "MEMORY", "ALLOCATED", "FREE", "CORES", "FREE", "CLAIMS", "USED", "UTIL"
    ]  # fmt: skip
    assert lines[1].split() == ["node-1", "gpu-0", "80Gi", "30Gi", "50Gi", "60%", "2", "-", "-"]
    assert lines[2].split()[:7] == ["node-1", "gpu-1", "80Gi", "80Gi", "0", "100%", "1"]
    assert lines[3].split()[:2] == ["node-2", "gpu-0"]
    claims_at = lines.index("") + 1
    assert lines[claims_at].split() == [
        "NAMESPACE", "CLAIM", "NODE", "GPU", "MEMORY", "CORES", "USED", "UTIL"
    ]  # fmt: skip
    assert lines[claims_at + 3].split() == [
        "ml", "train", "node-1", "gpu-0", "10Gi", "30%", "-", "-"
    ]  # fmt: skip
    # columns line up: every row of the GPU table starts its GPU column at the same offset
    offset = lines[0].index("GPU")
    assert all(line[offset : offset + 4] == "gpu-" for line in lines[1:4])
    assert "\033[" not in "\n".join(lines)


def test_wide_and_colour() -> None:
    status = build_status(node_slices(), sample_claims())
    wide = render_table(status, wide=True)
    assert "UUID" in wide and "GPU-00000000-1111-2222-3333-444444444444" in wide
    assert "train-0" in wide  # pods column
    coloured = render_table(status, colour=True)
    assert "\033[1mNODE" in coloured  # bold header
    assert "\033[31m0" in coloured  # a full GPU's free memory in red
    assert "\033[32m50Gi" in coloured


def test_json_document() -> None:
    status = build_status(node_slices(), sample_claims())
    document = json.loads(render_json(status))
    first = document["gpus"][0]
    assert first["memory_free"] == 50 * GIB and first["cores_free"] == 60
    assert {c["claim"] for c in document["claims"]} == {"train", "infer", "whole"}


def test_empty_cluster_says_so() -> None:
    text = render_table(build_status([], []))
    assert "No GPUs published by vgpu-dra." in text and "No allocated claims." in text


def test_metrics_endpoint_flag_is_checked() -> None:
    parser = build_parser()
    args = parser.parse_args(["--metrics-endpoint", "node-1=http://127.0.0.1:9402/metrics"])
    assert args.metrics_endpoint == [("node-1", "http://127.0.0.1:9402/metrics")]
    stderr = io.StringIO()
    with pytest.raises(SystemExit):
        import contextlib

        with contextlib.redirect_stderr(stderr):
            parser.parse_args(["--metrics-endpoint", "127.0.0.1:9402"])
    assert "expected NODE=URL" in stderr.getvalue()


def test_admin_access_is_not_counted() -> None:
    admin = claim([result("gpu-0")], name="monitor")
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    status = build_status(node_slices(), [copy.deepcopy(admin)])
    assert status.gpus[0].claims == 0 and status.claims == []
