"""Pure parts of real bed nodes: OCI archives, node configuration files, the toolkit-like spec."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cdi import NVIDIA_TOOLKIT_KIND, nvidia_toolkit_ids
from vgpu_testbed.fakegpu import simulator as fakegpu
from vgpu_testbed.realnode.config import NodeLayout, cni_config, containerd_config, kubelet_config
from vgpu_testbed.realnode.oci import ImageSpec, write_archive
from vgpu_testbed.realnode.toolkit_cdi import SPEC_FILE, toolkit_spec


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_archive_is_a_consistent_oci_layout(tmp_path: Path) -> None:
    program = tmp_path / "prog"
    program.write_bytes(b"#!/bin/sh\necho hi\n")
    program.chmod(0o775)
    spec = ImageSpec(
        "vgpu-dra.local/t:1",
        files={"usr/bin/prog": program},
        symlinks={"bin": "usr/bin"},
        entrypoint=("/usr/bin/prog",),
    )
    digest = write_archive(spec, tmp_path / "a.tar")
    files = _members(tmp_path / "a.tar")
    # Every blob is stored under its own digest.
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    entry = index["manifests"][0]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "vgpu-dra.local/t:1"
    manifest = json.loads(files[f"blobs/sha256/{digest[7:]}"])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"][7:]])
    layer_digest = manifest["layers"][0]["digest"]
    assert config["rootfs"]["diff_ids"] == [layer_digest]  # uncompressed: diff id = digest
    assert config["config"]["Entrypoint"] == ["/usr/bin/prog"]
    with tarfile.open(fileobj=io.BytesIO(files["blobs/sha256/" + layer_digest[7:]])) as layer:
        members = {m.name: m for m in layer.getmembers()}
    assert members["usr/bin/prog"].mode == 0o755  # group write dropped
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    assert members["usr"].isdir()
    # Same tree, same bytes.
    assert write_archive(spec, tmp_path / "b.tar") == digest
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


def test_containerd_config_keeps_everything_in_the_node_dir(tmp_path: Path) -> None:
    layout = NodeLayout(tmp_path / "nodes" / "node-1")
    conf = tomllib.loads(containerd_config(layout, Path("/usr/sbin/runc")))
    assert conf["version"] == 3
    for key in ("root", "state"):
        assert conf[key].startswith(str(layout.root))
    assert conf["grpc"]["address"] == str(layout.containerd_socket)
    plugins = conf["plugins"]
    assert plugins["io.containerd.nri.v1.nri"]["disable"] is True
    assert plugins["io.containerd.internal.v1.opt"]["path"].startswith(str(layout.root))
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == [str(layout.cdi_dir)]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["cni"]["conf_dir"] == str(layout.cni_conf_dir)
    images = plugins["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "vgpu-dra.local/pause:bed"


def test_kubelet_and_cni_config(tmp_path: Path) -> None:
    layout = NodeLayout(tmp_path / "n")
    kubelet = yaml.safe_load(
        kubelet_config(layout, cgroup_root="/b/n", ip="10.250.0.2", client_ca=tmp_path / "ca")
    )
    assert kubelet["failCgroupV1"] is False and kubelet["failSwapOn"] is False
    assert kubelet["cgroupDriver"] == "cgroupfs" and kubelet["cgroupRoot"] == "/b/n"
    assert kubelet["podLogsDir"].startswith(str(layout.root))
    assert kubelet["volumePluginDir"].startswith(str(layout.root))
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    assert kubelet["readOnlyPort"] == 0
    cni = json.loads(cni_config(layout, 3))
    ipam = cni["plugins"][0]["ipam"]
    assert ipam["ranges"][0][0]["subnet"] == "10.251.3.0/24"
    assert ipam["dataDir"] == str(layout.cni_ipam_dir)


def test_toolkit_spec_is_found_by_the_plugin(tmp_path: Path) -> None:
    """The plugin's own lookup (dra_driver.cdi) finds every GPU by index and UUID."""
    gpus = fakegpu.load_profile("a10-pcie").gpus
    spec = toolkit_spec(
        gpus, library_dir=Path("/lib/sim"), state_file=tmp_path / "s", profile_file=tmp_path / "p"
    )
    (tmp_path / SPEC_FILE).write_text(json.dumps(spec))
    ids = nvidia_toolkit_ids([str(tmp_path)])
    for index, gpu in enumerate(gpus):
        assert ids[str(index)] == f"{NVIDIA_TOOLKIT_KIND}={index}"
        assert ids[gpu.uuid] == f"{NVIDIA_TOOLKIT_KIND}={gpu.uuid}"
    edits = spec["containerEdits"]
    targets = {m["containerPath"] for m in edits["mounts"]}
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in targets
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in targets
    assert f"{fakegpu.ENV_STATE}=/run/vgpu-sim/gpus.state" in edits["env"]


def test_runtime_choice_says_why_real_nodes_are_not_possible(monkeypatch: Any) -> None:
    from vgpu_testbed.cluster import cli as cluster_cli
    from vgpu_testbed.realnode import host

    said: list[str] = []
    monkeypatch.setattr(host, "check_host", lambda: ["not root (real nodes need namespaces)"])
    assert cluster_cli.choose_runtime("auto", said.append) == "standin"
    assert said and "not root" in said[0] and "stand-in" in said[0]
    assert cluster_cli.choose_runtime("standin", said.append) == "standin"
    with pytest.raises(RuntimeError, match="--runtime real is not possible on this host: not root"):
        cluster_cli.choose_runtime("real", said.append)
    monkeypatch.setattr(host, "check_host", lambda: [])
    assert cluster_cli.choose_runtime("auto", said.append) == "real"


def test_egress_relay_only_reaches_bed_node_addresses() -> None:
    from vgpu_testbed.realnode.egress import allowed, render_config

    assert allowed("10.250.0.2:10250") == ("10.250.0.2", 10250)
    for target in ("127.0.0.1:2379", "node-1:10250", "10.250.1.2:10250", "10.250.0.2:0", "x"):
        assert allowed(target) is None, target
    conf = yaml.safe_load(render_config(Path("/c/nodes/egress.sock")))
    selection = conf["egressSelections"][0]
    assert selection["name"] == "cluster"
    assert selection["connection"]["transport"]["uds"]["udsName"] == "/c/nodes/egress.sock"
