"""CDI spec rendering, file naming, control device discovery and the NVIDIA toolkit lookup."""

from __future__ import annotations

import json
from pathlib import Path

from dra_driver import cdi

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
KIND = "k8s.vgpu.dra.dev/claim"


def settings(gid: int = 0) -> cdi.SpecSettings:
    return cdi.SpecSettings(
        kind=KIND, state_dir="/var/lib/vgpu-dra", hook_path="/opt/vgpu/libvgpu.so", claim_gid=gid
    )


def test_spec_follows_the_contract() -> None:
    spec = cdi.build_claim_spec(
        settings=settings(gid=2000),
        claim_uid=UID,
        devices=[cdi.ClaimDevice(f"{UID}-gpu-3", 3), cdi.ClaimDevice(f"{UID}-gpu-5", 5)],
    )
    assert spec["cdiVersion"] == "0.7.0"
    assert spec["kind"] == KIND
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-3", f"{UID}-gpu-5"]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3}
    ]
    edits = spec["containerEdits"]
    # The same value in every claim's spec: visibility comes from the device nodes above.
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255} in edits[
        "deviceNodes"
    ]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    assert mounts[f"/run/vgpu-dra/claims/{UID}"]["hostPath"] == f"/var/lib/vgpu-dra/claims/{UID}"
    # The claim dir (vgpu.conf) is read-only in the container; only the region file is writable.
    claim_mount = mounts[f"/run/vgpu-dra/claims/{UID}"]
    assert "ro" in claim_mount["options"] and "rw" not in claim_mount["options"]
    region_mount = mounts[f"/run/vgpu-dra/claims/{UID}/region"]
    assert region_mount["hostPath"] == f"/var/lib/vgpu-dra/claims/{UID}/region"
    assert "rw" in region_mount["options"] and "ro" not in region_mount["options"]
    # Runtimes mount in spec order: the region must come after the directory it sits in.
    paths = [m["containerPath"] for m in edits["mounts"]]
    assert paths.index(f"/run/vgpu-dra/claims/{UID}") < paths.index(
        f"/run/vgpu-dra/claims/{UID}/region"
    )
    assert all("nosuid" in m["options"] and "nodev" in m["options"] for m in edits["mounts"])
    assert mounts["/usr/local/vgpu-dra/lib/libvgpu.so"]["hostPath"] == "/opt/vgpu/libvgpu.so"
    assert "ro" in mounts["/usr/local/vgpu-dra/lib/libvgpu.so"]["options"]
    assert mounts["/etc/ld.so.preload"]["hostPath"] == "/var/lib/vgpu-dra/hook/ld.so.preload"
    assert edits["additionalGids"] == [2000]


def test_gid_zero_is_not_added_and_version_is_lower() -> None:
    spec = cdi.build_claim_spec(settings=settings(gid=0), claim_uid=UID, devices=[])
    assert "additionalGids" not in spec["containerEdits"]
    assert spec["cdiVersion"] == "0.5.0"


def test_extra_env_is_appended_sorted() -> None:
    spec = cdi.build_claim_spec(
        settings=settings(),
        claim_uid=UID,
        devices=[],
        extra_env={"VGPU_LOG_LEVEL": "debug", "A": "1"},
    )
    assert spec["containerEdits"]["env"][1:] == ["A=1", "VGPU_LOG_LEVEL=debug"]


def test_spec_file_name_round_trip() -> None:
    name = cdi.spec_file_name(KIND, UID)
    assert name == f"k8s.vgpu.dra.dev-claim_{UID}.json"
    assert cdi.claim_uid_of_spec_file(KIND, name) == UID
    assert cdi.claim_uid_of_spec_file(KIND, "nvidia.yaml") is None
    assert cdi.claim_uid_of_spec_file(KIND, "k8s.vgpu.dra.dev-claim_.json") is None
    assert cdi.claim_uid_of_spec_file(KIND, "k8s.vgpu.dra.dev-claim_../x.json") is None
    assert cdi.device_id(KIND, "abc-gpu-0") == "k8s.vgpu.dra.dev/claim=abc-gpu-0"


PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
508 nvidia-uvm
509 nvidia-caps

Block devices:
  8 sd
511 nvidia-uvm
"""


def test_control_nodes_with_uvm() -> None:
    nodes = cdi.control_device_nodes(PROC_DEVICES, exists=lambda path: True)
    assert nodes == (
        cdi.DeviceNode("/dev/nvidiactl", 195, 255),
        cdi.DeviceNode("/dev/nvidia-uvm", 508, 0),
        cdi.DeviceNode("/dev/nvidia-uvm-tools", 508, 1),
    )


def test_control_nodes_only_where_host_has_them() -> None:
    nodes = cdi.control_device_nodes(PROC_DEVICES, exists=lambda p: p.endswith("nvidia-uvm"))
    assert [n.path for n in nodes] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert cdi.control_device_nodes("Character devices:\n  1 mem\n") == (
        cdi.DeviceNode("/dev/nvidiactl", 195, 255),
    )


def test_nvidia_toolkit_ids(tmp_path: Path) -> None:
    static = tmp_path / "etc"
    static.mkdir()
    (static / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        "- name: '0'\n  containerEdits: {}\n- name: GPU-abc\n  containerEdits: {}\n"
        "- name: all\n  containerEdits: {}\n"
    )
    (static / "other.json").write_text(
        json.dumps({"kind": "example.com/x", "devices": [{"name": "0"}]})
    )
    (static / "broken.json").write_text("{not json")
    ids = cdi.nvidia_toolkit_ids([str(static), str(tmp_path / "missing")])
    assert ids == {"0": "nvidia.com/gpu=0", "GPU-abc": "nvidia.com/gpu=GPU-abc"}
