"""Claiming and clearing a cluster directory; finding the binaries; reading health answers.

What this proves:
1. A directory with foreign files is refused (and left intact); a directory with a live cluster
   is refused naming its processes; a dead cluster's files are cleared and the directory reused.
2. Teardown removes only what the bed created; other files (and so the directory) survive.
3. The binary directory follows VGPU_DRA_K8S_BIN, then VGPU_DRA_CACHE, then ~/.cache, keyed by
   the version pinned in hack/testbed/versions.env.
4. Health answers: 200 "ok" and etcd's {"health":"true"} are healthy; anything else is not.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from vgpu_testbed import procs
from vgpu_testbed.cluster import binaries as cluster_binaries
from vgpu_testbed.cluster import directory as cluster_dir
from vgpu_testbed.cluster import state as cluster_state
from vgpu_testbed.cluster.flags import Layout
from vgpu_testbed.cluster.status import health_url, healthy_answer


def test_foreign_files_are_refused_and_kept(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(cluster_dir.ClusterBusyError, match=r"thesis\.tex"):
        cluster_dir.prepare_dir(Layout(tmp_path))
    assert (tmp_path / "thesis.tex").read_text() == "precious"


def test_live_cluster_is_refused(tmp_path: Path) -> None:
    record, popen = procs.spawn("etcd", ["sleep", "60"], log_path=tmp_path / "x.log")
    root = tmp_path / "c"
    root.mkdir()
    try:
        state = cluster_state.ClusterState(k8s_version="v1.37.1", root=str(root))
        state.processes.append(record)
        cluster_state.save(state, root / "state.json")
        with pytest.raises(cluster_dir.ClusterBusyError, match=f"etcd \\(pid {record.pid}\\)"):
            cluster_dir.prepare_dir(Layout(root))
        assert (root / "state.json").exists()
    finally:
        procs.stop_all([record], popens={record.pid: popen})
    # Now dead: the stale state is cleared and the directory handed out again, private.
    (root / "logs").mkdir()
    (root / "logs" / "etcd.log").write_text("old")
    cluster_dir.prepare_dir(Layout(root))
    assert list(root.iterdir()) == []
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_remove_owned_keeps_foreign_files(tmp_path: Path) -> None:
    for entry in ("pki", "etcd", "nodes", "logs"):
        (tmp_path / entry).mkdir()
        (tmp_path / entry / "f").write_text("x")
    (tmp_path / "kubeconfig").write_text("x")
    (tmp_path / "state.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    cluster_dir.remove_owned(Layout(tmp_path), keep_logs=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "notes.txt"]
    cluster_dir.remove_owned(Layout(tmp_path), keep_logs=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_remove_owned_removes_the_emptied_directory(tmp_path: Path) -> None:
    root = tmp_path / "c"
    (root / "pki").mkdir(parents=True)
    cluster_dir.remove_owned(Layout(root), keep_logs=False)
    assert not root.exists()


def test_bin_dir_resolution(tmp_path: Path) -> None:
    version = cluster_binaries.k8s_version()
    assert version == cluster_binaries.pinned_versions()["K8S_VERSION"]
    assert version.startswith("v1.37.")
    assert cluster_binaries.default_bin_dir({"VGPU_DRA_K8S_BIN": "/opt/k"}) == Path("/opt/k")
    assert cluster_binaries.default_bin_dir({"VGPU_DRA_CACHE": "/c"}) == Path(
        f"/c/k8s/{version}/bin"
    )
    home = cluster_binaries.default_bin_dir({})
    assert home == Path.home() / ".cache" / "vgpu-dra" / "k8s" / version / "bin"


def test_find_binaries_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "etcd").write_text("")
    with pytest.raises(cluster_binaries.BinariesMissingError) as err:
        cluster_binaries.find_binaries(tmp_path)
    message = str(err.value)
    assert "kube-apiserver" in message and "make controlplane" in message
    assert "etcd," not in message
    for name in cluster_binaries.BINARIES:
        (tmp_path / name).write_text("")
    assert set(cluster_binaries.find_binaries(tmp_path)) == set(cluster_binaries.BINARIES)


def test_health_answers() -> None:
    assert healthy_answer(200, "ok")
    assert healthy_answer(200, '{"health":"true","reason":""}')
    assert not healthy_answer(200, '{"health":"false"}')
    assert not healthy_answer(500, "ok")
    assert not healthy_answer(0, "connection refused")
    rec = procs.ProcessRecord(name="etcd", pid=1, start_ticks=0, argv=[], log_path="", port=5)
    assert health_url(rec, "https://x") == "http://127.0.0.1:5/health"
    assert health_url(rec.model_copy(update={"name": "plugin"}), "https://x") is None
    api = rec.model_copy(update={"name": "kube-apiserver"})
    assert health_url(api, "https://127.0.0.1:9") == "https://127.0.0.1:9/readyz"
