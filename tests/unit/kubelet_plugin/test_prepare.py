"""Preparer: the fixed prepare order, idempotency, per-claim errors, unprepare, start-up
reconciliation and concurrency — against real files in a temp dir and an in-memory claim source
(the API server's role is proven by tests/integration/kubelet_plugin/)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubelet_plugin.checkpoint import CheckpointJournal
from kubelet_plugin.claims import ClaimRef
from kubelet_plugin.plan import device_usage
from kubelet_plugin.prepare import NodeSettings, Preparer
from kubelet_plugin.region import REGION_SIZE
from tests.fixtures.claimdata import (
    NODE,
    GiB,
    claim,
    config_entry,
    inventory,
    result,
    vgpu_config,
)
from tests.fixtures.prepare import KIND, Claims, node_settings


@pytest.fixture
def claims() -> Claims:
    return Claims()


@pytest.fixture
def new_preparer() -> Iterator[Callable[..., Preparer]]:
    """`Preparer(...)` whose worker pool is shut down after the test."""
    made: list[Preparer] = []

    def make(*args: Any, **kwargs: Any) -> Preparer:
        made.append(Preparer(*args, **kwargs))
        return made[-1]

    yield make
    for preparer in made:
        preparer.close()


@pytest.fixture
def preparer(tmp_path: Path, claims: Claims, new_preparer: Callable[..., Preparer]) -> Preparer:
    p = new_preparer(node_settings(tmp_path), inventory(memory=16 * GiB), claims)
    p.reconcile()
    return p


def spec_path(root: Path, uid: str) -> Path:
    return root / "cdi" / f"k8s.vgpu.dra.dev-claim_{uid}.json"


def test_prepare_writes_dir_conf_spec_and_checkpoint(
    tmp_path: Path, claims: Claims, preparer: Preparer
) -> None:
    ref = claims.add(claim([result("gpu-1", memory="4Gi", cores=25, share_id="s1")]))
    outcome = preparer.prepare([ref])[ref.uid]
    assert outcome.error == ""
    [device] = outcome.devices
    assert device.cdi_ids == (f"{KIND}={ref.uid}-gpu-1-s1",)
    assert (device.request_names, device.pool, device.device, device.share_id) == (
        ("gpu",),
        NODE,
        "gpu-1",
        "s1",
    )
    claim_dir = tmp_path / "state" / "claims" / ref.uid
    assert stat.S_IMODE(claim_dir.stat().st_mode) == 0o750  # containers get it read-only
    region = claim_dir / "region"  # the one writable file, created at its layout size
    assert (stat.S_IMODE(region.stat().st_mode), region.stat().st_size) == (0o660, REGION_SIZE)
    conf = claim_dir / "vgpu.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o640
    assert f"memory={4 * GiB} cores=25 policy=fixed oversubscribe=0" in conf.read_text()
    spec = json.loads(spec_path(tmp_path, ref.uid).read_text())
    assert spec["devices"][0]["name"] == f"{ref.uid}-gpu-1-s1"
    assert stat.S_IMODE(spec_path(tmp_path, ref.uid).stat().st_mode) == 0o644
    assert list(CheckpointJournal(str(tmp_path / "state")).load()) == [ref.uid]
    journal = (tmp_path / "state" / "checkpoint.log").read_text().splitlines()
    assert [json.loads(line)["op"] for line in journal] == ["put"]
    assert stat.S_IMODE((tmp_path / "state" / "checkpoint.log").stat().st_mode) == 0o600
    preload = tmp_path / "state" / "hook" / "ld.so.preload"
    assert preload.read_text() == "/usr/local/vgpu-dra/lib/libvgpu.so\n"


def test_retry_returns_same_ids_without_reading_the_claim(
    claims: Claims, preparer: Preparer
) -> None:
    ref = claims.add(claim([result("gpu-0", memory="1Gi")]))
    first = preparer.prepare([ref])[ref.uid]
    reads = claims.reads
    second = preparer.prepare([ref])[ref.uid]
    assert second == first
    assert claims.reads == reads


def test_one_bad_claim_does_not_fail_the_others(claims: Claims, preparer: Preparer) -> None:
    good = claims.add(claim([result("gpu-0", memory="1Gi")], name="good"))
    bad_config = claims.add(
        claim(
            [result("gpu-1", memory="1Gi")],
            name="bad-config",
            configs=[config_entry(vgpu_config(computePolicy="turbo"))],
        )
    )
    wrong_node = claims.add(claim([result("gpu-2", pool="node-9")], name="wrong-node"))
    missing = ClaimRef("default", "gone", "0000")
    outcomes = preparer.prepare([good, bad_config, wrong_node, missing])
    assert outcomes[good.uid].error == ""
    assert "'computePolicy' has invalid value 'turbo'" in outcomes[bad_config.uid].error
    assert "pool 'node-9'" in outcomes[wrong_node.uid].error
    assert "not found" in outcomes[missing.uid].error
    assert set(preparer.prepared()) == {good.uid}


def test_overbooked_claim_is_refused_and_leaves_no_files(
    tmp_path: Path, claims: Claims, preparer: Preparer
) -> None:
    first = claims.add(claim([result("gpu-0", memory="12Gi")], name="first"))
    second = claims.add(claim([result("gpu-0", memory="8Gi")], name="second"))
    assert preparer.prepare([first])[first.uid].error == ""
    error = preparer.prepare([second])[second.uid].error
    assert "would overbook device gpu-0" in error
    assert not spec_path(tmp_path, second.uid).exists()
    assert not (tmp_path / "state" / "claims" / second.uid).exists()
    # once the first is gone the second fits
    assert preparer.unprepare([first]) == {first.uid: ""}
    assert preparer.prepare([second])[second.uid].error == ""


def test_concurrent_claims_cannot_jointly_overbook(claims: Claims, preparer: Preparer) -> None:
    claims.delay_s = 0.01  # make the reads overlap
    refs = [claims.add(claim([result("gpu-3", memory="4Gi")], name=f"c{i}")) for i in range(10)]
    outcomes = preparer.prepare(refs)
    succeeded = [uid for uid, o in outcomes.items() if not o.error]
    assert len(succeeded) == 4  # 16 GiB / 4 GiB
    assert all("overbook" in o.error for o in outcomes.values() if o.error)


def test_the_guards_running_total_matches_the_prepared_claims(
    tmp_path: Path, claims: Claims, preparer: Preparer, new_preparer: Callable[..., Preparer]
) -> None:
    """The guard keeps per-device totals as claims come and go (issue 32: a batch checks in
    O(n)); after successes, refusals, a failed write, unprepares and a restart they equal the
    sum over the prepared claims."""

    def consistent(p: Preparer) -> bool:
        return p._usage == device_usage(p.prepared().values())

    refs = [
        claims.add(claim([result(f"gpu-{i % 2}", memory="5Gi", cores=20)], name=f"c{i}"))
        for i in range(8)
    ]
    admin = claims.add(claim([{**result("gpu-0"), "adminAccess": True}], name="monitor"))
    outcomes = preparer.prepare([*refs, admin])
    assert sum(1 for o in outcomes.values() if not o.error) == 7  # 3 per GPU, and the monitor
    assert consistent(preparer)
    shutil.rmtree(tmp_path / "cdi")  # writes fail: reserved, then released
    failing = claims.add(claim([result("gpu-2", memory="1Gi")], name="failing"))
    assert preparer.prepare([failing])[failing.uid].error
    (tmp_path / "cdi").mkdir()
    assert consistent(preparer)
    assert preparer.unprepare(refs[:3]) == {r.uid: "" for r in refs[:3]}
    assert consistent(preparer)
    restarted = new_preparer(node_settings(tmp_path), inventory(memory=16 * GiB), claims)
    assert consistent(restarted) and restarted._usage == preparer._usage


def test_unprepare_removes_everything_and_is_idempotent(
    tmp_path: Path, claims: Claims, preparer: Preparer
) -> None:
    ref = claims.add(claim([result("gpu-0", memory="1Gi")]))
    preparer.prepare([ref])
    assert preparer.unprepare([ref]) == {ref.uid: ""}
    assert not spec_path(tmp_path, ref.uid).exists()
    assert not (tmp_path / "state" / "claims" / ref.uid).exists()
    assert CheckpointJournal(str(tmp_path / "state")).load() == {}
    assert preparer.unprepare([ref, ClaimRef("x", "y", "never-seen")]) == {
        ref.uid: "",
        "never-seen": "",
    }


def test_restart_reconciles_files_with_checkpoint(
    tmp_path: Path, claims: Claims, new_preparer: Callable[..., Preparer]
) -> None:
    first = new_preparer(node_settings(tmp_path), inventory(), claims)
    first.reconcile()
    kept = claims.add(claim([result("gpu-0", memory="1Gi")], name="kept"))
    damaged = claims.add(claim([result("gpu-1", memory="1Gi")], name="damaged"))
    first.prepare([kept, damaged])
    first.close()
    # A crash after writing files but before the checkpoint leaves orphans...
    orphan = "99999999-0000-0000-0000-000000000000"
    spec_path(tmp_path, orphan).write_text("{}")
    (tmp_path / "state" / "claims" / orphan).mkdir()
    # ...and someone deleted a prepared claim's spec and conf.
    spec_path(tmp_path, damaged.uid).unlink()
    (tmp_path / "state" / "claims" / damaged.uid / "vgpu.conf").unlink()
    foreign = tmp_path / "cdi" / "nvidia.yaml"
    foreign.write_text("kind: nvidia.com/gpu\n")

    second = new_preparer(node_settings(tmp_path), inventory(), claims)
    report = second.reconcile()
    assert report.removed_specs == [orphan]
    assert report.removed_claim_dirs == [orphan]
    assert report.rewritten == [damaged.uid]
    assert spec_path(tmp_path, damaged.uid).exists()
    assert (tmp_path / "state" / "claims" / damaged.uid / "vgpu.conf").exists()
    assert foreign.exists()
    # and the restarted plugin still answers retries with the recorded IDs, without the API
    reads = claims.reads
    assert second.prepare([kept])[kept.uid].devices[0].cdi_ids == (f"{KIND}={kept.uid}-gpu-0",)
    assert claims.reads == reads
    assert second.reconcile().rewritten == []


def test_claims_prepared_before_a_reboot_are_prepared_again_from_the_api(
    tmp_path: Path, claims: Claims, new_preparer: Callable[..., Preparer]
) -> None:
    first = new_preparer(node_settings(tmp_path), inventory(), claims)
    first.reconcile(boot_id="boot-1")
    ref = claims.add(claim([result("gpu-0", memory="1Gi")], name="before"))
    first.prepare([ref])
    first.close()
    assert (tmp_path / "state" / "boot-id").read_text() == "boot-1\n"

    # A plugin restart in the same boot trusts the checkpoint: no API read on the retry.
    same_boot = new_preparer(node_settings(tmp_path), inventory(), claims)
    same_boot.reconcile(boot_id="boot-1")
    reads = claims.reads
    same_boot.prepare([ref])
    assert claims.reads == reads
    same_boot.close()

    # After a reboot the claim is forgotten, its files removed, and prepared again from the API.
    rebooted = new_preparer(node_settings(tmp_path), inventory(), claims)
    report = rebooted.reconcile(boot_id="boot-2")
    assert rebooted.prepared() == {}
    assert report.removed_specs == [ref.uid]
    assert not (tmp_path / "state" / "claims" / ref.uid).exists()
    assert (tmp_path / "state" / "boot-id").read_text() == "boot-2\n"
    reads = claims.reads
    assert rebooted.prepare([ref])[ref.uid].error == ""
    assert claims.reads == reads + 1
    assert spec_path(tmp_path, ref.uid).exists()
    rebooted.close()
    # what the reboot forgot stays forgotten in the checkpoint, and the new claim is recorded
    again = new_preparer(node_settings(tmp_path), inventory(), claims)
    again.reconcile(boot_id="boot-2")
    assert list(again.prepared()) == [ref.uid]


def test_256_claims_in_one_call(
    tmp_path: Path, claims: Claims, new_preparer: Callable[..., Preparer]
) -> None:
    preparer = new_preparer(node_settings(tmp_path), inventory(count=8, memory=80 * GiB), claims)
    preparer.reconcile()
    refs = [
        claims.add(claim([result(f"gpu-{i % 8}", memory="256Mi", cores=3)], name=f"c{i}"))
        for i in range(256)
    ]
    outcomes = preparer.prepare(refs)
    assert [uid for uid, o in outcomes.items() if o.error] == []
    assert len(CheckpointJournal(str(tmp_path / "state")).load()) == 256
    assert len(list((tmp_path / "cdi").iterdir())) == 256
    assert preparer.unprepare(refs) == {ref.uid: "" for ref in refs}
    assert list((tmp_path / "cdi").iterdir()) == []


def test_same_claim_twice_at_once_is_prepared_once(claims: Claims, preparer: Preparer) -> None:
    claims.delay_s = 0.05
    ref = claims.add(claim([result("gpu-0", memory="1Gi")]))
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(preparer.prepare([ref])[ref.uid]))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert claims.reads == 1
    assert len({r.devices for r in results}) == 1
    assert all(not r.error for r in results)


def test_failed_write_rolls_back(tmp_path: Path, claims: Claims, preparer: Preparer) -> None:
    ref = claims.add(claim([result("gpu-0", memory="16Gi")]))
    shutil.rmtree(tmp_path / "cdi")  # the spec write fails after the claim dir was made
    outcome = preparer.prepare([ref])[ref.uid]
    assert f"cannot write {tmp_path / 'cdi'}/" in outcome.error  # names the file
    assert "No such file or directory" in outcome.error
    assert preparer.prepared() == {}
    assert not (tmp_path / "state" / "claims" / ref.uid).exists()
    (tmp_path / "cdi").mkdir()
    assert preparer.prepare([ref])[ref.uid].error == ""  # the reservation was released too


def test_retry_restores_files_removed_while_running(
    tmp_path: Path, claims: Claims, preparer: Preparer
) -> None:
    ref = claims.add(claim([result("gpu-0", memory="1Gi")]))
    first = preparer.prepare([ref])[ref.uid]
    spec_path(tmp_path, ref.uid).unlink()
    shutil.rmtree(tmp_path / "state" / "claims" / ref.uid)
    assert preparer.prepare([ref])[ref.uid] == first
    assert spec_path(tmp_path, ref.uid).exists()
    assert (tmp_path / "state" / "claims" / ref.uid / "vgpu.conf").exists()


def test_hostile_uids_never_reach_the_filesystem(
    tmp_path: Path, claims: Claims, preparer: Preparer
) -> None:
    victim = tmp_path / "state" / "keep"
    victim.mkdir()
    for uid in ("../keep", "..", "", "a/b", "x" * 200):
        ref = ClaimRef("default", "c", uid)
        assert "invalid UID" in preparer.unprepare([ref])[uid]
        assert "invalid UID" in preparer.prepare([ref])[uid].error
    assert victim.exists()
    assert (tmp_path / "state" / "claims").exists()
    assert claims.reads == 0


def test_hostile_uid_is_truncated_in_errors_and_logs(
    claims: Claims, preparer: Preparer, caplog: pytest.LogCaptureFixture
) -> None:
    uid = "A" * 100_000
    ref = ClaimRef("n" * 5000, "c" * 5000, uid)
    error = preparer.prepare([ref])[uid].error
    assert "invalid UID" in error and "(100000 chars)" in error
    assert len(error) < 500
    assert preparer.unprepare([ref])[uid].count("A") < 100
    assert "A" * 100 not in caplog.text and "n" * 100 not in caplog.text


def test_nvidia_toolkit_ids_are_returned_with_ours(
    tmp_path: Path, claims: Claims, new_preparer: Callable[..., Preparer]
) -> None:
    toolkit = tmp_path / "etc-cdi"
    toolkit.mkdir()
    inv = inventory(memory=16 * GiB)
    (toolkit / "nvidia.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": [
                    {"name": "0", "containerEdits": {}},
                    {"name": inv.gpus[1].uuid, "containerEdits": {}},
                    {"name": "all", "containerEdits": {}},
                ],
            }
        )
    )
    settings = node_settings(tmp_path)
    settings = NodeSettings(
        driver=settings.driver,
        node_name=settings.node_name,
        cdi_root=settings.cdi_root,
        spec=settings.spec,
        toolkit_spec_dirs=(str(toolkit),),
    )
    preparer = new_preparer(settings, inv, claims)
    preparer.reconcile()
    ref = claims.add(
        claim(
            [
                result("gpu-0", request="a"),
                result("gpu-1", request="b"),
                result("gpu-2", request="c"),
            ]
        )
    )
    devices = preparer.prepare([ref])[ref.uid].devices
    assert [d.cdi_ids[1:] for d in devices] == [
        ("nvidia.com/gpu=0",),
        (f"nvidia.com/gpu={inv.gpus[1].uuid}",),
        (),
    ]


def test_subrequest_results_report_the_parent_request(claims: Claims, preparer: Preparer) -> None:
    ref = claims.add(claim([result("gpu-0", request="gpu/small", memory="1Gi")]))
    [device] = preparer.prepare([ref])[ref.uid].devices
    assert device.request_names == ("gpu",)


def test_prepare_and_unprepare_sync_only_the_journal_once_each(
    monkeypatch: pytest.MonkeyPatch, claims: Claims, preparer: Preparer
) -> None:
    # The claim's files are rebuilt from the checkpoint after a power loss (next test), so the
    # latency-critical path syncs only the checkpoint journal: one append each way, 2 per cycle.
    synced: list[str] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def counting(fd: int, real: Any = real) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        monkeypatch.setattr(os, name, counting)
    ref = claims.add(claim([result("gpu-0", memory="1Gi")]))
    assert preparer.prepare([ref])[ref.uid].error == ""
    assert preparer.unprepare([ref])[ref.uid] == ""
    assert [Path(p).name for p in synced] == ["checkpoint.log", "checkpoint.log"], synced


def test_power_loss_emptied_files_are_rewritten_at_start(
    tmp_path: Path, claims: Claims, new_preparer: Callable[..., Preparer]
) -> None:
    # Unsynced data may be lost while its rename survives: files come back empty.
    first = new_preparer(node_settings(tmp_path), inventory(), claims)
    first.reconcile()
    ref = claims.add(claim([result("gpu-2", memory="2Gi", cores=20)]))
    first.prepare([ref])
    first.close()
    conf = tmp_path / "state" / "claims" / ref.uid / "vgpu.conf"
    written = (conf.read_bytes(), spec_path(tmp_path, ref.uid).read_bytes())
    conf.write_bytes(b"")
    spec_path(tmp_path, ref.uid).write_bytes(b"")

    second = new_preparer(node_settings(tmp_path), inventory(), claims)
    assert second.reconcile().rewritten == [ref.uid]
    assert (conf.read_bytes(), spec_path(tmp_path, ref.uid).read_bytes()) == written
    second.close()
